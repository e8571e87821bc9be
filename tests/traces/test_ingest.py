"""The inbox and the partition store: keys from stat alone, staging in the run, refusals, caps,
atomic partition writes, determinism, one partition version."""

import gzip
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pyarrow.parquet as pq
import pytest

from training_assets import inbox, ingest, paths, sample_traces
from training_assets.storage import sha256_file
from training_assets.traces import BatchCaps, BatchError, Trace


@pytest.fixture
def box(data_root):
    folder = paths.inbox_dir(data_root)
    folder.mkdir(parents=True)
    return folder


def _drop(box, name, data, mtime_s=None):
    path = box / name
    path.write_bytes(data)
    if mtime_s is not None:
        os.utime(path, (mtime_s, mtime_s))
    return path


def _sample_bytes(n_tasks=3):
    batches, _ = sample_traces.make_batches(n_batches=1, tasks_per_batch=n_tasks, attempts=2)
    return b"\n".join(batches[0]) + b"\n"


def test_the_tick_names_a_batch_from_stat_alone_and_the_run_stages_it(data_root, box):
    _drop(box, "b1.jsonl", b'{"x": 1}\n')
    scan = inbox.scan_inbox(root=data_root)
    (batch,) = scan.new
    assert batch.batch_id.startswith("b1-") and len(batch.batch_id) == len("b1-") + 12
    assert not paths.batches_dir(data_root).exists()  # the tick read and copied nothing
    again = inbox.scan_inbox(scan.seen, root=data_root)
    assert again.new == [] and again.known == [batch.batch_id]
    staged = inbox.stage_batch(batch.batch_id, data_root)
    assert staged.path.read_bytes() == b'{"x": 1}\n' and staged.sha256 == sha256_file(box / "b1.jsonl")
    assert staged.path.parent == paths.batches_dir(data_root) and staged.duplicate_of is None
    assert inbox.stage_batch(batch.batch_id, data_root) == staged  # idempotent


def test_same_name_new_content_is_a_new_batch_not_an_overwrite(data_root, box):
    _drop(box, "b1.jsonl", b'{"x": 1}\n', mtime_s=1_000)
    first = inbox.scan_inbox(root=data_root).new[0]
    first_staged = inbox.stage_batch(first.batch_id, data_root)
    _drop(box, "b1.jsonl", b'{"x": 2}\n', mtime_s=2_000)  # same size, new mtime
    second = inbox.scan_inbox({"b1.jsonl": first.batch_id}, root=data_root).new[0]
    assert second.batch_id != first.batch_id
    second_staged = inbox.stage_batch(second.batch_id, data_root)
    assert first_staged.path.read_bytes() == b'{"x": 1}\n'  # the old snapshot is untouched
    assert second_staged.path.read_bytes() == b'{"x": 2}\n' and second_staged.duplicate_of is None


def test_a_redropped_identical_file_is_a_duplicate_and_adds_nothing(data_root, box):
    data = _sample_bytes()
    _drop(box, "b1.jsonl", data, mtime_s=1_000)
    first = inbox.scan_inbox(root=data_root).new[0]
    report = ingest.ingest_batch(first.batch_id, data_root)
    assert report.valid > 0 and report.duplicate_of is None
    _drop(box, "b1.jsonl", data, mtime_s=5_000)  # copied in again: same bytes, a new mtime
    again = inbox.scan_inbox({"b1.jsonl": first.batch_id}, root=data_root).new[0]
    duplicate = ingest.ingest_batch(again.batch_id, data_root)
    assert duplicate.duplicate_of == first.batch_id and duplicate.valid == duplicate.lines == 0
    assert ingest.materialized_batches(data_root) == [first.batch_id]  # downstream sees one batch
    assert inbox.read_staged(again.batch_id, data_root).path == inbox.read_staged(first.batch_id, data_root).path
    assert len(list(paths.batches_dir(data_root).glob("*.jsonl"))) == 1  # the bytes are kept once


@pytest.mark.parametrize("name", ["evil..jsonl", "bad name.jsonl", "tab\tname.jsonl", "-dash.jsonl", "a..b.jsonl.gz"])
def test_unsafe_names_are_moved_aside_with_a_reason(data_root, box, name):
    (box / name).write_bytes(b"{}\n")
    scan = inbox.scan_inbox(root=data_root)
    assert scan.new == [] and [n for n, _ in scan.rejected] == [name]
    rejected = paths.rejected_dir(data_root)
    assert (rejected / name).read_bytes() == b"{}\n"  # moved, never deleted
    assert "refused" in (rejected / f"{name}.reason").read_text()
    assert not (box / name).exists()


def test_symlinks_fifos_and_folders_are_refused_without_being_followed_or_opened(data_root, box, tmp_path):
    secret = tmp_path / "outside.jsonl"
    secret.write_bytes(b'{"secret": true}\n')
    os.symlink(secret, box / "link.jsonl")
    os.mkfifo(box / "pipe.jsonl")  # opening it would block the tick forever
    (box / "folder.jsonl").mkdir()
    scan = inbox.scan_inbox(root=data_root)
    assert scan.new == []
    reasons = dict(scan.rejected)
    assert "symbolic link" in reasons["link.jsonl"]
    assert "FIFO" in reasons["pipe.jsonl"] and "directory" in reasons["folder.jsonl"]
    rejected = paths.rejected_dir(data_root)
    assert (rejected / "link.jsonl").is_symlink() and secret.read_bytes() == b'{"secret": true}\n'
    for name in reasons:
        assert not os.path.lexists(box / name)
        assert reasons[name] in (rejected / f"{name}.reason").read_text()


def test_a_reject_folder_that_is_a_link_is_refused_and_nothing_leaves_the_data_root(data_root, box, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, paths.rejected_dir(data_root))  # inbox/_rejected -> a folder outside the data root
    (box / "authorized_keys").write_bytes(b"ssh-ed25519 AAAA\n")
    os.symlink(tmp_path / "elsewhere", box / "link.jsonl")
    scan = inbox.scan_inbox(root=data_root)
    assert list(outside.iterdir()) == []  # nothing moved or written through the link
    assert sorted(n for n, _ in scan.rejected) == ["authorized_keys", "link.jsonl"]
    assert "_rejected is a symbolic link" in scan.reject_error and "remove it" in scan.reject_error
    assert (box / "authorized_keys").read_bytes() == b"ssh-ed25519 AAAA\n" and (box / "link.jsonl").is_symlink()
    with pytest.raises(BatchError, match="symbolic link"):
        inbox.reject_file("authorized_keys", "refused", data_root)
    os.unlink(paths.rejected_dir(data_root))
    paths.rejected_dir(data_root).write_bytes(b"")  # a file where the folder should be
    with pytest.raises(BatchError, match="_rejected is not a folder"):
        inbox.reject_file("authorized_keys", "refused", data_root)


def test_a_planted_reason_link_in_the_reject_folder_is_not_written_through(data_root, box, tmp_path):
    target = tmp_path / "outside.txt"
    target.write_bytes(b"untouched\n")
    rejected = paths.rejected_dir(data_root)
    rejected.mkdir()
    os.symlink(target, rejected / "bad name.jsonl.reason")
    (box / "bad name.jsonl").write_bytes(b"{}\n")
    inbox.scan_inbox(root=data_root)
    assert target.read_bytes() == b"untouched\n"
    assert (rejected / "bad name.jsonl.1").read_bytes() == b"{}\n"  # the next free name, with its own note
    assert "refused" in (rejected / "bad name.jsonl.1.reason").read_text()


def test_two_copies_staged_at_the_same_moment_give_exactly_one_original(data_root, box):
    for trial in range(20):
        data = _sample_bytes() + f'{{"trial": {trial}}}\n'.encode()  # new content: a fresh claim per trial
        names = [f"race{trial}a.jsonl", f"race{trial}b.jsonl"]
        for name in names:
            _drop(box, name, data)
        ids = [b.batch_id for b in inbox.scan_inbox(root=data_root).new if b.name in names]
        start = threading.Barrier(len(ids))

        def stage(batch_id):
            start.wait()
            return inbox.stage_batch(batch_id, data_root)

        with ThreadPoolExecutor(len(ids)) as pool:
            staged = list(pool.map(stage, ids))
        originals = [s for s in staged if s.duplicate_of is None]
        assert len(originals) == 1, f"trial {trial}: {len(originals)} originals"
        (duplicate,) = [s for s in staged if s.duplicate_of is not None]
        assert duplicate.duplicate_of == originals[0].batch_id and duplicate.path == originals[0].path
        assert inbox.read_staged(duplicate.batch_id, data_root) == duplicate
        assert not (paths.batches_dir(data_root) / f"{duplicate.batch_id}.jsonl").exists()  # kept once


def test_files_still_being_written_are_ignored(data_root, box):
    (box / ".b1.jsonl.tmp").write_bytes(b"{}\n")
    (box / "b2.jsonl.part").write_bytes(b"{}\n")
    assert inbox.scan_inbox(root=data_root).new == []


def test_a_file_replaced_after_the_tick_is_refused_by_its_run_and_nothing_is_written(data_root, box, tmp_path):
    path = _drop(box, "b1.jsonl", _sample_bytes(), mtime_s=1_000)
    (batch,) = inbox.scan_inbox(root=data_root).new
    with open(path, "ab") as handle:  # grows after the sensor saw it
        handle.write(b'{"late": 1}\n')
    with pytest.raises(BatchError, match="removed or replaced before its run"):
        ingest.ingest_batch(batch.batch_id, data_root)
    path.unlink()
    os.symlink(tmp_path / "elsewhere.jsonl", path)  # a symlink swapped in under the same name
    with pytest.raises(BatchError, match="drop the file into the inbox again"):
        ingest.ingest_batch(batch.batch_id, data_root)
    assert not ingest.raw_traces_dir(batch.batch_id, data_root).exists()
    assert inbox.read_staged(batch.batch_id, data_root) is None


def test_a_staged_batch_rematerialises_after_the_inbox_file_is_gone(data_root, box):
    path = _drop(box, "b1.jsonl", _sample_bytes())
    (batch,) = inbox.scan_inbox(root=data_root).new
    first = ingest.ingest_batch(batch.batch_id, data_root)
    path.unlink()
    again = ingest.ingest_batch(batch.batch_id, data_root)  # a backfill: reads the immutable snapshot
    assert again.data_version == first.data_version and again.valid == first.valid


def test_gzip_bomb_of_newlines_stops_at_the_byte_cap_and_writes_nothing(data_root, box):
    bomb = gzip.compress(b"\n" * (16 << 20), compresslevel=9)  # 16 MiB of newlines in ~16 KB
    assert len(bomb) < 50_000
    (batch,) = (_drop(box, "bomb.jsonl.gz", bomb), inbox.scan_inbox(root=data_root).new)[1]
    caps = BatchCaps(max_batch_bytes=64 << 10, max_batch_lines=10_000_000)
    with pytest.raises(BatchError, match=r"bomb.*max_batch_bytes=65536.*at line 65537"):
        ingest.ingest_batch(batch.batch_id, data_root, caps)
    out = ingest.raw_traces_dir(batch.batch_id, data_root)
    assert not out.exists() and not [p for p in out.parent.iterdir() if p.name.startswith(".")]


def test_line_cap_and_plain_file_size_cap_name_the_file_and_the_cap(data_root, box, tmp_path):
    lines = tmp_path / "many.jsonl"
    lines.write_bytes(b'{"x": 1}\n' * 11)
    with pytest.raises(BatchError, match=r"many\.jsonl.*max_batch_lines=10"):
        ingest.write_raw_traces("many-1", lines, ingest.raw_traces_dir("many-1", data_root), BatchCaps(max_batch_lines=10))
    with pytest.raises(BatchError, match=r"many\.jsonl: 99 bytes is more than max_batch_bytes=50"):
        ingest.write_raw_traces("many-1", lines, ingest.raw_traces_dir("many-1", data_root), BatchCaps(max_batch_bytes=50))
    assert not ingest.raw_traces_dir("many-1", data_root).exists()
    ok = ingest.write_raw_traces("many-1", lines, ingest.raw_traces_dir("many-1", data_root), BatchCaps(max_batch_lines=11))
    assert ok.lines == 11


@pytest.mark.parametrize("key", ["../etc", "a/b", "..x", ".hidden", "", "x" * 200])
def test_partition_keys_are_revalidated_where_they_become_paths(data_root, key):
    with pytest.raises(BatchError, match="not a safe batch id"):
        ingest.raw_traces_dir(key, data_root)
    with pytest.raises(BatchError, match="not a safe batch id"):
        inbox.stage_batch(key, data_root)


def test_partition_write_is_deterministic_and_replaces_the_old_one(data_root, tmp_path):
    src = tmp_path / "b.jsonl"
    src.write_bytes(_sample_bytes(5))
    out = ingest.raw_traces_dir("b-1", data_root)
    first = ingest.write_raw_traces("b-1", src, out)
    bytes_first = (out / ingest.TRACES_FILE).read_bytes()
    (out / "stale-file").write_text("left over")
    second = ingest.write_raw_traces("b-1", src, out)
    assert (out / ingest.TRACES_FILE).read_bytes() == bytes_first
    assert first.data_version == second.data_version == ingest.partition_version("b-1", data_root)
    assert not (out / "stale-file").exists()  # the partition is replaced whole
    assert first.lines == first.valid + first.quarantined
    table = pq.read_table(out / ingest.TRACES_FILE)
    assert table.num_rows == first.valid and table.schema == ingest.TRACE_SCHEMA
    quarantine = (out / ingest.QUARANTINE_FILE).read_text().splitlines()
    assert len(quarantine) == first.quarantined == sum(first.reasons.values())
    manifest = json.loads((out / ingest.PARTITION_FILE).read_text())
    assert manifest["version"] == first.data_version and manifest["lines"] == first.lines


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


def test_traces_are_stored_as_columns_and_read_back_as_plain_trace_dicts(data_root, tmp_path):
    batches, _ = sample_traces.make_batches(n_batches=2, tasks_per_batch=3, attempts=2)
    for i, lines in enumerate(batches):
        src = tmp_path / f"b{i}.jsonl"
        src.write_bytes(b"\n".join(lines))
        ingest.write_raw_traces(f"b-{i}", src, ingest.raw_traces_dir(f"b-{i}", data_root))
    assert ingest.materialized_batches(data_root) == ["b-0", "b-1"]
    rows = ingest.read_traces_table(root=data_root).to_pylist()
    traces = list(ingest.load_traces(root=data_root))
    assert len(traces) == len(rows) > 0
    originals = {}
    for lines in batches:
        for line in lines:
            try:
                trace = Trace.model_validate_json(line)
            except ValueError:
                continue
            originals.setdefault(trace.trace_id, trace)
    for row, trace in zip(rows, traces, strict=True):
        assert isinstance(trace["messages"], list) and trace["outcome"]["success"] == row["success"]
        # the stored columns hold the validated trace: reading them back gives it unchanged
        assert Trace.model_validate(trace) == originals[trace["trace_id"]]
        assert row["expected_answer"] == trace["metadata"]["expected_answer"] and row["text"].startswith("system:")
