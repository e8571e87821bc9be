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
FNV_PRIME = 0x100000001B3
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
    h = FNV_OFFSET
    for c in word.lower():  # bytes.lower folds ASCII only, like the kernel
        h = ((h ^ c) * FNV_PRIME) & MASK64
    return fmix64(h)


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


def minhash_signatures(shingle_sets: list[set[int]], perm_a: np.ndarray, perm_b: np.ndarray) -> np.ndarray:
    sig = np.full((len(shingle_sets), len(perm_a)), 0xFFFFFFFF, np.uint32)
    for d, shingles in enumerate(shingle_sets):
        for k, (a, b) in enumerate(zip(perm_a.tolist(), perm_b.tolist(), strict=True)):
            values = [(((a * ((x ^ (x >> 32)) & 0xFFFFFFFF) + b) & MASK64) >> 32) for x in shingles]
            if values:
                sig[d, k] = min(values)
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


def bucket_pairs(keys: np.ndarray, docs: np.ndarray) -> set[tuple[int, int]]:
    buckets: dict[int, list[int]] = {}
    for key, doc in zip(keys.tolist(), docs.tolist(), strict=True):
        buckets.setdefault(key, []).append(doc)
    return {(min(a, b), max(a, b)) for members in buckets.values()
            for a, b in itertools.combinations(members, 2) if a != b}


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
