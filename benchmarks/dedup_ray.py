"""The corpus stage on Ray against the local engine, on a two-node loopback Ray cluster.

    .venv/bin/python benchmarks/dedup_ray.py                      # 1M ~1 KB documents, 1 round
    .venv/bin/python benchmarks/dedup_ray.py --docs 100000 --rounds 3
    .venv/bin/python benchmarks/dedup_ray.py --docs 20000 --rounds 5   # quick

Corpus: ``benchmarks/dedup.py``'s synthetic documents (200 Zipf-distributed 4-character tokens,
~1,000 bytes, 10 % planted near-copies), written as one Parquet extra source (row groups of
``--shard-docs``) beside a one-example held-out set, so the whole stage runs: quality filter,
decontamination, exact + MinHash dedup, outputs. Each round curates it with the local engine
(in a fresh process: its wall time and peak RSS, VmHWM) and with ``engine="ray"`` on a cluster of
two nodes of one CPU each (``ray_local.local_cluster``), the order swapped every other round,
and checks that both wrote the same ``corpus.parquet`` bytes. Ray side: seconds and the largest
task peak RSS per stage (VmHWM reset at each task start), the driver's peak RSS.

On this 2-core machine the two nodes share the cores the local engine uses alone: the ratio
shows the engine's overhead (files between stages, task start-up), not a speed-up; more nodes
give more CPUs, which the local engine cannot use beyond one machine.

Prints ``RESULT {json}`` last.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from training_assets.data_engine.ray_local import local_cluster  # noqa: E402  (before ray: loopback nodes)


def _vm_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def make_corpus(root: Path, n_docs: int, shard_docs: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from dedup import synthetic

    from training_assets import data_engine

    texts, _ = synthetic(n_docs)
    source = root / "synthetic.parquet"  # run config may only name files under the data root
    pq.write_table(pa.table({"id": [f"d{i:07d}" for i in range(n_docs)], "text": texts}), source,
                   row_group_size=shard_docs)
    held = root / "held_out" / "evals.jsonl"
    held.parent.mkdir(parents=True)
    held.write_text(json.dumps({"id": "e1", "prompt": texts[len(texts) // 2]}) + "\n")
    data_engine.write_held_out_sets([held], root)
    return source


def local_worker(root: str, source: str) -> None:
    from training_assets import data_engine

    start = time.perf_counter()
    report = data_engine.curate(root, data_engine.CurationConfig(extra_sources=(source,)))
    print(json.dumps({"seconds": time.perf_counter() - start, "peak_rss_mb": _vm_mb("VmHWM"),
                      "kept": report.stage_counts["dedup"]}))


def run_local(root: Path, source: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--local-worker", str(root), str(source)], check=True,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_ray(root: Path, source: Path, shard_docs: int) -> dict:
    from training_assets import data_engine

    start = time.perf_counter()
    report = data_engine.curate(root, data_engine.CurationConfig(extra_sources=(str(source),), engine="ray",
                                                                  ray_shard_docs=shard_docs))
    info = report.engine_info
    return {"seconds": time.perf_counter() - start, "kept": report.stage_counts["dedup"],
            "stage_seconds": {k: round(v, 2) for k, v in info["seconds"].items()},
            "stage_peak_task_rss_mb": {k: round(v / 2**20) for k, v in info["peak_task_rss_bytes"].items()},
            "tasks": info["tasks"], "shards": info["shards"], "cc_rounds": info["cc_rounds"],
            "nodes": info["nodes"], "driver_peak_rss_mb": round(_vm_mb("VmHWM"))}


def _digest(root: Path) -> str:
    return hashlib.sha256((root / "curated_corpus" / "corpus.parquet").read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--shard-docs", type=int, default=50_000, help="records per Ray map task")
    parser.add_argument("--local-worker", nargs=2, metavar=("ROOT", "SOURCE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.local_worker:
        local_worker(*args.local_worker)
        return
    import ray

    with tempfile.TemporaryDirectory(prefix="dedup-ray-") as tmp:
        root = Path(tmp) / "data"
        t = time.perf_counter()
        source = make_corpus(root, args.docs, args.shard_docs)
        print(f"corpus: {args.docs:,} docs, {source.stat().st_size / 1e6:.0f} MB parquet, "
              f"{time.perf_counter() - t:.0f} s", flush=True)
        load_before = os.getloadavg()
        with local_cluster(nodes=2, cpus_per_node=1) as cluster:
            ray.init(address=cluster.address, log_to_driver=False)
            rounds = []
            for r in range(args.rounds):
                sides = ("local", "ray") if r % 2 == 0 else ("ray", "local")
                row = {}
                for side in sides:
                    row[side] = run_local(root, source) if side == "local" else run_ray(root, source, args.shard_docs)
                    row[side + "_digest"] = _digest(root)
                row["identical"] = row.pop("local_digest") == row.pop("ray_digest")
                row["ratio"] = row["ray"]["seconds"] / row["local"]["seconds"]
                print(f"round {r}: local {row['local']['seconds']:.1f} s (peak {row['local']['peak_rss_mb']:.0f} MB), "
                      f"ray {row['ray']['seconds']:.1f} s, ratio {row['ratio']:.2f}, identical {row['identical']}, "
                      f"stages {row['ray']['stage_seconds']}", flush=True)
                rounds.append(row)
            ray.shutdown()
    ratios = [r["ratio"] for r in rounds]
    result = {"docs": args.docs, "rounds": args.rounds, "shard_docs": args.shard_docs,
              "ray_over_local_median": round(statistics.median(ratios), 3),
              "ray_over_local_range": [round(min(ratios), 3), round(max(ratios), 3)],
              "local_seconds": [round(r["local"]["seconds"], 1) for r in rounds],
              "ray_seconds": [round(r["ray"]["seconds"], 1) for r in rounds],
              "local_peak_rss_mb": max(round(r["local"]["peak_rss_mb"]) for r in rounds),
              "ray": rounds[-1]["ray"], "identical_every_round": all(r["identical"] for r in rounds),
              "loadavg_before": load_before, "loadavg_after": os.getloadavg()}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
