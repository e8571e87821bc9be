"""trace_batch_sensor and raw_traces through Dagster's own test APIs, on ephemeral instances."""

import json
import os

import dagster as dg
import pytest

from training_assets import ingest, paths, sample_traces
from training_assets.defs.partitions import trace_batches
from training_assets.defs.resources import DataRoot
from training_assets.defs.traces.assets import QUARANTINE_CHECK, raw_traces
from training_assets.defs.traces.sensors import trace_batch_sensor


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


def tick(instance, data_root, cursor=None):
    """One sensor tick; applies its partition requests like the daemon (NOTES.md)."""
    context = dg.build_sensor_context(instance=instance, cursor=cursor,
                                      resources={"data_root": DataRoot(path=str(data_root))})
    result = trace_batch_sensor(context)
    if isinstance(result, dg.SensorResult):
        for request in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        return result, result.cursor
    return result, context.cursor


def drop_samples(data_root, n_batches=2):
    batches, _ = sample_traces.make_batches(n_batches=n_batches, tasks_per_batch=4, attempts=3)
    inbox = paths.inbox_dir(data_root)
    inbox.mkdir(parents=True, exist_ok=True)
    for i, lines in enumerate(batches):
        (inbox / f"batch-{i}.jsonl").write_bytes(b"\n".join(lines) + b"\n")


def test_sensor_adds_one_partition_and_one_keyed_run_per_new_batch(instance, data_root):
    drop_samples(data_root)
    result, cursor = tick(instance, data_root)
    keys = instance.get_dynamic_partitions(trace_batches.name)
    assert len(keys) == 2 and all(k.startswith("batch-") for k in keys)
    assert [r.run_key for r in result.run_requests] == [r.partition_key for r in result.run_requests]
    assert sorted(r.run_key for r in result.run_requests) == sorted(keys)
    assert set(json.loads(cursor)) == {"batch-0.jsonl", "batch-1.jsonl"}

    again, cursor2 = tick(instance, data_root, cursor)
    assert isinstance(again, dg.SkipReason) and "no new batches" in again.skip_message

    (paths.inbox_dir(data_root) / "batch-0.jsonl").write_bytes(b'{"changed": true}\n')
    third, _ = tick(instance, data_root, cursor2)
    assert len(third.run_requests) == 1  # same name, new content: a new batch
    assert len(instance.get_dynamic_partitions(trace_batches.name)) == 3
    assert not paths.batches_dir(data_root).exists()  # ticks never read or copy a batch: runs stage them


def test_a_lost_cursor_or_a_crash_between_partitions_and_runs_neither_repeats_nor_loses_a_batch(instance, data_root):
    drop_samples(data_root, n_batches=2)
    first, _ = tick(instance, data_root)
    done, pending = [r.partition_key for r in first.run_requests]
    assert materialize(instance, data_root, done).success
    # the daemon died after adding both partitions but before launching the second run, and the
    # cursor was not saved: the next tick requests a run for the pending batch only
    again, _ = tick(instance, data_root, cursor=None)
    assert [r.partition_key for r in again.run_requests] == [pending]
    assert again.dynamic_partitions_requests[0].partition_keys == []  # already a partition
    assert materialize(instance, data_root, pending).success
    assert isinstance(tick(instance, data_root, cursor=None)[0], dg.SkipReason)


def test_sensor_refuses_unsafe_names(instance, data_root):
    inbox = paths.inbox_dir(data_root)
    inbox.mkdir(parents=True)
    (inbox / "bad name;rm.jsonl").write_bytes(b"{}\n")
    result, _ = tick(instance, data_root)
    assert isinstance(result, dg.SkipReason) and "1 refused" in result.skip_message
    assert (paths.rejected_dir(data_root) / "bad name;rm.jsonl").exists()
    assert instance.get_dynamic_partitions(trace_batches.name) == []


def test_a_linked_reject_folder_leaves_refused_files_in_place_and_the_tick_goes_on(instance, data_root, tmp_path):
    drop_samples(data_root, n_batches=1)
    inbox = paths.inbox_dir(data_root)
    (inbox / "bad name.jsonl").write_bytes(b"{}\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, paths.rejected_dir(data_root))
    result, _ = tick(instance, data_root)
    (request,) = result.run_requests  # the good batch still gets its run
    assert request.partition_key in instance.get_dynamic_partitions(trace_batches.name)
    assert (inbox / "bad name.jsonl").exists() and list(outside.iterdir()) == []


def materialize(instance, data_root, partition, **config):
    return dg.materialize(
        [raw_traces], instance=instance, partition_key=partition,
        resources={"data_root": DataRoot(path=str(data_root))},
        run_config={"ops": {"raw_traces": {"config": config}}} if config else None,
        raise_on_error=False,
    )


def test_materialise_every_partition_like_a_backfill(instance, data_root):
    drop_samples(data_root, n_batches=3)
    tick(instance, data_root)
    keys = trace_batches.get_partition_keys(dynamic_partitions_store=instance)
    for key in keys:  # a backfill over all partitions: one run per partition
        assert materialize(instance, data_root, key).success
    assert instance.get_materialized_partitions(dg.AssetKey("raw_traces")) == set(keys)
    for key in keys:
        event = instance.get_latest_materialization_event(dg.AssetKey("raw_traces"))
        assert event is not None
        report_dir = ingest.raw_traces_dir(key, data_root)
        assert (report_dir / ingest.TRACES_FILE).is_file() and (report_dir / ingest.QUARANTINE_FILE).is_file()
    meta = instance.get_latest_materialization_event(dg.AssetKey("raw_traces")).asset_materialization.metadata
    assert meta["lines"].value == meta["valid"].value + meta["quarantined"].value
    assert "uri" in meta and "quarantined_by_reason" in meta and "preview" in meta


def test_rematerialising_gives_the_same_data_version(instance, data_root):
    drop_samples(data_root, n_batches=1)
    tick(instance, data_root)
    (key,) = instance.get_dynamic_partitions(trace_batches.name)

    def version():
        record = instance.get_latest_data_version_record(dg.AssetKey("raw_traces"), partition_key=key)
        return record.asset_materialization.tags["dagster/data_version"]

    materialize(instance, data_root, key)
    first = version()
    materialize(instance, data_root, key)
    assert version() == first


def test_an_unsafe_partition_key_fails_the_run_with_a_clear_error(instance, data_root):
    instance.add_dynamic_partitions(trace_batches.name, ["x..y"])
    result = materialize(instance, data_root, "x..y")
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert "partition key 'x..y' is not a safe batch id" in failure.event_specific_data.error.cause.message


def test_untrusted_trace_ids_show_as_text_in_the_metadata(instance, data_root):
    evil = "t[click](javascript:alert(1))<img src=x onerror=alert(2)>"
    trace = {"trace_id": evil, "task_id": "t", "messages": [{"role": "user", "content": "hi"},
                                                          {"role": "assistant", "content": "hello"}],
             "outcome": {"success": True}}
    inbox_dir = paths.inbox_dir(data_root)
    inbox_dir.mkdir(parents=True)
    (inbox_dir / "evil.jsonl").write_text(json.dumps(trace) + "\n")
    tick(instance, data_root)
    (key,) = instance.get_dynamic_partitions(trace_batches.name)
    assert materialize(instance, data_root, key).success
    meta = instance.get_latest_materialization_event(dg.AssetKey("raw_traces")).asset_materialization.metadata
    preview = meta["preview"]
    assert isinstance(preview, dg.TableMetadataValue)
    assert preview.records[0].data["trace_id"] == evil  # a table cell: rendered as text by the UI
    assert {c.name: c.type for c in preview.schema.columns}["line_no"] == "int"
    assert meta["dagster/row_count"].value == 1
    from markdown_it import MarkdownIt  # a CommonMark renderer (dagster depends on it through rich)

    from training_assets.defs.metadata import md_table

    renderer = MarkdownIt("commonmark").enable("table")
    renderer.validateLink = lambda url: True  # trust nothing but the escaping: allow every link scheme
    html = renderer.render(md_table([{"trace_id": evil}]).value)
    assert "<a" not in html and "<img" not in html
    assert "t[click](javascript:alert(1))&lt;img src=x onerror=alert(2)&gt;" in html  # the id, shown as text
    unescaped = renderer.render(f"| trace_id |\n|---|\n| {evil} |")
    assert '<a href="javascript:alert(1)">' in unescaped and "<img" in unescaped  # what escaping prevents


def test_quarantine_rate_check_blocks_when_over_threshold(instance, data_root):
    drop_samples(data_root, n_batches=1)
    tick(instance, data_root)
    (key,) = instance.get_dynamic_partitions(trace_batches.name)
    result = materialize(instance, data_root, key, max_quarantine_rate=0.001)
    evaluations = [e.event_specific_data for e in result.all_events
                   if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert [(ev.check_name, ev.passed) for ev in evaluations] == [(QUARANTINE_CHECK, False)]
    assert not result.success  # blocking: the run fails and downstream does not run
