"""BPE training and encoding throughput of the project tokenizer, by thread setting.

    .venv/bin/python benchmarks/tokenizer.py             # ~20 MB of corpus text, 5 rounds
    .venv/bin/python benchmarks/tokenizer.py --mb 100    # the 100 MB corpus of earlier runs
    .venv/bin/python benchmarks/tokenizer.py --quick     # ~5 MB, 3 rounds: a smoke run

The corpus is generated deterministically (seed 0), in the proportions a trace corpus has:
about a third agent traces from ``sample_traces`` rendered as the curated corpus renders them
(``data_engine.render_trace``: many tasks, four attempts each), the rest varied prose (Zipf-
distributed words from a 20k-word synthetic lexicon, with accented, Cyrillic, CJK and emoji
words mixed in) and small code snippets. It is cached under ``--cache`` (default
``benchmarks/out/``, git-ignored) so reruns skip it.

Hugging Face ``tokenizers`` parallelises with Rayon only when ``TOKENIZERS_PARALLELISM`` is
true; ``RAYON_NUM_THREADS`` sets the pool size. Both are read when the library first starts a
pool, so every setting runs in its own subprocess:

- ``serial``: ``TOKENIZERS_PARALLELISM=false`` (what ``make demo`` / ``make test`` export);
- ``threads=N``: ``TOKENIZERS_PARALLELISM=true RAYON_NUM_THREADS=N``.

Each worker trains ``tokenizer_trainer.train_tokenizer`` (the asset's code path, texts from a
Python iterator) and encodes the whole corpus in batches of 1,000 documents; the serial worker
also times one-document-at-a-time encoding. The merges learned under each setting are hashed
to show training does not depend on the thread count. The settings alternate over ``--rounds``
rounds (serial, threads=2, ..., serial, threads=2, ...), so a burst of load on this shared machine
hits every setting; speed-ups are per-round ratios against that round's serial run, reported as
the median with the min-max spread, beside the load average before and after. The last line is
``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EXTRA_WORDS = ["naïve", "café", "Straße", "Köln", "Привет", "данные", "日本語", "数据", "한국어", "🚀", "👍🏽", "ελληνικά"]
CODE = [
    "def {f}(x, y):\n    return x {op} y\n",
    "for i in range({n}):\n\tprint(i, {f}(i))\n",
    'result = {{"{f}": [{n}, {n}], "ok": true}}\n',
]


def _lexicon(rng: random.Random, size: int = 20_000) -> list[str]:
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["th", "ch", "sh", "qu", "str"]
    words = {"".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(size * 2)}
    return sorted(words)[:size]


def generate_corpus(target_bytes: int, seed: int = 0) -> list[str]:
    """Deterministic documents totalling about ``target_bytes`` of UTF-8 (see the module docstring)."""
    import numpy as np

    from training_assets.data_engine.render import render_trace
    from training_assets.sample_traces import make_tasks, make_trace
    from training_assets.traces import Trace

    rng = random.Random(seed)
    docs: list[str] = []
    size = 0
    trace_budget = target_bytes // 3
    start = datetime(2026, 11, 1)
    task_index = 0
    while size < trace_budget:
        for task in make_tasks(300, seed=seed + task_index):
            for attempt in range(4):
                text = render_trace(Trace.model_validate(make_trace(task, attempt, rng, start)))
                docs.append(text)
                size += len(text.encode())
        task_index += 1
    lexicon = np.array(_lexicon(rng) + EXTRA_WORDS, dtype=object)
    gen = np.random.default_rng(seed)
    while size < target_bytes:
        ranks = np.minimum(gen.zipf(1.2, size=gen.integers(80, 600)), len(lexicon)) - 1
        words = lexicon[ranks].tolist()
        for i in range(0, len(words), gen.integers(8, 20)):
            words[i] = words[i].capitalize()
        text = " ".join(words).replace(" Th", ". Th") + "."
        if gen.random() < 0.2:
            snippet = rng.choice(CODE).format(f=rng.choice(words[:5]).lower(), op=rng.choice("+-*"), n=rng.randint(1, 99))
            text += "\n\n" + snippet
        docs.append(text)
        size += len(text.encode())
    return docs


def load_or_generate(cache: Path, target_bytes: int) -> Path:
    path = cache / f"tokenizer_bench_corpus_{target_bytes}.jsonl"
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            for doc in generate_corpus(target_bytes):
                handle.write(json.dumps(doc, ensure_ascii=False) + "\n")
        tmp.rename(path)
    return path


def worker(corpus: Path, vocab_size: int, single_docs: int) -> dict:
    """Runs inside a subprocess whose environment fixes the thread setting."""
    from training_assets import tokenizer_trainer

    docs = [json.loads(line) for line in open(corpus, encoding="utf-8")]
    n_bytes = sum(len(d.encode()) for d in docs)
    t0 = time.perf_counter()
    tok = tokenizer_trainer.train_tokenizer(docs, vocab_size=vocab_size)
    train_s = time.perf_counter() - t0
    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    t0 = time.perf_counter()
    n_tokens = 0
    for i in range(0, len(docs), 1000):
        n_tokens += sum(len(ids) for ids in tok(docs[i:i + 1000], add_special_tokens=False)["input_ids"])
    batch_s = time.perf_counter() - t0
    out = {"train_s": round(train_s, 2), "train_mb_per_s": round(n_bytes / 1e6 / train_s, 3),
           "encode_batch_s": round(batch_s, 2), "encode_batch_mb_per_s": round(n_bytes / 1e6 / batch_s, 3),
           "encode_batch_tokens_per_s": round(n_tokens / batch_s), "tokens": n_tokens,
           "bytes_per_token": round(n_bytes / n_tokens, 3), "merges_sha256": hashlib.sha256(json.dumps(merges).encode()).hexdigest()[:16]}
    if single_docs:
        sample = docs[:single_docs]
        t0 = time.perf_counter()
        for d in sample:
            tok.encode(d, add_special_tokens=False)
        single_s = time.perf_counter() - t0
        out["encode_single_mb_per_s"] = round(sum(len(d.encode()) for d in sample) / 1e6 / single_s, 3)
    return out


def run_setting(name: str, env_extra: dict[str, str], corpus: Path, vocab_size: int, single_docs: int,
                label: str = "") -> dict:
    env = {**os.environ, **env_extra}
    cmd = [sys.executable, __file__, "--worker", "--corpus", str(corpus), "--vocab-size", str(vocab_size),
           "--single-docs", str(single_docs)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"worker {name} failed:\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{label}{name:>10}: train {result['train_mb_per_s']:.2f} MB/s ({result['train_s']} s), "
          f"encode {result['encode_batch_mb_per_s']:.2f} MB/s batched"
          + (f", {result['encode_single_mb_per_s']:.2f} MB/s one by one" if "encode_single_mb_per_s" in result else ""),
          flush=True)
    return {"env": env_extra, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="~5 MB and 3 rounds instead of ~20 MB and 5")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds over the settings (default 5)")
    parser.add_argument("--mb", type=float, default=None, help="corpus size in MB (overrides --quick)")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--threads", type=int, nargs="*", default=None, help="parallel pool sizes (default: 2 and all cores)")
    parser.add_argument("--cache", default=str(ROOT / "benchmarks" / "out"), help="where the generated corpus is kept")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    parser.add_argument("--single-docs", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(Path(args.corpus), args.vocab_size, args.single_docs)))
        return

    mb = args.mb or (5.0 if args.quick else 20.0)
    rounds = args.rounds or (3 if args.quick else 5)
    t0 = time.perf_counter()
    corpus = load_or_generate(Path(args.cache), int(mb * 1e6))
    n_docs = sum(1 for _ in open(corpus, encoding="utf-8"))
    print(f"corpus: {corpus} ({corpus.stat().st_size / 1e6:.1f} MB JSONL, {n_docs} docs, ready in {time.perf_counter() - t0:.1f} s)")
    cores = os.cpu_count() or 1
    threads = args.threads or sorted({min(2, cores), cores})
    settings = {"serial": {"TOKENIZERS_PARALLELISM": "false"}}
    for n in threads:
        settings[f"threads={n}"] = {"TOKENIZERS_PARALLELISM": "true", "RAYON_NUM_THREADS": str(n)}
    load_before = os.getloadavg()
    per_round: list[dict[str, dict]] = []
    for r in range(rounds):
        per_round.append({name: run_setting(name, env, corpus, args.vocab_size, 2000 if name == "serial" and r == 0 else 0,
                                            label=f"round {r + 1}/{rounds} ")
                          for name, env in settings.items()})
    load_after = os.getloadavg()

    def spread(values: list[float]) -> dict[str, float]:
        return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}

    keys = ("train_mb_per_s", "encode_batch_mb_per_s")
    results = {name: {**{k: spread([rnd[name][k] for rnd in per_round]) for k in keys}, "env": env}
               for name, env in settings.items()}
    results["serial"]["encode_single_mb_per_s"] = per_round[0]["serial"]["encode_single_mb_per_s"]
    speedups = {key: {name: spread([rnd[name][key] / rnd["serial"][key] for rnd in per_round]) for name in settings}
                for key in keys}
    merges = {rnd[name]["merges_sha256"] for rnd in per_round for name in settings}
    for name in settings:
        print(f"{name:>10}: train {results[name]['train_mb_per_s']['median']:.2f} MB/s median "
              f"({speedups['train_mb_per_s'][name]['median']:.2f}x serial, "
              f"{speedups['train_mb_per_s'][name]['min']:.2f}-{speedups['train_mb_per_s'][name]['max']:.2f}), "
              f"encode {results[name]['encode_batch_mb_per_s']['median']:.2f} MB/s median")
    summary = {
        "corpus_mb": round(corpus.stat().st_size / 1e6, 1), "docs": n_docs, "vocab_size": args.vocab_size,
        "cores": cores, "rounds": rounds, "settings": results,
        "train_speedup_vs_serial": speedups["train_mb_per_s"],
        "encode_speedup_vs_serial": speedups["encode_batch_mb_per_s"],
        "merges_identical_across_settings": len(merges) == 1,
        "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in load_after],
    }
    print("RESULT " + json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
