"""A tiny model's forward in a process that has run a Numba kernel: OpenMP nesting off vs on.

    .venv/bin/python benchmarks/omp_nesting.py              # 5 rounds
    .venv/bin/python benchmarks/omp_nesting.py --rounds 9

What a Dagster run does in one process: the corpus stage runs a parallel Numba kernel (Numba's
``omp`` layer starts its pool), a trainer sets torch's thread count for its loop and restores it,
and the next asset runs the model (DPO's reference log-probs, an evaluation). Each round starts
two fresh processes that do exactly that and time ``--forwards`` padded forwards of a
demo-sized Qwen2 (2 layers, hidden 64, batch 16 × 130 tokens) under ``inference_mode``:

- ``ours``: the kernels as shipped (``kernels/threads.py`` turns nesting back off);
- ``nested``: the same with ``OMP_MAX_ACTIVE_LEVELS=255`` in the environment, which the kernels
  respect as an explicit request: what Numba's ``omp`` layer leaves behind on its own.

Reported: each side's median seconds per forward and OpenMP max-active-levels, the per-round
ratio (nested / ours: median and range) and the load average. The last line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = r"""
import json, sys, time
import numpy as np
from training_assets_kernels import dedup as K, threads
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

texts = [("lorem ipsum dolor %d " % i) * 40 for i in range(200)]
data = np.frombuffer("".join(texts).encode(), dtype=np.uint8)
offsets = np.cumsum([0] + [len(t.encode()) for t in texts]).astype(np.int64)
K.shingle_hashes(data, offsets, 5)                         # the corpus stage: a parallel kernel
torch.set_num_threads(1); torch.set_num_threads(2)         # a trainer's loop, then its restore
torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)).eval()
ids = torch.randint(0, 512, (16, 130)); mask = torch.ones(16, 130, dtype=torch.long); mask[::2, 100:] = 0
with torch.inference_mode():
    model(input_ids=ids, attention_mask=mask)               # warm-up
    times = []
    for _ in range(int(sys.argv[1])):
        t = time.perf_counter()
        model(input_ids=ids, attention_mask=mask)
        times.append(time.perf_counter() - t)
print(json.dumps({"seconds": sorted(times)[len(times) // 2], "levels": threads.max_active_levels(),
                  "layer": threads.launch()}))
"""


def _side(nested: bool, forwards: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("OMP_MAX_ACTIVE_LEVELS", None)
    env.pop("OMP_NESTED", None)
    if nested:
        env["OMP_MAX_ACTIVE_LEVELS"] = "255"
    out = subprocess.run([sys.executable, "-c", WORKER, str(forwards)], env=env, capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        raise SystemExit(f"worker failed ({'nested' if nested else 'ours'}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--forwards", type=int, default=10, help="timed forwards per side and round")
    args = parser.parse_args()

    load_before = os.getloadavg()
    ours, nested, ratios = [], [], []
    for r in range(args.rounds):
        got = {nested: _side(nested, args.forwards) for nested in ((False, True) if r % 2 == 0 else (True, False))}
        a, b = got[False], got[True]
        ours.append(a)
        nested.append(b)
        ratios.append(b["seconds"] / a["seconds"])
        print(f"round {r + 1}: ours {a['seconds'] * 1e3:.1f} ms (levels {a['levels']}), "
              f"nested {b['seconds'] * 1e3:.1f} ms (levels {b['levels']}): {ratios[-1]:.1f}x", flush=True)
    result = {
        "benchmark": "omp_nesting", "rounds": args.rounds, "forwards": args.forwards, "layer": ours[0]["layer"],
        "ours_s_per_forward": round(statistics.median(a["seconds"] for a in ours), 5),
        "nested_s_per_forward": round(statistics.median(b["seconds"] for b in nested), 5),
        "levels": {"ours": ours[0]["levels"], "nested": nested[0]["levels"]},
        "speedup": {"median": round(statistics.median(ratios), 1), "min": round(min(ratios), 1),
                    "max": round(max(ratios), 1)},
        "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
