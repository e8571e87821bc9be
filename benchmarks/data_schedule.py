"""The data schedule's cost per micro-batch: one permutation per epoch (now) against one per micro-batch (before).

    .venv/bin/python benchmarks/data_schedule.py                      # n = 100k and 1M examples
    .venv/bin/python benchmarks/data_schedule.py --sizes 20000 --rounds 5

Both sides walk the same micro-batches of one epoch prefix (``--batches`` of them, batch 8) and
give the same indices (checked). "before" is the previous ``DataSchedule.indices``: it drew the
epoch's permutation of all n examples on every call. Rounds alternate the sides; the ratio is
per round (same background load), reported as median and range, with the load average.
Prints ``RESULT {json}`` last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training_assets.trainers.loop import DataSchedule  # noqa: E402


def before(n: int, batch: int, seed: int, positions: range) -> list[list[int]]:
    out = []
    per_epoch = -(-n // batch)
    for position in positions:
        epoch, g = divmod(position, per_epoch)
        order = np.random.default_rng([seed, epoch]).permutation(n)
        out.append([int(i) for i in order[g * batch:(g + 1) * batch]])
    return out


def now(n: int, batch: int, seed: int, positions: range) -> list[list[int]]:
    schedule = DataSchedule(n, batch, seed)  # a fresh schedule: its first call draws the permutation
    return [schedule.indices(p) for p in positions]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--batches", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    results = {}
    for n in args.sizes:
        positions = range(args.batches)
        assert before(n, 8, 0, positions) == now(n, 8, 0, positions)
        ratios, t_before, t_now = [], [], []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            before(n, 8, 0, positions)
            t1 = time.perf_counter()
            now(n, 8, 0, positions)
            t2 = time.perf_counter()
            t_before.append((t1 - t0) / args.batches)
            t_now.append((t2 - t1) / args.batches)
            ratios.append(t_before[-1] / t_now[-1])
        results[n] = {"before_us_per_batch": round(statistics.median(t_before) * 1e6, 1),
                      "now_us_per_batch": round(statistics.median(t_now) * 1e6, 1),
                      "speedup_median": round(statistics.median(ratios), 1),
                      "speedup_range": [round(min(ratios), 1), round(max(ratios), 1)]}
        print(f"n={n}: before {results[n]['before_us_per_batch']} µs/micro-batch, now {results[n]['now_us_per_batch']} "
              f"µs (first-call permutation included), speedup {results[n]['speedup_median']}× {results[n]['speedup_range']}")
    print("RESULT " + json.dumps({"batches": args.batches, "rounds": args.rounds, "load_avg": os.getloadavg()[0],
                                  "sizes": results}))


if __name__ == "__main__":
    main()
