"""The sample generator gives every later stage real work, and the same bytes every time."""

import json
import os
from collections import defaultdict

from training_assets import sample_traces
from training_assets.traces import read_batch


def test_same_seed_same_bytes(tmp_path):
    a = sample_traces.write_samples(tmp_path / "a")
    b = sample_traces.write_samples(tmp_path / "b")
    for pa, pb in zip(a["batches"] + a["held_out"], b["batches"] + b["held_out"], strict=True):
        assert open(pa, "rb").read() == open(pb, "rb").read()


def test_batches_hold_attempts_successes_failures_junk_and_contamination(tmp_path):
    written = sample_traces.write_samples(tmp_path)
    results = [read_batch(p) for p in written["batches"]]
    traces = [t for r in results for t in r.valid]
    by_task = defaultdict(list)
    for t in traces:
        by_task[t.task_id].append(t)
    attempts = sorted(len(v) for v in by_task.values())
    assert attempts[len(attempts) // 2] >= 4  # several attempts per task (median)
    assert any(any(t.outcome.success for t in v) and not all(t.outcome.success for t in v) for v in by_task.values())
    failure_points = {t.outcome.failure_point for t in traces if not t.outcome.success}
    assert len(failure_points) >= 2  # failures at different steps
    assert {t.metadata.model_extra["family"] for t in traces} == {"arithmetic", "units", "lists"}
    assert sum(len(r.quarantined) for r in results) >= 7  # junk of several kinds
    assert any(t.trace_id.endswith("-relog") for t in traces)  # near-duplicates
    held = [json.loads(x) for x in open(written["held_out"][0])]
    prompts = {t.prompt for t in traces}
    assert sum(h["prompt"] in prompts for h in held) == 2  # planted contamination


def test_writing_the_samples_again_leaves_the_batches_untouched_so_no_new_batch_appears(tmp_path):
    from training_assets import inbox

    first = sample_traces.write_samples(tmp_path)
    keys = [b.batch_id for b in inbox.scan_inbox(root=tmp_path).new]
    stats = [os.stat(p).st_mtime_ns for p in first["batches"]]
    os.utime(first["batches"][0], ns=(1, 1))  # make a rewrite detectable
    sample_traces.write_samples(tmp_path)
    assert os.stat(first["batches"][0]).st_mtime_ns == 1 and os.stat(first["batches"][1]).st_mtime_ns == stats[1]
    os.utime(first["batches"][0], ns=(stats[0], stats[0]))
    assert [b.batch_id for b in inbox.scan_inbox(root=tmp_path).new] == keys
