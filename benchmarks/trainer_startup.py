"""Trainer start-up on a large ``sft_dataset``: memory-mapped rows (now) against the list of dicts (before).

    .venv/bin/python benchmarks/trainer_startup.py                       # 1M rows, 3 rounds
    .venv/bin/python benchmarks/trainer_startup.py --rows 20000 --rounds 3 --with-hf
    .venv/bin/python benchmarks/trainer_startup.py --open-only              # only the Arrow map vs datasets

A synthetic ``sft_dataset`` of ``--rows`` rows (token ids and assistant masks, 16–112 tokens each
by default) is written with the project's writer (``training_data.io.write_dataset``) in a temp
dir, with a tiny tokenizer. Each round starts one fresh process per side, alternating which goes
first, that trains one SFT step on it (the default random-init toy model, one torch thread):

- ``mmap``: ``open_dataset_rows`` (the Arrow IPC cache mapped; rows read per micro-batch);
- ``list``: ``load_sft_dataset`` (``to_pylist``: every row as Python objects, then prepared).

Measured per process: start-up = process launch → the first optimizer step begins (the loop's
first ``collate`` call); of it, ``data_s``: the time spent loading, planning and preparing the
examples (the rest — interpreter, torch, the transformers model classes, the tokenizer — is the
same on both sides); and RSS at that moment minus the model's own bytes (parameters and
buffers; the optimizer state does not exist yet), plus the RSS right after the imports so the
interpreter + torch floor is visible. Before the rounds, one ``mmap`` start on a cold cache (no
Arrow file yet: it converts the Parquet) is reported separately as ``first_start_s``, and after
them one ``floor`` process (the same training on 8 rows) gives the RSS of the process without the
dataset: ``rss_data_mb`` is each side's RSS above that floor.
``--with-hf`` also times opening the same Parquet with ``datasets.Dataset.from_parquet`` (cold and
warm cache) against the Arrow map, in fresh processes. Targets (issue #13): start ≤ 10 s,
RSS ≤ 500 MB above the model. Prints ``RESULT {json}`` last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss_mb() -> float:
    """Current resident set size (VmRSS), MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def write_synthetic(root: Path, rows: int, min_tokens: int, max_tokens: int, vocab: int, seed: int = 0) -> None:
    """``rows`` SFT rows built as Arrow arrays (no Python lists of tokens), written by the project's writer."""
    import pyarrow as pa

    from training_assets.training_data.io import SCHEMAS, write_dataset

    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_tokens, max_tokens + 1, rows).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32)
    total = int(offsets[-1])
    ids = rng.integers(3, vocab, total, dtype=np.int32)
    position = np.arange(total, dtype=np.int32) - np.repeat(offsets[:-1], lengths)
    mask = (position >= np.repeat(lengths // 2, lengths)).astype(np.int8)  # the second half is the assistant's
    schema = SCHEMAS["sft_dataset"]
    table = pa.Table.from_arrays([
        pa.array([f"s{i}" for i in range(rows)]), pa.array([f"task-{i % 1000}" for i in range(rows)]),
        pa.array([json.dumps([{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}])
                  for i in range(rows)]),
        pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids)).cast(schema.field("input_ids").type),
        pa.ListArray.from_arrays(pa.array(offsets), pa.array(mask)).cast(schema.field("assistant_mask").type),
        pa.array(lengths), pa.array([["batch-0"]] * rows, pa.list_(pa.string())),
    ], schema=schema)
    write_dataset("sft_dataset", table, {"synthetic": rows, "seed": seed}, {}, root)


def child(side: str, root: str, tokenizer: str, out: str, report: str) -> None:
    """One training process: train a step on ``side``'s examples, writing the first step's figures to ``report``."""
    import torch

    from training_assets.training_data import load_sft_dataset, open_dataset_rows
    from training_assets.trainers import TrainConfig, get_trainer

    after_imports = rss_mb()
    trainer = get_trainer("sft", TrainConfig(tokenizer=tokenizer, output_dir=out, max_steps=1, batch_size=8, seed=0,
                                             torch_threads=1, max_seq_len=128))
    collate, seen, data_s = trainer.collate, [], [0.0]

    def first_collate(rows, model):  # the loop's first call: the first optimizer step begins
        if not seen:
            seen.append(1)
            model_bytes = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
            Path(report).write_text(json.dumps({"t_first_step": time.time(), "rss_mb": rss_mb(), "data_s": data_s[0],
                                                "model_mb": model_bytes / 2**20, "rss_after_imports_mb": after_imports}))
        return collate(rows, model)

    def timed(fn):  # the data work of start-up: loading, planning and preparing the examples
        def run(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                data_s[0] += time.perf_counter() - t0
        return run

    trainer.collate, trainer.plan, trainer.prepare = first_collate, timed(trainer.plan), timed(trainer.prepare)
    torch.set_num_threads(1)
    loaders = {"mmap": lambda: open_dataset_rows("sft_dataset", root), "list": lambda: load_sft_dataset(root),
               "floor": lambda: open_dataset_rows("sft_dataset", root).take(range(8))}  # 8 rows: the process alone
    examples = timed(loaders[side])()
    trainer.train(examples)


def child_open(side: str, parquet: str, cache_dir: str, report: str) -> None:
    """Import + open + read 8 rows, in-process seconds: the Arrow map, or ``datasets.Dataset.from_parquet``."""
    t0 = time.perf_counter()
    if side == "arrow":
        from training_assets.dataset_rows import open_rows_file

        rows = open_rows_file(parquet)
        picked = rows.take(list(range(0, len(rows), max(len(rows) // 8, 1)))[:8])
    else:
        import datasets

        rows = datasets.Dataset.from_parquet(parquet, cache_dir=cache_dir)
        picked = rows[list(range(0, len(rows), max(len(rows) // 8, 1)))[:8]]
    assert picked
    Path(report).write_text(json.dumps({"open_s": time.perf_counter() - t0, "rss_mb": rss_mb()}))


def _spawn(args: list[str], report: Path) -> dict:
    report.unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    launched = time.time()
    done = subprocess.run([sys.executable, __file__, *args, "--report", str(report)], env=env, capture_output=True,
                          text=True)
    if done.returncode != 0 or not report.is_file():
        raise RuntimeError(f"{args[:2]} failed (exit {done.returncode}): {done.stderr[-3000:]}")
    out = json.loads(report.read_text())
    if "t_first_step" in out:
        out["start_s"] = out.pop("t_first_step") - launched
        out["rss_above_model_mb"] = out["rss_mb"] - out["model_mb"]
    return out


def _summary(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "range": [round(min(values), 3), round(max(values), 3)]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-tokens", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=112)
    ap.add_argument("--with-hf", action="store_true", help="also time datasets.Dataset.from_parquet against the Arrow map")
    ap.add_argument("--open-only", action="store_true", help="with --with-hf: only the open comparison, no training")
    ap.add_argument("--child", choices=["mmap", "list", "floor", "open-arrow", "open-hf"], help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--tokenizer", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--report", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child in ("mmap", "list", "floor"):
        return child(args.child, args.root, args.tokenizer, args.out, args.report)
    if args.child:
        return child_open(args.child.removeprefix("open-"), args.root, args.out, args.report)

    from training_assets.tokenizer_trainer import train_tokenizer
    from training_assets.training_data import dataset_path

    with tempfile.TemporaryDirectory(prefix="trainer-startup-") as tmp:
        tmp_path = Path(tmp)
        tok = train_tokenizer([f"The answer is {i}. Tool call search({i * 7}) returned ok." for i in range(200)],
                              vocab_size=400)
        tok.save_pretrained(str(tmp_path / "tokenizer"))
        t0 = time.perf_counter()
        write_synthetic(tmp_path / "data", args.rows, args.min_tokens, args.max_tokens, len(tok))
        parquet = dataset_path("sft_dataset", tmp_path / "data")
        print(f"wrote {args.rows} rows ({parquet.stat().st_size / 2**20:.0f} MB Parquet) in {time.perf_counter() - t0:.1f} s",
              flush=True)
        report = tmp_path / "report.json"

        def side(name: str, run: int) -> dict:
            return _spawn(["--child", name, "--root", str(tmp_path / "data"), "--tokenizer", str(tmp_path / "tokenizer"),
                           "--out", str(tmp_path / f"out-{name}-{run}")], report)

        result: dict = {"rows": args.rows, "rounds": args.rounds, "tokens_per_row": [args.min_tokens, args.max_tokens],
                        "parquet_mb": round(parquet.stat().st_size / 2**20, 1)}
        if not args.open_only:
            cold = side("mmap", -1)
            cache = next((parquet.parent / "arrow").glob("*.arrow"))
            print(f"mmap first start (builds the {cache.stat().st_size / 2**20:.0f} MB Arrow cache): {cold['start_s']:.2f} s",
                  flush=True)
            rounds: dict[str, list[dict]] = {"mmap": [], "list": []}
            for r in range(args.rounds):
                for name in (("mmap", "list") if r % 2 == 0 else ("list", "mmap")):
                    rounds[name].append(side(name, r))
                    m = rounds[name][-1]
                    print(f"round {r} {name}: start {m['start_s']:.2f} s (data {m['data_s']:.2f} s), RSS {m['rss_mb']:.0f} MB "
                          f"({m['rss_above_model_mb']:.0f} above the {m['model_mb']:.1f} MB model; "
                          f"{m['rss_after_imports_mb']:.0f} after imports)", flush=True)
            floor = side("floor", 0)
            print(f"floor (8 rows as a list): start {floor['start_s']:.2f} s, RSS {floor['rss_above_model_mb']:.0f} MB above "
                  "the model", flush=True)
            ratios = [a["start_s"] / b["start_s"] for a, b in zip(rounds["list"], rounds["mmap"], strict=True)]
            result |= {"arrow_cache_mb": round(cache.stat().st_size / 2**20, 1), "first_start_s": round(cold["start_s"], 3),
                       "floor": {"start_s": round(floor["start_s"], 3), "rss_above_model_mb": round(floor["rss_above_model_mb"], 1)},
                       "start_speedup": _summary(ratios)}
            for name, runs in rounds.items():
                result[name] = {"start_s": _summary([m["start_s"] for m in runs]), "data_s": _summary([m["data_s"] for m in runs]),
                                "rss_above_model_mb": _summary([m["rss_above_model_mb"] for m in runs]),
                                "rss_data_mb": _summary([m["rss_above_model_mb"] - floor["rss_above_model_mb"] for m in runs]),
                                "rss_after_imports_mb": _summary([m["rss_after_imports_mb"] for m in runs]),
                                "model_mb": round(runs[0]["model_mb"], 2)}
        if args.with_hf or args.open_only:
            def opened(name: str, cache_dir: Path) -> dict:
                return _spawn(["--child", name, "--root", str(parquet), "--out", str(cache_dir)], report)

            if not (parquet.parent / "arrow").is_dir():  # the map's first open builds its cache: timed once, apart
                result["arrow_first_open_s"] = round(opened("open-arrow", tmp_path)["open_s"], 3)
            hf: dict[str, list[float]] = {"arrow": [], "hf_cold": [], "hf_warm": []}
            for r in range(args.rounds):
                cache_dir = tmp_path / f"hf-cache-{r}"  # a fresh datasets cache each round: its cold open converts
                hf["hf_cold"].append(opened("open-hf", cache_dir)["open_s"])
                hf["arrow"].append(opened("open-arrow", cache_dir)["open_s"])
                hf["hf_warm"].append(opened("open-hf", cache_dir)["open_s"])
                print(f"round {r} open: arrow map {hf['arrow'][-1]:.2f} s, datasets cold {hf['hf_cold'][-1]:.2f} s, "
                      f"warm {hf['hf_warm'][-1]:.2f} s", flush=True)
            result["open_s"] = {k: _summary(v) for k, v in hf.items()}
        result["load_avg"] = os.getloadavg()[0]
        print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
