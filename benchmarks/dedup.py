"""Near-duplicate detection: ``data_engine.dedup`` (Numba) against datasketch, and at scale.

    .venv/bin/python benchmarks/dedup.py                 # real corpus + 100k / 300k / 1M synthetic
    .venv/bin/python benchmarks/dedup.py --quick         # smoke: 400 real files, 20k synthetic
    .venv/bin/python benchmarks/dedup.py --sizes 100000 300000

Part 1, real corpus: the model source files of Hugging Face ``transformers`` as installed in the
venv (``transformers/models/**/*.py``; the pinned ``transformers`` wheel of the ``train`` extra,
so ``pip install transformers==<version>`` gets the same files offline). The library copies code
between models (``# Copied from ...``, modular files), so it is full of real near-duplicates
nobody here wrote. Exact-duplicate files are collapsed first so both methods see distinct texts.
Both methods get the same shingles: word 5-grams of the ASCII-lower-cased bytes split on
whitespace. Ground truth: every pair with exact Jaccard >= 0.8 on those shingle sets, found by
prefix filtering (AllPairs, Bayardo et al. 2007; exact, no sampling). A method's found pairs are
what it reports as duplicates: datasketch's LSH query results, our verified pairs.
End-to-end time covers text -> clusters for both (shingling, signatures, LSH, pairs, union-find);
ours gets fresh string objects each run, so the exact-duplicate step pays for hashing the texts.
Timing: rounds of (datasketch, ours 1 thread, ours N threads) back to back; the speedup is the
per-round ratio (both sides under the same background load), reported as median and range.
A per-stage profile of ours follows (``stages_*``: seconds per stage, candidates verified all).

Part 2, scale: synthetic ~1 KB documents (250 words of a Zipf vocabulary) with 10% planted near-copies (1-3
words substituted); each size runs in its own process so peak RSS is per size. Recall is over
planted pairs whose exact Jaccard (Python sets of word 5-grams) is >= the threshold.

Prints ``RESULT {json}`` last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numba
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from training_assets_kernels import dedup as K  # noqa: E402
from training_assets.data_engine import dedup  # noqa: E402
from training_assets.data_engine.dedup import (  # noqa: E402
    DedupParams,
    candidate_pairs,
    compute_features,
    lsh_params,
    pack_texts,
)

THRESHOLD, NUM_PERM, NGRAM = 0.8, 128, 5


# --------------------------------------------------------------------------- shared shingles


def shingles(text: str, n: int = NGRAM) -> set[bytes]:
    """The definition both methods use: word n-grams of the ASCII-lower-cased UTF-8 bytes."""
    words = text.encode("utf-8").lower().split()
    if not words:
        return set()
    if len(words) < n:
        return {b" ".join(words)}
    return {b" ".join(words[i:i + n]) for i in range(len(words) - n + 1)}


def exact_pairs(sets: list[set[bytes]], threshold: float) -> set[tuple[int, int]]:
    """All pairs with Jaccard >= threshold by prefix filtering: tokens ordered rare-first, each set
    indexed by its first |x| - ceil(t|x|) + 1 tokens; any qualifying pair shares a prefix token."""
    freq: dict[bytes, int] = defaultdict(int)
    for s in sets:
        for tok in s:
            freq[tok] += 1
    rank = {tok: i for i, tok in enumerate(sorted(freq, key=lambda t: (freq[t], t)))}
    ordered = [sorted(rank[t] for t in s) for s in sets]
    order = sorted(range(len(sets)), key=lambda i: len(ordered[i]))
    index: dict[int, list[int]] = defaultdict(list)
    found = set()
    for i in order:
        x = ordered[i]
        if not x:
            continue
        prefix = len(x) - math.ceil(threshold * len(x)) + 1
        candidates = set()
        for tok in x[:prefix]:
            for j in index[tok]:
                if len(ordered[j]) >= threshold * len(x):
                    candidates.add(j)
            index[tok].append(i)
        for j in candidates:
            inter = len(sets[i] & sets[j])
            if inter / (len(sets[i]) + len(sets[j]) - inter) >= threshold:
                found.add((min(i, j), max(i, j)))
    return found


def precision_recall(found: set[tuple[int, int]], truth: set[tuple[int, int]]) -> tuple[float, float]:
    hit = len(found & truth)
    return (hit / len(found) if found else 1.0), (hit / len(truth) if truth else 1.0)


# --------------------------------------------------------------------------- the two methods


def run_datasketch(texts: list[str]) -> tuple[float, set[tuple[int, int]], int]:
    from datasketch import MinHash, MinHashLSH

    start = time.perf_counter()
    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM)
    sketches = []
    for i, text in enumerate(texts):
        m = MinHash(num_perm=NUM_PERM)
        m.update_batch(list(shingles(text)))
        sketches.append(m)
        lsh.insert(i, m)
    pairs = set()
    for i, m in enumerate(sketches):
        for j in lsh.query(m):
            if j != i:
                pairs.add((min(i, j), max(i, j)))
    parent = list(range(len(texts)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in pairs:
        ra, rb = find(a), find(b)
        parent[max(ra, rb)] = min(ra, rb)
    clusters = len({find(i) for i in range(len(texts))})
    return time.perf_counter() - start, pairs, clusters


def warm_up() -> None:
    """Load every kernel from Numba's cache (or compile it) outside the timed region: documents
    that take each path (exact duplicate, accepted on signature, checked exactly, rejected)."""
    base = [f"word{i}" for i in range(60)]
    docs = [" ".join(base), " ".join(base), " ".join(base[:59] + ["other"]),
            " ".join(["x"] + base[1:30] + ["y"] + base[31:]), " ".join(reversed(base)), ""]
    for _ in range(2):
        dedup([{"id": str(i), "text": t} for i, t in enumerate(docs)], threshold=THRESHOLD)


def run_ours(texts: list[str]) -> tuple[float, set[tuple[int, int]], int]:
    # Fresh string objects: CPython caches a string's hash, and the exact-duplicate step hashes
    # every text, so reusing strings hashed before (by real_corpus's set) would hide that cost.
    records = [{"id": str(i), "text": t.encode("utf-8").decode("utf-8")} for i, t in enumerate(texts)]
    start = time.perf_counter()
    result = dedup(records, threshold=THRESHOLD, num_perm=NUM_PERM, ngram=NGRAM)
    elapsed = time.perf_counter() - start
    pairs = {(min(int(a), int(b)), max(int(a), int(b))) for a, b, _ in result.pairs}
    return elapsed, pairs, len(result.clusters)


def real_corpus(limit: int | None) -> tuple[list[str], str]:
    import transformers

    base = Path(transformers.__file__).parent / "models"
    files = sorted(p for p in base.rglob("*.py") if p.stat().st_size >= 1024)
    texts, seen = [], set()
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        if text not in seen:
            seen.add(text)
            texts.append(text)
    return texts[:limit] if limit else texts, f"transformers {transformers.__version__} models/**/*.py"


def stage_profile(texts: list[str]) -> dict[str, float]:
    """Seconds per stage of one ``dedup`` call, the stages called one by one as ``dedup`` calls them."""
    params = DedupParams(threshold=THRESHOLD, num_perm=NUM_PERM, ngram=NGRAM)
    texts = [t.encode("utf-8").decode("utf-8") for t in texts]
    t0 = time.perf_counter()
    data, offsets = pack_texts(texts)
    t1 = time.perf_counter()
    K.exact_roots(data, offsets)
    t2 = time.perf_counter()
    hash_offsets, hashes, signatures = K.shingle_signatures(data, offsets, NGRAM, NUM_PERM, K.oph_salt(params.seed))
    t3 = time.perf_counter()
    bands, rows = lsh_params(THRESHOLD, NUM_PERM)
    candidates, _ = candidate_pairs(signatures, np.diff(hash_offsets) > 0, bands, rows)
    t4 = time.perf_counter()
    features = compute_features(texts, params)  # fresh features: verification sorts blocks in place
    t5 = time.perf_counter()
    sims = features.similarity(candidates, THRESHOLD)
    t6 = time.perf_counter()
    out = {"pack_utf8": t1 - t0, "exact_dedup": t2 - t1, "shingles_and_minhash": t3 - t2,
           "lsh_candidates": t4 - t3, "verify_all_candidates": t6 - t5,
           "candidate_pairs": int(len(candidates)), "verified_pairs": int((sims >= THRESHOLD).sum())}
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}


def bench_real(limit: int | None, repeats: int) -> dict:
    """Interleaved rounds (datasketch, ours 1 thread, ours N threads, back to back), so each
    round's ratio compares runs under the same background load; median and range over rounds."""
    texts, name = real_corpus(limit)
    warm_up()
    sets = [shingles(t) for t in texts]
    t0 = time.perf_counter()
    truth = exact_pairs(sets, THRESHOLD)
    truth_s = time.perf_counter() - t0
    out = {"corpus": name, "documents": len(texts), "mbytes": round(sum(map(len, texts)) / 1e6, 1),
           "truth_pairs": len(truth), "truth_seconds": round(truth_s, 2), "rounds": repeats}
    threads = numba.get_num_threads()
    methods = (("datasketch", run_datasketch, threads), ("ours_1_thread", run_ours, 1),
               (f"ours_{threads}_threads", run_ours, threads))
    seconds: dict[str, list[float]] = {label: [] for label, _, _ in methods}
    for _ in range(repeats):
        for label, run, n_threads in methods:
            numba.set_num_threads(n_threads)
            elapsed, pairs, clusters = run(texts)
            seconds[label].append(elapsed)
            precision, recall = precision_recall(pairs, truth)
            out[label] = {"pairs": len(pairs), "clusters": clusters, "precision": round(precision, 4),
                          "recall": round(recall, 4)}
    numba.set_num_threads(threads)
    for label, values in seconds.items():
        out[label].update(seconds=round(float(np.median(values)), 3), seconds_min=round(min(values), 3),
                          seconds_max=round(max(values), 3))
        if label != "datasketch":
            ratios = np.array(seconds["datasketch"]) / np.array(values)
            out[f"speedup_{label.removeprefix('ours_')}"] = {
                "median": round(float(np.median(ratios)), 1), "min": round(float(ratios.min()), 1),
                "max": round(float(ratios.max()), 1)}
    numba.set_num_threads(1)
    out["stages_1_thread"] = stage_profile(texts)
    numba.set_num_threads(threads)
    out[f"stages_{threads}_threads"] = stage_profile(texts)
    return out


# --------------------------------------------------------------------------- scale


def synthetic(n_docs: int, seed: int = 0, words_per_doc: int = 250, dup_share: float = 0.1
              ) -> tuple[list[str], list[tuple[int, int]]]:
    """~1 KB documents over a Zipf vocabulary; ``dup_share`` of them are near-copies of an earlier one."""
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i:x}" for i in range(50_000)], dtype=object)
    texts: list[str] = []
    planted: list[tuple[int, int]] = []
    chunk = 20_000
    for start in range(0, n_docs, chunk):
        m = min(chunk, n_docs - start)
        ids = np.minimum(rng.zipf(1.2, size=(m, words_per_doc)) - 1, len(vocab) - 1)
        rows = [list(vocab[r]) for r in ids]
        for k in range(m):
            i = start + k
            if i > 0 and rng.random() < dup_share:
                src = int(rng.integers(max(0, i - 50_000), i))
                words = texts[src].split(" ")
                for pos in rng.choice(len(words), size=int(rng.integers(1, 4)), replace=False):
                    words[pos] = f"edit{rng.integers(1 << 30):x}"
                texts.append(" ".join(words))
                planted.append((src, i))
            else:
                texts.append(" ".join(rows[k]))
    return texts, planted


def scale_worker(n_docs: int) -> dict:
    texts, planted = synthetic(n_docs)
    warm_up()
    rss_before = _peak_rss_mb()
    elapsed, pairs, clusters = run_ours(texts)
    peak = _peak_rss_mb()
    truth = {p for p in planted if _jaccard(texts[p[0]], texts[p[1]]) >= THRESHOLD}
    found = len(truth & pairs)
    return {"documents": n_docs, "mbytes": round(sum(map(len, texts)) / 1e6, 1), "seconds": round(elapsed, 2),
            "docs_per_second": round(n_docs / elapsed), "peak_rss_mb": round(peak),
            "rss_before_dedup_mb": round(rss_before), "planted_pairs_at_threshold": len(truth),
            "recall": round(found / len(truth), 4) if truth else 1.0, "pairs_found": len(pairs), "clusters": clusters}


def _peak_rss_mb() -> float:
    """VmHWM of this process image (ru_maxrss would include the forking parent's peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _jaccard(a: str, b: str) -> float:
    sa, sb = shingles(a), shingles(b)
    return len(sa & sb) / len(sa | sb)


def bench_scale(sizes: list[int]) -> list[dict]:
    rows = []
    for n in sizes:
        out = subprocess.run([sys.executable, __file__, "--scale-worker", str(n)], capture_output=True, text=True,
                             check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        row = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"scale {n:>9,} docs: {row['seconds']:7.2f} s  {row['docs_per_second']:>8,} docs/s  "
              f"peak RSS {row['peak_rss_mb']:,} MB  recall {row['recall']:.4f}", flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke sizes: 400 real files, 20k synthetic docs")
    parser.add_argument("--sizes", type=int, nargs="*", help="synthetic corpus sizes (default 100000 300000 1000000)")
    parser.add_argument("--real-docs", type=int, help="cap on real-corpus files (default: all)")
    parser.add_argument("--repeats", type=int, help="interleaved timed rounds on the real corpus (default 5)")
    parser.add_argument("--scale-worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scale_worker:
        print(json.dumps(scale_worker(args.scale_worker)))
        return
    sizes = args.sizes if args.sizes is not None else ([20_000] if args.quick else [100_000, 300_000, 1_000_000])
    real = bench_real(args.real_docs or (400 if args.quick else None), args.repeats or (1 if args.quick else 5))
    print(f"real corpus: {real['corpus']}, {real['documents']} docs ({real['mbytes']} MB), "
          f"{real['truth_pairs']} pairs with Jaccard >= {THRESHOLD}; {real['rounds']} interleaved rounds")
    for name, r in real.items():
        if isinstance(r, dict) and "seconds" in r:
            print(f"  {name:16s} median {r['seconds']:7.3f} s (range {r['seconds_min']:.3f}-{r['seconds_max']:.3f})  "
                  f"precision {r['precision']:.4f}  recall {r['recall']:.4f}  pairs {r['pairs']}  clusters {r['clusters']}")
    for name, r in real.items():
        if name.startswith("speedup"):
            print(f"  {name} median {r['median']}x (range {r['min']}-{r['max']}x over rounds)")
        elif name.startswith("stages"):
            print(f"  {name}: " + "  ".join(f"{k} {v}" for k, v in r.items()), flush=True)
    scale = bench_scale(sizes)
    if len(scale) >= 2:
        first, last = scale[0], scale[-1]
        growth = (last["seconds"] / first["seconds"]) / (last["documents"] / first["documents"])
    else:
        growth = None
    print("RESULT " + json.dumps({"benchmark": "dedup", "threads": numba.get_num_threads(),
                                  "real": real, "scale": scale, "time_growth_vs_linear": growth}))


if __name__ == "__main__":
    main()
