"""What a ``trace_batch_sensor`` tick costs with a 2 GB batch in the inbox (target: under 2 s).

    .venv/bin/python benchmarks/ingest_tick.py                 # 2 GiB batch + 200 small ones, 5 rounds
    .venv/bin/python benchmarks/ingest_tick.py --gib 4 --rounds 7

The inbox holds one sparse ``big.jsonl`` of ``--gib`` GiB (``truncate``: the tick never reads
content, so holes and data cost it the same; a sparse file keeps the benchmark from writing
gigabytes to a shared disk) and ``--small`` ordinary batches. Each round runs, back to back:

- ``tick``: one evaluation of the real sensor (``trace_batch_sensor`` through
  ``dg.build_sensor_context`` on an ephemeral instance, no cursor, so every file is new and is
  named: list, ``lstat``, fingerprint, partition lookups);
- ``old``: what the previous tick did first for a new file: ``sha256`` of its bytes
  (``storage.sha256_file``). It also copied the file, so this side is a lower bound of the old
  tick's cost.

Reported: the median and range of each side and of the per-round ratio (old / tick), and the load
average. The last line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGET_S = 2.0


def _inbox(root: Path, gib: float, small: int) -> Path:
    from training_assets import paths, sample_traces

    box = paths.inbox_dir(root)
    box.mkdir(parents=True)
    big = box / "big.jsonl"
    with open(big, "wb") as handle:
        handle.truncate(int(gib * (1 << 30)))
    batches, _ = sample_traces.make_batches(n_batches=1, tasks_per_batch=4, attempts=2)
    payload = b"\n".join(batches[0]) + b"\n"
    for i in range(small):
        (box / f"small-{i:04d}.jsonl").write_bytes(payload)
    return big


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=2.0, help="size of the big batch in GiB")
    parser.add_argument("--small", type=int, default=200, help="ordinary batches beside it")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import dagster as dg

    from training_assets.defs.resources import DataRoot
    from training_assets.defs.traces.sensors import trace_batch_sensor
    from training_assets.storage import sha256_file

    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="ingest-tick-") as tmp, dg.instance_for_test() as instance:
        root = Path(tmp) / "data"
        big = _inbox(root, args.gib, args.small)
        resources = {"data_root": DataRoot(path=str(root))}

        def tick() -> float:
            context = dg.build_sensor_context(instance=instance, cursor=None, resources=resources)
            t0 = time.perf_counter()
            result = trace_batch_sensor(context)
            elapsed = time.perf_counter() - t0
            assert len(result.run_requests) == args.small + 1, result
            return elapsed

        def old() -> float:
            t0 = time.perf_counter()
            sha256_file(big)
            return time.perf_counter() - t0

        tick()  # warm: imports, instance tables
        ticks, olds = [], []
        for _ in range(args.rounds):
            ticks.append(tick())
            olds.append(old())
            print(f"round {len(ticks)}: tick {ticks[-1]:.4f} s, old hash {olds[-1]:.3f} s", flush=True)
        staged = not (root / "batches").exists()
    ratios = [o / t for o, t in zip(olds, ticks, strict=True)]
    summary = {
        "benchmark": "ingest_tick", "big_file_bytes": int(args.gib * (1 << 30)), "small_files": args.small,
        "rounds": args.rounds, "tick_s_median": round(statistics.median(ticks), 4),
        "tick_s_range": [round(min(ticks), 4), round(max(ticks), 4)],
        "old_hash_s_median": round(statistics.median(olds), 3), "old_hash_s_range": [round(min(olds), 3), round(max(olds), 3)],
        "ratio_median": round(statistics.median(ratios), 1), "ratio_range": [round(min(ratios), 1), round(max(ratios), 1)],
        "tick_read_nothing": staged, "target_s": TARGET_S, "met": max(ticks) < TARGET_S,
        "load_avg_start": [round(x, 2) for x in load_start], "load_avg_end": [round(x, 2) for x in os.getloadavg()],
    }
    print("RESULT " + json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
