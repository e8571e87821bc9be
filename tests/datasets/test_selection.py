"""selected_traces: one row per trace, the corpus's decisions taken per stage, staleness caught."""

import gzip
import json
import shutil

import dagster as dg
import pyarrow.parquet as pq
import pytest

from training_assets import data_engine, inbox, ingest, sample_traces
from training_assets.defs.datasets.assets import CURATED_CHECK, selected_traces
from training_assets.defs.resources import DataRoot
from training_assets.training_data import load_selected_traces, load_selection_decisions, selection


@pytest.fixture
def root(sample_root, tmp_path):
    copy = tmp_path / "data"
    shutil.copytree(sample_root, copy)
    return copy


def _corpus_decisions(root):
    return {(d["batch_id"], d["trace_id"]): d
            for d in pq.read_table(root / "curated_corpus" / "decisions.parquet").to_pylist() if d["trace_id"]}


def test_every_trace_of_every_partition_gets_exactly_one_row_following_the_stage_policy(root):
    report = selection.select_traces(root)
    decisions = load_selection_decisions(root).to_pylist()
    raw = ingest.read_traces_table(root=root).to_pylist()
    assert [(d["batch_id"], d["line_no"]) for d in decisions] == [(r["batch_id"], r["line_no"]) for r in raw]
    corpus = _corpus_decisions(root)
    task_of = {d["id"]: d["task_id"] for d in pq.read_table(root / "curated_corpus" / "decisions.parquet").to_pylist()}
    for d in decisions:
        c = corpus[(d["batch_id"], d["trace_id"])]
        assert (d["stage"], d["reason"]) == (c["stage"], c["reason"])
        if c["reason"] == "near_duplicate":
            assert d["kept"] == (task_of[c["duplicate_of"]] == d["task_id"]) and "same task" in d["detail"]
        else:
            assert d["kept"] == c["kept"]  # quality, decontamination, exact repeats: as the corpus decided
    reasons = {(d["reason"], d["kept"]) for d in decisions}
    assert {("held_out_overlap", False), ("exact_duplicate", False), ("near_duplicate", True), ("kept", True)} <= reasons
    kept = load_selected_traces(root)
    assert [r["trace_id"] for r in kept] == [d["trace_id"] for d in decisions if d["kept"]]
    assert report.counts == {"traces": len(raw), "kept": len(kept), "dropped": len(raw) - len(kept), "not_curated": 0}
    assert sum(n["kept"] + n["dropped"] for n in report.by_batch.values()) == len(raw)


def test_the_near_duplicate_policy_is_configurable_and_changes_the_version(root):
    default = selection.select_traces(root)
    dropped = selection.select_traces(root, selection.SelectionConfig(near_duplicates="drop"))
    near = sum(n for r, n in default.by_reason.items() if r.startswith("dedup/near_duplicate"))
    assert near > 0 and dropped.counts["kept"] == default.counts["kept"] - near
    assert dropped.data_version != default.data_version
    again = selection.select_traces(root)
    assert again.data_version == default.data_version  # same inputs and config, same version


def test_a_batch_newer_than_the_corpus_is_not_curated_and_fails_the_blocking_check(root):
    batches, _ = sample_traces.make_batches(n_batches=1, tasks_per_batch=2, attempts=2, seed=11, held_out_tasks=0)
    (root / "inbox" / "late.jsonl").write_bytes(b"\n".join(batches[0]) + b"\n")
    (late,) = inbox.scan_inbox(known_batch_ids=ingest.materialized_batches(root), root=root).new
    ingest.ingest_batch(late.batch_id, root)
    result = dg.materialize([selected_traces], resources={"data_root": DataRoot(path=str(root))}, raise_on_error=False)
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == CURATED_CHECK and not check.passed and late.batch_id in check.description
    rows = [d for d in load_selection_decisions(root).to_pylist() if d["batch_id"] == late.batch_id]
    assert rows and all(not d["kept"] and d["reason"] == "not_curated" and "re-materialise" in d["detail"] for d in rows)
    data_engine.curate(root)
    assert selection.select_traces(root).not_curated == []


def test_a_trace_id_repeated_in_a_later_batch_is_dropped_not_a_curation_error(root):
    first = ingest.materialized_batches(root)[0]
    repeated = next(ingest.load_traces([first], root))
    fresh = {**repeated, "trace_id": "brand-new-trace", "task_id": "brand-new-task"}
    fresh["messages"] = [m if m["role"] != "user" else {**m, "content": "A task nobody asked before, about kites."}
                         for m in fresh["messages"]]
    payload = "".join(json.dumps(t) + "\n" for t in (repeated, fresh)).encode()
    (root / "inbox" / "zz-reexport.jsonl.gz").write_bytes(gzip.compress(payload, mtime=0))
    (batch,) = inbox.scan_inbox(known_batch_ids=ingest.materialized_batches(root), root=root).new
    ingest.ingest_batch(batch.batch_id, root)
    data_engine.curate(root)  # used to raise: "record ids ... occur more than once"
    selection.select_traces(root)
    rows = {d["trace_id"]: d for d in load_selection_decisions(root).to_pylist() if d["batch_id"] == batch.batch_id}
    assert rows[repeated["trace_id"]]["reason"] == "duplicate_trace_id" and not rows[repeated["trace_id"]]["kept"]
    assert first in rows[repeated["trace_id"]]["detail"]
    assert rows["brand-new-trace"]["kept"]
    info = data_engine.lineage(f"{repeated['trace_id']}@{batch.batch_id}", root)
    assert info["stage"] == "input" and info["duplicate_of"] == repeated["trace_id"]


def test_selected_traces_asset_reports_counts_tables_and_a_data_version(root):
    result = dg.materialize([selected_traces], resources={"data_root": DataRoot(path=str(root))})
    assert result.success and all(c.passed for c in result.get_asset_check_evaluations())
    (mat,) = result.asset_materializations_for_node("selected_traces")
    meta = mat.metadata
    assert meta["dagster/row_count"].value == meta["traces"].value == meta["kept"].value + meta["dropped"].value
    assert {c.name for c in meta["by_batch"].value.schema.columns} == {"batch_id", "kept", "dropped"}
    assert mat.tags["dagster/data_version"] == selection.selection_version(root)
