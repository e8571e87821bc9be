"""Numba kernels for near-duplicate detection: shingle hashing, MinHash, LSH, hashed features.

All kernels work on a corpus laid out as one UTF-8 byte buffer ``data`` (uint8) plus document
offsets ``offsets`` (int64, length N+1; doc ``i`` is ``data[offsets[i]:offsets[i+1]]``), so
Python never touches a shingle. Variable-length per-document outputs come back in the same
CSR form: ``(out_offsets int64[N+1], values)``.

Hashes (the reference twins in ``kernels/reference.py`` compute the same bits):

- word hash: FNV-1a 64 over the word's bytes (ASCII upper case folded to lower), then the
  murmur3 ``fmix64`` finaliser;
- shingle hash of words ``w_i .. w_{i+n-1}``: ``fmix64((...(h(w_i)*P + h(w_{i+1}))*P ...) ^ n)``
  with wrapping 64-bit arithmetic. A document with fewer than ``n`` words has one shingle made
  of all its words; an empty document has none. Words are maximal runs of bytes other than
  ASCII whitespace (the caller's ``normalize`` maps Unicode whitespace to spaces);
- MinHash permutation ``k``: multiply-shift ``((a_k * x + b_k) mod 2^64) >> 32`` of the 32-bit
  fold ``x`` of the shingle hash (Dietzfelbinger et al. 1997, "A reliable randomized algorithm
  for the closest-pair problem"), with random 64-bit ``a_k`` (odd) and ``b_k``;
- band key of band ``j``: ``fmix64`` chain over the band's ``r`` signature values, seeded by ``j``.

Every kernel is deterministic: parallel loops write disjoint slices, never reduce across threads.
Only the kernels whose work grows with the corpus bytes or the shingle count run in parallel
(``prange``); the cheap per-pair or per-band ones stay serial, which also keeps compile time down.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

HASH_VERSION = 1  # bump when any hash below changes: stored signatures then count as stale
FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)
SHINGLE_PRIME = np.uint64(0x9E3779B97F4A7C15)  # golden-ratio odd constant: the polynomial base
EMPTY_MINHASH = np.uint32(0xFFFFFFFF)


@njit(cache=True, inline="always")
def fmix64(h):
    """murmur3 64-bit finaliser: every input bit flips each output bit with probability ~1/2."""
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> np.uint64(33)
    return h


@njit(cache=True, inline="always")
def _is_space(c):
    return c == 32 or (9 <= c <= 13)


@njit(cache=True)
def _count_words(data, start, end):
    n = 0
    inside = False
    for p in range(start, end):
        if _is_space(data[p]):
            inside = False
        elif not inside:
            inside = True
            n += 1
    return n


@njit(cache=True)
def _word_hashes(data, start, end, out):
    """Fill ``out`` with the hash of each word of ``data[start:end]``; returns the word count."""
    n = 0
    inside = False
    h = FNV_OFFSET
    for p in range(start, end):
        c = data[p]
        if _is_space(c):
            if inside:
                out[n] = fmix64(h)
                n += 1
                inside = False
        else:
            if not inside:
                inside = True
                h = FNV_OFFSET
            if 65 <= c <= 90:  # ASCII case folding: "The" and "the" are one word
                c += 32
            h ^= np.uint64(c)
            h *= FNV_PRIME
    if inside:
        out[n] = fmix64(h)
        n += 1
    return n


@njit(cache=True, inline="always")
def _shingle_count(words, ngram):
    if words == 0:
        return 0
    return max(words - ngram + 1, 1)


@njit(cache=True)
def _doc_shingles(data, start, end, ngram, n_words, out):
    """Write the (unsorted, possibly repeated) shingle hashes of one document into ``out``."""
    words = np.empty(n_words, np.uint64)
    _word_hashes(data, start, end, words)
    width = min(ngram, n_words)
    for i in range(out.shape[0]):
        s = np.uint64(0)
        for j in range(width):
            s = s * SHINGLE_PRIME + words[i + j]
        out[i] = fmix64(s ^ np.uint64(width))


@njit(cache=True, parallel=True)
def shingle_sets(data, starts, ends, ngram):
    """Sorted unique 64-bit word-``ngram`` shingle hashes of documents ``data[starts[i]:ends[i]]``.

    data: uint8[B], starts/ends: int64[N] -> (out_offsets int64[N+1], hashes uint64[S]).
    """
    n_docs = starts.shape[0]
    word_counts = np.empty(n_docs, np.int64)
    raw_counts = np.empty(n_docs, np.int64)
    for d in prange(n_docs):
        word_counts[d] = _count_words(data, starts[d], ends[d])
        raw_counts[d] = _shingle_count(word_counts[d], ngram)
    raw_offsets = np.zeros(n_docs + 1, np.int64)
    raw_offsets[1:] = np.cumsum(raw_counts)
    raw = np.empty(raw_offsets[n_docs], np.uint64)
    uniq_counts = np.zeros(n_docs, np.int64)
    for d in prange(n_docs):
        count = raw_counts[d]
        if count == 0:
            continue
        block = raw[raw_offsets[d]:raw_offsets[d] + count]
        _doc_shingles(data, starts[d], ends[d], ngram, word_counts[d], block)
        block.sort()
        u = 1
        for i in range(1, count):
            if block[i] != block[i - 1]:
                block[u] = block[i]
                u += 1
        uniq_counts[d] = u
    out_offsets = np.zeros(n_docs + 1, np.int64)
    out_offsets[1:] = np.cumsum(uniq_counts)
    # Compact in place, left to right (a destination never passes its source): no second
    # buffer, which at 1M documents is ~1.3 GB saved.
    for d in range(n_docs):
        base = raw_offsets[d]
        dst = out_offsets[d]
        if dst != base:
            for i in range(uniq_counts[d]):
                raw[dst + i] = raw[base + i]
    return out_offsets, raw[:out_offsets[n_docs]]


@njit(cache=True)
def shingle_hashes(data, offsets, ngram):
    """``shingle_sets`` of every document of a packed corpus (offsets: int64[N+1])."""
    return shingle_sets(data, offsets[:-1], offsets[1:], ngram)


@njit(cache=True, inline="always")
def _minhash_update(row, h, perm_a, perm_b):
    x = (h ^ (h >> np.uint64(32))) & np.uint64(0xFFFFFFFF)
    for k in range(row.shape[0]):
        v = (perm_a[k] * x + perm_b[k]) >> np.uint64(32)
        if v < row[k]:
            row[k] = v


@njit(cache=True, parallel=True)
def minhash_signatures(hash_offsets, hashes, perm_a, perm_b):
    """MinHash signature per document: uint32[N, P]; all 0xFFFFFFFF for a document with no shingles.

    ``sig[d, k] = min_x ((a_k * fold32(x) + b_k) mod 2^64) >> 32`` over the document's shingles x.
    P(sig[d1,k] == sig[d2,k]) approximates the Jaccard similarity of the two shingle sets
    (Broder 1997, "On the resemblance and containment of documents").
    """
    n_docs = hash_offsets.shape[0] - 1
    n_perm = perm_a.shape[0]
    sig = np.empty((n_docs, n_perm), np.uint32)
    for d in prange(n_docs):
        row = np.full(n_perm, np.uint64(0xFFFFFFFF), np.uint64)
        for i in range(hash_offsets[d], hash_offsets[d + 1]):
            _minhash_update(row, hashes[i], perm_a, perm_b)
        for k in range(n_perm):
            sig[d, k] = np.uint32(row[k])
    return sig


@njit(cache=True, parallel=True)
def minhash_from_text(data, offsets, ngram, perm_a, perm_b):
    """Fused shingling + MinHash, straight from the UTF-8 buffer: (uint32[N, P], n_words int64[N]).

    Equal to ``minhash_signatures(*shingle_hashes(data, offsets, ngram), ...)`` (MinHash ignores
    order and repeats, so no sort is needed): shingle sets are only materialised later, for the
    few documents that become LSH candidates.
    """
    n_docs = offsets.shape[0] - 1
    n_perm = perm_a.shape[0]
    sig = np.empty((n_docs, n_perm), np.uint32)
    n_words = np.empty(n_docs, np.int64)
    for d in prange(n_docs):
        start, end = offsets[d], offsets[d + 1]
        words = _count_words(data, start, end)
        n_words[d] = words
        block = np.empty(_shingle_count(words, ngram), np.uint64)
        _doc_shingles(data, start, end, ngram, words, block)
        row = np.full(n_perm, np.uint64(0xFFFFFFFF), np.uint64)
        for i in range(block.shape[0]):
            _minhash_update(row, block[i], perm_a, perm_b)
        for k in range(n_perm):
            sig[d, k] = np.uint32(row[k])
    return sig, n_words


@njit(cache=True)
def band_keys(signatures, bands, rows):
    """LSH band keys: uint64[N, bands]; two documents share bucket ``j`` iff rows ``j*r..j*r+r-1`` agree.

    Collision probability for Jaccard s is ``1 - (1 - s^r)^b`` (Leskovec et al., MMDS ch. 3.4).
    """
    n_docs = signatures.shape[0]
    keys = np.empty((n_docs, bands), np.uint64)
    for d in range(n_docs):
        for j in range(bands):
            h = fmix64(np.uint64(j) + SHINGLE_PRIME)
            for i in range(j * rows, (j + 1) * rows):
                h = fmix64(h ^ np.uint64(signatures[d, i]))
            keys[d, j] = h
    return keys


@njit(cache=True)
def bucket_pairs(sorted_keys, order):
    """All pairs of documents sharing a key: int64[M, 2] with ``a < b``; a pair may repeat when it
    shares several buckets with different members.

    sorted_keys: uint64[K] (sorted), order: int64[K] document index of each key, ascending
    within equal keys. A bucket whose member list repeats one already seen (the same cluster
    colliding in many bands) is emitted once: near-identical groups would otherwise give each of
    their pairs once per band.
    """
    n = sorted_keys.shape[0]
    starts = np.empty(n, np.int64)
    ends = np.empty(n, np.int64)
    member_hash = np.empty(n, np.uint64)
    runs = 0
    i = 0
    while i < n:
        j = i + 1
        while j < n and sorted_keys[j] == sorted_keys[i]:
            j += 1
        if j - i >= 2:
            h = fmix64(np.uint64(j - i))
            for x in range(i, j):
                h = fmix64(h ^ np.uint64(order[x]))
            starts[runs], ends[runs], member_hash[runs] = i, j, h
            runs += 1
        i = j
    by_members = np.argsort(member_hash[:runs], kind="mergesort")
    keep = np.ones(runs, np.bool_)
    for r in range(1, runs):
        a, b = by_members[r - 1], by_members[r]
        if member_hash[a] == member_hash[b] and ends[a] - starts[a] == ends[b] - starts[b]:
            same = True
            for x in range(ends[a] - starts[a]):
                if order[starts[a] + x] != order[starts[b] + x]:
                    same = False
                    break
            if same:
                keep[b] = False
    total = 0
    for r in range(runs):
        if keep[r]:
            m = ends[r] - starts[r]
            total += m * (m - 1) // 2
    pairs = np.empty((total, 2), np.int64)
    p = 0
    for r in range(runs):
        if not keep[r]:
            continue
        for x in range(starts[r], ends[r]):
            for y in range(x + 1, ends[r]):
                a, b = order[x], order[y]
                if a == b:
                    continue
                pairs[p, 0] = min(a, b)
                pairs[p, 1] = max(a, b)
                p += 1
    return pairs[:p]


@njit(cache=True, parallel=True)
def jaccard_pairs(pairs, hash_offsets, hashes):
    """Exact Jaccard of the sorted unique shingle sets of each pair: float64[M] (0 for two empty sets)."""
    n = pairs.shape[0]
    out = np.zeros(n, np.float64)
    for p in prange(n):
        a, b = pairs[p, 0], pairs[p, 1]
        i, i_end = hash_offsets[a], hash_offsets[a + 1]
        j, j_end = hash_offsets[b], hash_offsets[b + 1]
        union = (i_end - i) + (j_end - j)
        inter = 0
        while i < i_end and j < j_end:
            if hashes[i] == hashes[j]:
                inter += 1
                i += 1
                j += 1
            elif hashes[i] < hashes[j]:
                i += 1
            else:
                j += 1
        union -= inter
        out[p] = inter / union if union > 0 else 0.0
    return out


@njit(cache=True)
def signature_agreement(pairs, signatures):
    """Share of signature positions on which each pair agrees: float64[M] (the MinHash Jaccard
    estimate, or the hyperplane estimate of 1 - angle/pi)."""
    n = pairs.shape[0]
    n_perm = signatures.shape[1]
    out = np.empty(n, np.float64)
    for p in range(n):
        a, b = pairs[p, 0], pairs[p, 1]
        same = 0
        for k in range(n_perm):
            if signatures[a, k] == signatures[b, k]:
                same += 1
        out[p] = same / n_perm
    return out


@njit(cache=True)
def _find(parent, x):
    while parent[x] != x:
        parent[x] = parent[parent[x]]  # path halving
        x = parent[x]
    return x


@njit(cache=True)
def union_find(n_items, edges):
    """Connected components of ``edges`` (int64[M, 2]): each item's root is the smallest index in its component."""
    parent = np.arange(n_items)
    for e in range(edges.shape[0]):
        ra = _find(parent, edges[e, 0])
        rb = _find(parent, edges[e, 1])
        if ra < rb:
            parent[rb] = ra
        elif rb < ra:
            parent[ra] = rb
    for x in range(n_items):
        parent[x] = _find(parent, x)
    return parent


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


@njit(cache=True)
def contains_any(hash_offsets, hashes, index):
    """For each document, the position in ``index`` (sorted uint64) of its first shingle found there, else -1."""
    n_docs = hash_offsets.shape[0] - 1
    out = np.full(n_docs, -1, np.int64)
    n_index = index.shape[0]
    for d in range(n_docs):
        for i in range(hash_offsets[d], hash_offsets[d + 1]):
            pos = np.searchsorted(index, hashes[i])
            if pos < n_index and index[pos] == hashes[i]:
                out[d] = pos
                break
    return out
