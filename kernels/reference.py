"""Plain Python/NumPy twins of the dedup kernels in ``kernels/dedup.py``, for parity tests.

Written for clarity, not speed: each function states the kernel's definition directly
(``bytes.split`` for words, Python sets for shingles, ``itertools.combinations`` for buckets), so
a test that compares them checks the kernel against the definition, not against itself.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

MASK64 = (1 << 64) - 1
FNV_OFFSET = 0xCBF29CE484222325
WORD_MULT = 0xC2B2AE3D27D4EB4F
SHINGLE_PRIME = 0x9E3779B97F4A7C15
ASCII_WHITESPACE = b" \t\n\v\f\r"


def fmix64(h: int) -> int:
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & MASK64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & MASK64
    h ^= h >> 33
    return h


def word_hash(word: bytes) -> int:
    folded = word.lower()  # bytes.lower folds ASCII only, like the kernel
    h = FNV_OFFSET
    for i in range(0, len(folded), 8):
        h = ((h ^ int.from_bytes(folded[i:i + 8], "big")) * WORD_MULT) & MASK64
    return fmix64(h ^ len(folded))


def words(doc: bytes) -> list[bytes]:
    return doc.split()  # bytes.split() splits on runs of ASCII whitespace


def shingle_set(doc: bytes, ngram: int) -> set[int]:
    hashes = [word_hash(w) for w in words(doc)]
    if not hashes:
        return set()
    width = min(ngram, len(hashes))
    out = set()
    for i in range(max(len(hashes) - ngram + 1, 1)):
        s = 0
        for h in hashes[i:i + width]:
            s = (s * SHINGLE_PRIME + h) & MASK64
        out.add(fmix64(s ^ width))
    return out


def shingle_hashes(docs: list[bytes], ngram: int) -> tuple[np.ndarray, np.ndarray]:
    sets = [sorted(shingle_set(d, ngram)) for d in docs]
    offsets = np.zeros(len(docs) + 1, np.int64)
    offsets[1:] = np.cumsum([len(s) for s in sets])
    return offsets, np.array([h for s in sets for h in s], np.uint64)


def oph_salt(seed: int) -> int:
    return fmix64((seed % (1 << 64)) ^ SHINGLE_PRIME)


def minhash_signatures(shingle_sets: list[set[int]], n_bins: int, seed: int) -> np.ndarray:
    """One-permutation hashing with optimal densification, written from the definition: bin k
    holds the smallest low-32-bit value among the shingles whose re-mixed hash falls in bin k;
    an empty bin takes the value of the first non-empty bin on its probe sequence."""
    salt = oph_salt(seed)

    def bin_of(y: int) -> int:
        return ((y >> 32) * n_bins) >> 32

    sig = np.full((len(shingle_sets), n_bins), 0xFFFFFFFF, np.uint32)
    for d, shingles in enumerate(shingle_sets):
        if not shingles:
            continue
        bins: dict[int, int] = {}
        for x in shingles:
            y = fmix64(x ^ salt)
            bins[bin_of(y)] = min(bins.get(bin_of(y), 1 << 32), y & 0xFFFFFFFF)
        for k in range(n_bins):
            attempt = 0
            src = k
            while src not in bins:
                attempt += 1
                src = bin_of(fmix64((salt + (k + 1) * SHINGLE_PRIME + attempt) & MASK64))
            sig[d, k] = bins[src]
    return sig


def band_keys(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    keys = np.empty((signatures.shape[0], bands), np.uint64)
    for d in range(signatures.shape[0]):
        for j in range(bands):
            h = fmix64((j + SHINGLE_PRIME) & MASK64)
            for value in signatures[d, j * rows:(j + 1) * rows].tolist():
                h = fmix64(h ^ value)
            keys[d, j] = h
    return keys


def lsh_candidates(keys: np.ndarray, nonempty: np.ndarray) -> list[tuple[int, int]]:
    """Sorted pairs (a < b) of non-empty documents sharing a key in some band (column of ``keys``)."""
    found = set()
    for j in range(keys.shape[1]):
        buckets: dict[int, list[int]] = {}
        for doc in np.nonzero(nonempty)[0].tolist():
            buckets.setdefault(int(keys[doc, j]), []).append(doc)
        found |= {(a, b) for members in buckets.values() for a, b in itertools.combinations(sorted(members), 2)}
    return sorted(found)


def signature_agreement(pairs: np.ndarray, signatures: np.ndarray) -> np.ndarray:
    return np.array([float(np.mean(signatures[a] == signatures[b])) for a, b in pairs.tolist()])


def jaccard(a: set[int], b: set[int]) -> float:
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def union_find(n_items: int, edges: list[tuple[int, int]]) -> np.ndarray:
    """Component label of each item = the smallest item index in its component (graph search)."""
    neighbours: dict[int, list[int]] = {i: [] for i in range(n_items)}
    for a, b in edges:
        neighbours[a].append(b)
        neighbours[b].append(a)
    label = np.full(n_items, -1, np.int64)
    for start in range(n_items):
        if label[start] >= 0:
            continue
        stack, component = [start], []
        label[start] = start
        while stack:
            x = stack.pop()
            component.append(x)
            for y in neighbours[x]:
                if label[y] < 0:
                    label[y] = start
                    stack.append(y)
    return label


def hashed_features(docs: list[bytes], n_features: int) -> list[dict[int, float]]:
    out = []
    for doc in docs:
        counts: dict[int, int] = {}
        for w in words(doc):
            f = word_hash(w) % n_features
            counts[f] = counts.get(f, 0) + 1
        weights = {f: 1.0 + math.log(c) for f, c in counts.items()}
        norm = math.sqrt(sum(w * w for w in weights.values()))
        out.append({f: w / norm for f, w in sorted(weights.items())})
    return out


def hyperplane_signatures(vectors: list[dict[int, float]], n_bits: int, seed: int) -> np.ndarray:
    bits = np.zeros((len(vectors), n_bits), np.uint32)
    for d, vec in enumerate(vectors):
        if not vec:
            continue
        for k in range(n_bits):
            acc = 0.0
            for f, w in vec.items():
                sign = fmix64((f * SHINGLE_PRIME + seed + k) & MASK64) & 1
                acc += w if sign else -w
            bits[d, k] = 1 if acc >= 0.0 else 0
    return bits


def cosine(a: dict[int, float], b: dict[int, float]) -> float:
    return sum(w * b[f] for f, w in a.items() if f in b)


def contains_any(shingle_sets: list[set[int]], index: set[int]) -> list[bool]:
    return [bool(s & index) for s in shingle_sets]


def content_hash(doc: bytes) -> int:
    lanes = [FNV_OFFSET + lane for lane in range(4)]
    for i in range(0, len(doc), 8):
        lane = (i // 8) % 4
        lanes[lane] = ((lanes[lane] ^ int.from_bytes(doc[i:i + 8], "little")) * WORD_MULT) & MASK64
    h = lanes[0]
    for lane in lanes[1:]:
        h = ((h ^ fmix64(lane)) * WORD_MULT) & MASK64
    return fmix64(h ^ len(doc))


def exact_roots(docs: list[bytes]) -> np.ndarray:
    first: dict[bytes, int] = {}
    return np.array([first.setdefault(d, i) for i, d in enumerate(docs)], np.int64)
