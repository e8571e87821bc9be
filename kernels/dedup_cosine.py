"""Dedup kernels, part 4: the cosine method (hashing-vectorizer features, random-hyperplane
bits, exact cosine of candidate pairs)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .dedup_hash import SHINGLE_PRIME, _count_words, _word_hashes, fmix64
from .threads import launch

launch()  # Numba's pool, started with OpenMP nesting off (kernels/threads.py)


@njit(cache=True, parallel=True)
def hashed_features(data, offsets, n_features):
    """Hashing-vectorizer embedding (Weinberger et al. 2009): per document the sorted feature ids
    ``word_hash mod n_features`` with L2-normalised sublinear weights ``1 + ln(tf)``.

    -> (out_offsets int64[N+1], ids uint32[F], weights float32[F]).
    """
    n_docs = offsets.shape[0] - 1
    counts = np.empty(n_docs, np.int64)
    for d in prange(n_docs):
        counts[d] = _count_words(data, offsets[d], offsets[d + 1])
    raw_offsets = np.zeros(n_docs + 1, np.int64)
    raw_offsets[1:] = np.cumsum(counts)
    raw_ids = np.empty(raw_offsets[n_docs], np.uint32)
    raw_w = np.empty(raw_offsets[n_docs], np.float32)
    uniq = np.zeros(n_docs, np.int64)
    modulus = np.uint64(n_features)
    for d in prange(n_docs):
        count = counts[d]
        if count == 0:
            continue
        words = np.empty(count, np.uint64)
        _word_hashes(data, offsets[d], offsets[d + 1], words)
        ids = np.empty(count, np.uint32)
        for i in range(count):
            ids[i] = np.uint32(words[i] % modulus)
        ids.sort()
        base = raw_offsets[d]
        u = 0
        norm = 0.0
        i = 0
        while i < count:
            j = i + 1
            while j < count and ids[j] == ids[i]:
                j += 1
            w = 1.0 + np.log(j - i)
            raw_ids[base + u] = ids[i]
            raw_w[base + u] = w
            norm += w * w
            u += 1
            i = j
        inv = 1.0 / np.sqrt(norm)
        for i in range(u):
            raw_w[base + i] = np.float32(raw_w[base + i] * inv)
        uniq[d] = u
    out_offsets = np.zeros(n_docs + 1, np.int64)
    out_offsets[1:] = np.cumsum(uniq)
    out_ids = np.empty(out_offsets[n_docs], np.uint32)
    out_w = np.empty(out_offsets[n_docs], np.float32)
    for d in prange(n_docs):
        base, dst = raw_offsets[d], out_offsets[d]
        for i in range(uniq[d]):
            out_ids[dst + i] = raw_ids[base + i]
            out_w[dst + i] = raw_w[base + i]
    return out_offsets, out_ids, out_w


@njit(cache=True, parallel=True)
def hyperplane_signatures(feat_offsets, feat_ids, weights, n_bits, seed):
    """Random-hyperplane LSH bits (Charikar 2002): uint32[N, n_bits] of 0/1.

    Bit ``k`` is ``sign(sum_f w_f * R[k, f]) >= 0`` with Rademacher ``R[k, f]`` = low bit of
    ``fmix64(f * P + k + seed)``, so no projection matrix is stored. P(bit agrees) = 1 - angle/pi.
    """
    n_docs = feat_offsets.shape[0] - 1
    bits = np.zeros((n_docs, n_bits), np.uint32)
    s = np.uint64(seed)
    for d in prange(n_docs):
        acc = np.zeros(n_bits, np.float64)
        for i in range(feat_offsets[d], feat_offsets[d + 1]):
            base = np.uint64(feat_ids[i]) * SHINGLE_PRIME + s
            w = np.float64(weights[i])
            for k in range(n_bits):
                if fmix64(base + np.uint64(k)) & np.uint64(1):
                    acc[k] += w
                else:
                    acc[k] -= w
        if feat_offsets[d + 1] > feat_offsets[d]:
            for k in range(n_bits):
                bits[d, k] = 1 if acc[k] >= 0.0 else 0
    return bits


@njit(cache=True)
def cosine_pairs(pairs, feat_offsets, feat_ids, weights):
    """Cosine similarity of each pair's (already L2-normalised) hashed feature vectors: float64[M]."""
    n = pairs.shape[0]
    out = np.zeros(n, np.float64)
    for p in range(n):
        a, b = pairs[p, 0], pairs[p, 1]
        i, i_end = feat_offsets[a], feat_offsets[a + 1]
        j, j_end = feat_offsets[b], feat_offsets[b + 1]
        dot = 0.0
        while i < i_end and j < j_end:
            if feat_ids[i] == feat_ids[j]:
                dot += np.float64(weights[i]) * np.float64(weights[j])
                i += 1
                j += 1
            elif feat_ids[i] < feat_ids[j]:
                i += 1
            else:
                j += 1
        out[p] = dot
    return out
