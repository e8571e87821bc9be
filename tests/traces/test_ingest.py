"""The partition store: staging, unsafe names, atomic partition writes, determinism."""

import pyarrow.parquet as pq
import pytest

from training_assets import ingest, paths, sample_traces
from training_assets.traces import BatchError


@pytest.fixture
def inbox(data_root):
    box = paths.inbox_dir(data_root)
    box.mkdir(parents=True)
    return box


def test_new_batch_is_staged_under_name_plus_content_hash(data_root, inbox):
    (inbox / "b1.jsonl").write_bytes(b'{"x": 1}\n')
    scan = ingest.scan_inbox(root=data_root)
    assert len(scan.new) == 1
    staged = scan.new[0]
    assert staged.batch_id.startswith("b1-") and len(staged.batch_id) == len("b1-") + 12
    assert staged.path.read_bytes() == b'{"x": 1}\n'
    # a second scan with the cursor and the partition known finds nothing new and hashes nothing
    again = ingest.scan_inbox(scan.fingerprints, [staged.batch_id], root=data_root)
    assert again.new == [] and again.known == [staged.batch_id]


def test_same_name_new_content_is_a_new_batch_not_an_overwrite(data_root, inbox):
    (inbox / "b1.jsonl").write_bytes(b'{"x": 1}\n')
    first = ingest.scan_inbox(root=data_root).new[0]
    (inbox / "b1.jsonl").write_bytes(b'{"x": 2}\n')
    second = ingest.scan_inbox({}, [first.batch_id], root=data_root).new[0]
    assert second.batch_id != first.batch_id
    assert first.path.read_bytes() == b'{"x": 1}\n'  # the old snapshot is untouched
    assert second.path.read_bytes() == b'{"x": 2}\n'


@pytest.mark.parametrize("name", ["evil..jsonl", "bad name.jsonl", "tab\tname.jsonl", "-dash.jsonl", "a..b.jsonl.gz"])
def test_unsafe_names_are_moved_aside_with_a_reason(data_root, inbox, name):
    (inbox / name).write_bytes(b"{}\n")
    scan = ingest.scan_inbox(root=data_root)
    assert scan.new == [] and [n for n, _ in scan.rejected] == [name]
    rejected = paths.rejected_dir(data_root)
    assert (rejected / name).read_bytes() == b"{}\n"  # moved, never deleted
    assert "refused" in (rejected / f"{name}.reason").read_text()
    assert not (inbox / name).exists()


def test_files_still_being_written_are_ignored(data_root, inbox):
    (inbox / ".b1.jsonl.tmp").write_bytes(b"{}\n")
    (inbox / "b2.jsonl.part").write_bytes(b"{}\n")
    assert ingest.scan_inbox(root=data_root).new == []


def test_partition_write_is_deterministic_and_replaces_the_old_one(data_root, tmp_path):
    batches, _ = sample_traces.make_batches(n_batches=1, tasks_per_batch=5, attempts=2)
    src = tmp_path / "b.jsonl"
    src.write_bytes(b"\n".join(batches[0]) + b"\n")
    out = ingest.raw_traces_dir("b-1", data_root)
    first = ingest.write_raw_traces("b-1", src, out)
    bytes_first = (out / ingest.TRACES_FILE).read_bytes()
    (out / "stale-file").write_text("left over")
    second = ingest.write_raw_traces("b-1", src, out)
    assert (out / ingest.TRACES_FILE).read_bytes() == bytes_first
    assert first.data_version == second.data_version
    assert not (out / "stale-file").exists()  # the partition is replaced whole
    assert first.lines == first.valid + first.quarantined
    table = pq.read_table(out / ingest.TRACES_FILE)
    assert table.num_rows == first.valid
    quarantine = (out / ingest.QUARANTINE_FILE).read_text().splitlines()
    assert len(quarantine) == first.quarantined == sum(first.reasons.values())


def test_a_failed_partition_write_leaves_the_previous_version(data_root, tmp_path):
    src = tmp_path / "b.jsonl"
    src.write_bytes(b'{"trace_id": "t"}\n')
    out = ingest.raw_traces_dir("b-1", data_root)
    ingest.write_raw_traces("b-1", src, out)
    before = sorted(p.name for p in out.iterdir())
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(BatchError):
        ingest.write_raw_traces("b-1", broken, out)
    assert sorted(p.name for p in out.iterdir()) == before
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp folder left


def test_load_traces_reads_back_validated_traces(data_root, tmp_path):
    batches, _ = sample_traces.make_batches(n_batches=2, tasks_per_batch=3, attempts=2)
    for i, lines in enumerate(batches):
        src = tmp_path / f"b{i}.jsonl"
        src.write_bytes(b"\n".join(lines))
        ingest.write_raw_traces(f"b-{i}", src, ingest.raw_traces_dir(f"b-{i}", data_root))
    traces = list(ingest.load_traces(root=data_root))
    assert ingest.materialized_batches(data_root) == ["b-0", "b-1"]
    assert len(traces) == ingest.read_traces_table(root=data_root).num_rows > 0
    assert all(t.messages for t in traces)
