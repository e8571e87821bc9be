"""Near-duplicate detection: ``data_engine.dedup`` (Numba) against datasketch, and at scale.

    .venv/bin/python benchmarks/dedup.py              # code + prose corpora, 5 rounds, 100k and 1M synthetic
    .venv/bin/python benchmarks/dedup.py --quick      # smoke: 4 MB per corpus, 1 round, 20k synthetic
    .venv/bin/python benchmarks/dedup.py --sizes      # real corpora only

Part 1, two real corpora of different kinds, read from this disk (no download):

- ``code``: the Python standard library's ``*.py`` files (``sysconfig`` ``stdlib``, no site-packages);
- ``prose``: the text documents under ``/usr/share/doc`` (READMEs, copyright/licence texts,
  changelogs, NEWS; ``*.gz`` decompressed; no HTML/JS/CSS/images) and the ``*.md`` / ``*.rst`` /
  ``*.txt`` files of the venv's site-packages.

Files of 1-128 KB that decode as UTF-8, exact copies collapsed, taken in a fixed pseudo-random
order (BLAKE2b of the path) up to ``--mbytes`` MB each. Then near-duplicates are planted: 10 % of
the documents get a copy with word edits (replace / delete / insert at 0.2-3 % of the words,
whitespace kept) or with its last 5-15 % of words cut. Both methods get the same shingles (word
5-grams of the ASCII-lower-cased bytes). Ground truth: every pair with exact Jaccard >= 0.8 (prefix-filtering all-pairs
join, exact, no sampling), which also holds the corpora's own near-duplicates (licence texts,
copied modules). Cluster-level precision / recall: pair counting over clusters (a pair of
documents is "together" when both sit in one cluster); truth clusters are the connected
components of the truth pairs. datasketch (``MinHash(num_perm=128)`` + ``update_batch``,
``MinHashLSH(threshold=0.8)``, its default b=9, r=13) reports its LSH query results unverified;
ours verifies every candidate exactly. Both are timed text -> clusters.

Timing: 5 rounds; each runs datasketch, ours on 1 Numba thread and ours on N threads back to
back, the order reversed every other round; the speedup is the per-round ratio, reported as
median and range, with the load average before and after.

Part 2, scale: synthetic 1,000-byte documents (200 Zipf-distributed 4-character tokens)
with 10 % planted near-copies (1-3 words substituted), each size in its own process on 2 Numba
threads; peak RSS is VmHWM reset after generation, so it covers dedup with the corpus resident.
Precision / recall: exact Python Jaccard on 5,000 sampled reported pairs and 5,000 planted pairs.

Prints ``RESULT {json}`` last.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import sysconfig
import time
from collections import Counter, defaultdict
from pathlib import Path

import numba
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from training_assets.data_engine import dedup  # noqa: E402

THRESHOLD, NUM_PERM, NGRAM = 0.8, 128, 5
NOT_PROSE = {".html", ".htm", ".js", ".css", ".json", ".svg", ".png", ".jpg", ".gif", ".pdf", ".ico", ".xml"}


def shingles(text: str, n: int = NGRAM) -> set[bytes]:
    """The definition both methods use: word n-grams of the ASCII-lower-cased UTF-8 bytes."""
    words = text.encode("utf-8").lower().split()
    if not words:
        return set()
    if len(words) < n:
        return {b" ".join(words)}
    return {b" ".join(words[i:i + n]) for i in range(len(words) - n + 1)}


def exact_pairs(sets: list[set[bytes]], threshold: float) -> set[tuple[int, int]]:
    """All pairs with Jaccard >= threshold by prefix filtering (AllPairs, Bayardo et al. 2007):
    tokens ordered rare-first, each set indexed by its first |x| - ceil(t|x|) + 1 tokens; any
    qualifying pair shares a prefix token."""
    freq: Counter[bytes] = Counter(tok for s in sets for tok in s)
    rank = {tok: i for i, tok in enumerate(sorted(freq, key=lambda t: (freq[t], t)))}
    ordered = [sorted(rank[t] for t in s) for s in sets]
    index: dict[int, list[int]] = defaultdict(list)
    found = set()
    for i in sorted(range(len(sets)), key=lambda i: len(ordered[i])):
        x = ordered[i]
        if not x:
            continue
        candidates = set()
        for tok in x[:len(x) - math.ceil(threshold * len(x)) + 1]:
            candidates.update(j for j in index[tok] if len(ordered[j]) >= threshold * len(x))
            index[tok].append(i)
        for j in candidates:
            inter = len(sets[i] & sets[j])
            if inter / (len(sets[i]) + len(sets[j]) - inter) >= threshold:
                found.add((min(i, j), max(i, j)))
    return found


def components(n: int, pairs) -> np.ndarray:
    """Cluster label (smallest member) of each of ``n`` items under the edges ``pairs``."""
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in pairs:
        ra, rb = find(a), find(b)
        parent[max(ra, rb)] = min(ra, rb)
    return np.array([find(i) for i in range(n)])


def cluster_precision_recall(found: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """Pair-counting precision / recall of clustering ``found`` against ``truth`` (labels per item)."""
    def together(counts) -> int:
        return sum(c * (c - 1) // 2 for c in counts)
    both = together(Counter(zip(found.tolist(), truth.tolist(), strict=True)).values())
    in_found, in_truth = together(Counter(found.tolist()).values()), together(Counter(truth.tolist()).values())
    return (both / in_found if in_found else 1.0), (both / in_truth if in_truth else 1.0)


# --------------------------------------------------------------------------- the two methods


def run_datasketch(texts: list[str]) -> tuple[float, float, np.ndarray]:
    """-> (wall seconds, process CPU seconds, cluster label per text)."""
    from datasketch import MinHash, MinHashLSH

    start, cpu = time.perf_counter(), time.process_time()
    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM)
    sketches = []
    for i, text in enumerate(texts):
        m = MinHash(num_perm=NUM_PERM)
        m.update_batch(list(shingles(text)))
        sketches.append(m)
        lsh.insert(i, m)
    pairs = {(min(i, j), max(i, j)) for i, m in enumerate(sketches) for j in lsh.query(m) if j != i}
    labels = components(len(texts), pairs)
    return time.perf_counter() - start, time.process_time() - cpu, labels


def run_ours(texts: list[str]) -> tuple[float, float, np.ndarray, dedup.DedupResult]:
    """-> (wall seconds, process CPU seconds (all threads), cluster label per text, the result)."""
    # Fresh string objects, so nothing the corpus loader cached on them helps ours.
    records = [{"id": str(i), "text": t.encode("utf-8").decode("utf-8")} for i, t in enumerate(texts)]
    start, cpu = time.perf_counter(), time.process_time()
    result = dedup(records, threshold=THRESHOLD, num_perm=NUM_PERM, ngram=NGRAM)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    labels = np.arange(len(texts))
    for rep, members in result.clusters.items():
        labels[[int(m) for m in members]] = int(rep)
    return elapsed, cpu, labels, result


def warm_up() -> None:
    """Load every kernel from Numba's cache (or compile it) outside the timed region."""
    base = [f"word{i}" for i in range(60)]
    docs = [" ".join(base), " ".join(base), " ".join(base[:59] + ["other"]),
            " ".join(["x"] + base[1:30] + ["y"] + base[31:]), " ".join(reversed(base)), ""]
    for _ in range(2):
        dedup([{"id": str(i), "text": t} for i, t in enumerate(docs)], threshold=THRESHOLD)


# --------------------------------------------------------------------------- real corpora


def _files(kind: str) -> list[Path]:
    if kind == "code":
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        return [p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts]
    site = Path(np.__file__).resolve().parents[1]  # the venv's real site-packages (the overlay has none)
    docs = [p for p in Path("/usr/share/doc").rglob("*")
            if Path(p.name.removesuffix(".gz")).suffix.lower() not in NOT_PROSE]
    return docs + [p for ext in ("md", "rst", "txt") for p in site.rglob(f"*.{ext}")]


def real_corpus(kind: str, mbytes: float, seed: int = 0) -> tuple[list[str], int]:
    """-> (texts: the distinct files, then the planted copies appended; number of planted copies)."""
    paths = sorted((p for p in _files(kind) if p.is_file() and not p.is_symlink()),
                   key=lambda p: hashlib.blake2b(str(p).encode(), digest_size=8).digest())
    texts, seen, size = [], set(), 0
    for path in paths:
        raw = path.read_bytes()
        raw = gzip.decompress(raw) if path.name.endswith(".gz") else raw
        if not 1024 <= len(raw) <= 128 * 1024 or raw in seen:
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        seen.add(raw)
        texts.append(text)
        size += len(raw)
        if size >= mbytes * 1e6:
            break
    rng = np.random.default_rng(seed)
    planted = 0
    for src in rng.choice(len(texts), size=len(texts) // 10, replace=False).tolist():
        parts = re.split(r"(\s+)", texts[src])  # words at even positions, the whitespace kept
        words = [i for i in range(0, len(parts), 2) if parts[i]]
        if rng.random() < 0.25:  # cut the last 5-15 % of the words
            keep = words[max(0, int(len(words) * (1 - rng.uniform(0.05, 0.15))) - 1)]
            parts = parts[:keep + 1]
        else:
            for pos in rng.choice(words, size=max(1, int(len(words) * rng.uniform(0.002, 0.03))), replace=False):
                op, new = rng.random(), f"edit{rng.integers(1 << 40):x}"
                parts[pos] = new if op < 0.5 else "" if op < 0.75 else f"{parts[pos]} {new}"
        text = "".join(parts)
        if text != texts[src]:
            texts.append(text)
            planted += 1
    return texts, planted


def stage_seconds(texts: list[str]) -> dict[str, float]:
    """Seconds per stage of one ``dedup`` call (its own timings)."""
    records = [{"id": str(i), "text": t} for i, t in enumerate(texts)]
    timings: dict[str, float] = {}
    dedup(records, threshold=THRESHOLD, num_perm=NUM_PERM, ngram=NGRAM, timings=timings)
    return {k: round(v, 4) for k, v in timings.items()}


def bench_real(kind: str, mbytes: float, rounds: int) -> dict:
    texts, planted = real_corpus(kind, mbytes)
    t0 = time.perf_counter()
    truth_pairs = exact_pairs([shingles(t) for t in texts], THRESHOLD)
    truth = components(len(texts), truth_pairs)
    out = {"documents": len(texts), "planted_copies": planted, "mbytes": round(sum(map(len, texts)) / 1e6, 1),
           "truth_pairs": len(truth_pairs), "truth_clusters_of_2_or_more": int(sum(
               c > 1 for c in Counter(truth.tolist()).values())), "truth_seconds": round(time.perf_counter() - t0, 1),
           "rounds": rounds, "loadavg_before": os.getloadavg()}
    threads = numba.get_num_threads()
    methods = [("datasketch", threads), ("ours_1_thread", 1), (f"ours_{threads}_threads", threads)]
    seconds: dict[str, list[float]] = {label: [] for label, _ in methods}
    cpu_seconds: dict[str, list[float]] = {label: [] for label, _ in methods}
    for r in range(rounds):
        for label, n_threads in (methods if r % 2 == 0 else methods[::-1]):
            numba.set_num_threads(n_threads)
            if label == "datasketch":
                elapsed, cpu, labels = run_datasketch(texts)
            else:
                elapsed, cpu, labels, result = run_ours(texts)
                out["verified_pairs"] = result.stats["verified_pairs"]
                out["candidate_pairs"] = result.stats["candidate_pairs"]
            seconds[label].append(elapsed)
            cpu_seconds[label].append(cpu)
            precision, recall = cluster_precision_recall(labels, truth)
            out[label] = {"cluster_precision": round(precision, 4), "cluster_recall": round(recall, 4),
                          "clusters": len(set(labels.tolist()))}
    out["loadavg_after"] = os.getloadavg()
    for label, values in seconds.items():
        out[label].update(seconds=round(float(np.median(values)), 4), seconds_min=round(min(values), 4),
                          seconds_max=round(max(values), 4), cpu_seconds=round(float(np.median(cpu_seconds[label])), 4))
        if label != "datasketch":
            ratios = np.array(seconds["datasketch"]) / np.array(values)
            cpu_ratios = np.array(cpu_seconds["datasketch"]) / np.array(cpu_seconds[label])
            out[f"speedup_{label.removeprefix('ours_')}"] = {
                "median": round(float(np.median(ratios)), 1), "min": round(float(ratios.min()), 1),
                "max": round(float(ratios.max()), 1), "cpu_median": round(float(np.median(cpu_ratios)), 1)}
    for n_threads in (1, threads):
        numba.set_num_threads(n_threads)
        out[f"stages_{n_threads}_thread{'s' if n_threads > 1 else ''}"] = stage_seconds(texts)
    numba.set_num_threads(threads)
    return out


# --------------------------------------------------------------------------- scale


def synthetic(n_docs: int, seed: int = 0, words: int = 200, dup_share: float = 0.1, vocab: int = 50_000
              ) -> tuple[list[str], list[tuple[int, int]]]:
    """~1 KB documents of 200 four-character tokens (Zipf(1.2) ids over a 50,000-word vocabulary,
    drawn through a 2^22-entry inverse-CDF table), built with NumPy as bytes; ``dup_share`` of
    them are near-copies (1-3 tokens replaced by out-of-vocabulary ones) of an earlier document
    of the same 20k block. -> (texts, planted (source, copy) pairs)."""
    rng = np.random.default_rng(seed)
    alphabet = np.frombuffer(b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", np.uint8)

    def token_bytes(ids: np.ndarray) -> np.ndarray:
        return alphabet[(ids[..., None] // 62 ** np.arange(4)) % 62]

    table = token_bytes(np.arange(vocab))  # uint8[vocab, 4]
    cdf = np.cumsum(1.0 / np.arange(1, vocab + 1) ** 1.2)
    inverse = np.searchsorted(cdf / cdf[-1], (np.arange(1 << 22) + 0.5) / (1 << 22))
    texts: list[str] = []
    planted: list[tuple[int, int]] = []
    block, width = 20_000, words * 5
    for start in range(0, n_docs, block):
        m = min(block, n_docs - start)
        buf = np.empty((m, words, 5), np.uint8)
        buf[:, :, :4] = table[inverse[rng.integers(0, 1 << 22, size=(m, words))]]
        buf[:, :, 4] = 32
        buf[:, -1, 4] = 10
        copies = np.nonzero(rng.random(m) < dup_share)[0]
        for k in copies[copies > 0].tolist():
            src = int(rng.integers(0, k))
            buf[k] = buf[src]
            edits = rng.choice(words, size=int(rng.integers(1, 4)), replace=False)
            buf[k, edits, :4] = token_bytes(rng.integers(vocab, 62 ** 4, size=len(edits)))  # out of vocabulary
            planted.append((start + src, start + k))
        big = buf.tobytes().decode("ascii")
        texts.extend(big[i * width:(i + 1) * width] for i in range(m))
    return texts, planted


def _jaccard(a: str, b: str) -> float:
    sa, sb = shingles(a), shingles(b)
    return len(sa & sb) / len(sa | sb)


def _vm(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def scale_worker(n_docs: int) -> dict:
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    t0 = time.perf_counter()
    texts, planted = synthetic(n_docs)
    gen_s = time.perf_counter() - t0
    warm_up()
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM: the peak from here on
    rss_before = _vm("VmRSS")
    timings: dict[str, float] = {}
    records = [{"id": str(i), "text": t} for i, t in enumerate(texts)]
    start, cpu = time.perf_counter(), time.process_time()
    result = dedup(records, threshold=THRESHOLD, num_perm=NUM_PERM, ngram=NGRAM, timings=timings)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    peak = _vm("VmHWM")
    rng = np.random.default_rng(1)
    pairs = result.pair_index
    sample = pairs[rng.choice(len(pairs), size=min(5000, len(pairs)), replace=False)] if len(pairs) else pairs
    precision = float(np.mean([_jaccard(texts[a], texts[b]) >= THRESHOLD for a, b in sample.tolist()])) \
        if len(sample) else 1.0
    found = {(int(a), int(b)) for a, b in pairs.tolist()}
    picked = [planted[i] for i in rng.choice(len(planted), size=min(5000, len(planted)), replace=False)]
    truth = [p for p in picked if _jaccard(texts[p[0]], texts[p[1]]) >= THRESHOLD]
    recall = sum(p in found for p in truth) / len(truth) if truth else 1.0
    return {"documents": n_docs, "mbytes": round(sum(map(len, texts)) / 1e6, 1), "threads": numba.get_num_threads(),
            "seconds": round(elapsed, 2), "cpu_seconds": round(cpu, 2), "docs_per_second": round(n_docs / elapsed), "peak_rss_mb": round(peak),
            "rss_before_dedup_mb": round(rss_before), "stages": {k: round(v, 3) for k, v in timings.items()},
            "sampled_precision": round(precision, 4), "sampled_recall": round(recall, 4),
            "sampled_planted_pairs_at_threshold": len(truth), "pairs_found": len(found),
            "clusters": len(result.clusters), "generate_seconds": round(gen_s, 1), "loadavg": os.getloadavg()}


def bench_scale(sizes: list[int]) -> list[dict]:
    rows = []
    for n in sizes:
        env = {**os.environ, "PYTHONPATH": str(REPO), "NUMBA_NUM_THREADS": os.environ.get("NUMBA_NUM_THREADS", "2")}
        out = subprocess.run([sys.executable, __file__, "--scale-worker", str(n)], capture_output=True, text=True,
                             check=True, env=env)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"scale {n:>9,} docs ({row['threads']} threads): {row['seconds']:6.2f} s (CPU {row['cpu_seconds']} s)  peak RSS "
              f"{row['peak_rss_mb']:,} MB  precision {row['sampled_precision']:.4f}  recall "
              f"{row['sampled_recall']:.4f}  stages {row['stages']}  load {row['loadavg']}", flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke: 4 MB per corpus, 1 round, 20k synthetic")
    parser.add_argument("--sizes", type=int, nargs="*", help="synthetic sizes (default 100000 1000000; none: skip)")
    parser.add_argument("--mbytes", type=float, help="MB per real corpus before planting (default 20)")
    parser.add_argument("--rounds", type=int, help="timed rounds per real corpus (default 5)")
    parser.add_argument("--scale-worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scale_worker:
        print(json.dumps(scale_worker(args.scale_worker)))
        return
    sizes = args.sizes if args.sizes is not None else ([20_000] if args.quick else [100_000, 1_000_000])
    mbytes, rounds = args.mbytes or (4 if args.quick else 20), args.rounds or (1 if args.quick else 5)
    warm_up()
    real = {}
    for kind in ("code", "prose"):
        r = real[kind] = bench_real(kind, mbytes, rounds)
        print(f"{kind}: {r['documents']} docs ({r['mbytes']} MB, {r['planted_copies']} planted copies), "
              f"{r['truth_pairs']} pairs with J >= {THRESHOLD}; {rounds} rounds; load {r['loadavg_before']} -> "
              f"{r['loadavg_after']}")
        for name, v in r.items():
            if isinstance(v, dict) and "seconds" in v:
                print(f"  {name:16s} median {v['seconds']:7.3f} s ({v['seconds_min']:.3f}-{v['seconds_max']:.3f})  "
                      f"cluster precision {v['cluster_precision']:.4f}  recall {v['cluster_recall']:.4f}")
            elif name.startswith("speedup"):
                print(f"  {name} median {v['median']}x ({v['min']}-{v['max']}x); CPU-time ratio {v['cpu_median']}x")
            elif name.startswith("stages"):
                print(f"  {name}: " + "  ".join(f"{k} {s}" for k, s in v.items()), flush=True)
    scale = bench_scale(sizes)
    print("RESULT " + json.dumps({"benchmark": "dedup", "threads": numba.get_num_threads(), "real": real,
                                  "scale": scale, "loadavg_end": os.getloadavg()}))


if __name__ == "__main__":
    main()
