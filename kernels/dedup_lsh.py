"""Dedup kernels, part 3: LSH candidate pairs, exact Jaccard verification, union-find and
the decontamination lookup."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .threads import launch

launch()  # Numba's pool, started with OpenMP nesting off (kernels/threads.py)


@njit(cache=True, parallel=True)
def lsh_candidates(keys, nonempty):
    """Candidate pairs from LSH band keys: every pair of non-empty documents that share a key in
    some band, once: int64[M, 2] with ``a < b``, sorted.

    keys: uint64[N, bands] (``band_keys``), nonempty: bool[N]. Per band, the documents are
    grouped by key with a counting sort on the keys' top bits (keys are uniform hashes: about
    eight documents per top-bits value, so this is O(N) where a comparison sort of 64-bit keys is
    O(N log N)) and an insertion sort by full key inside each top-bits group; runs of equal keys
    are buckets. Then, for each document ``a``, the members ``b > a`` of its buckets are
    collected with a "last seen by" mark per document, so a pair shared by many bands costs one
    visit per band and no pair list is ever sorted or deduplicated.
    Cost: O(bands * N + sum over buckets of size^2).
    """
    n_docs, bands = keys.shape
    docs = np.nonzero(nonempty)[0]
    n_keys = docs.shape[0]
    if n_keys >= 2**31:
        raise ValueError("lsh_candidates: more than 2^31 - 1 documents; split the corpus into partitions")
    bits = 1  # about eight documents per top-bits group: the counts stay cache-sized
    while (np.int64(8) << bits) < n_keys and bits < 24:
        bits += 1
    shift = np.uint64(64 - bits)
    # Per band j: members[j] lists the documents grouped by key; a document in a bucket of two
    # or more has that bucket's range in members[j] as [bucket_start, bucket_end), else -1.
    members = np.empty((bands, n_keys), np.int64)
    bucket_start = np.full((n_docs, bands), -1, np.int32)  # int32: half the memory at 10^6 docs
    bucket_end = np.full((n_docs, bands), -1, np.int32)
    for j in prange(bands):
        column = np.empty(n_keys, np.uint64)
        for x in range(n_keys):
            column[x] = keys[docs[x], j]
        sorted_keys = np.empty(n_keys, np.uint64)
        _group_by_top_bits(column, docs, bits, sorted_keys, members[j])
        lo = 0
        while lo < n_keys:
            hi = lo + 1
            top = sorted_keys[lo] >> shift
            while hi < n_keys and sorted_keys[hi] >> shift == top:
                hi += 1
            for x in range(lo + 1, hi):  # insertion sort by full key inside the group
                key, doc = sorted_keys[x], members[j, x]
                y = x - 1
                while y >= lo and sorted_keys[y] > key:
                    sorted_keys[y + 1] = sorted_keys[y]
                    members[j, y + 1] = members[j, y]
                    y -= 1
                sorted_keys[y + 1] = key
                members[j, y + 1] = doc
            i = lo
            while i < hi:
                e = i + 1
                while e < hi and sorted_keys[e] == sorted_keys[i]:
                    e += 1
                if e - i >= 2:
                    for x in range(i, e):
                        bucket_start[members[j, x], j] = i
                        bucket_end[members[j, x], j] = e
                i = e
            lo = hi
    mark = np.full(n_docs, -1, np.int64)
    total = 0
    for a in range(n_docs):
        for j in range(bands):
            for x in range(bucket_start[a, j], bucket_end[a, j]):
                b = members[j, x]
                if b > a and mark[b] != a:
                    mark[b] = a
                    total += 1
    first_doc = np.empty(total, np.int64)
    second_doc = np.empty(total, np.int64)
    mark[:] = -1
    p = 0
    for a in range(n_docs):
        first = p
        for j in range(bands):
            for x in range(bucket_start[a, j], bucket_end[a, j]):
                b = members[j, x]
                if b > a and mark[b] != a:
                    mark[b] = a
                    first_doc[p] = a
                    second_doc[p] = b
                    p += 1
        second_doc[first:p].sort()
    pairs = np.empty((total, 2), np.int64)
    pairs[:, 0] = first_doc
    pairs[:, 1] = second_doc
    return pairs


@njit(cache=True)
def _group_by_top_bits(column, docs, bits, out_keys, out_docs):
    """Stable counting sort of ``column`` (with ``docs`` alongside) by the top ``bits`` bits,
    in two passes: the top (up to) 8 bits first, into 256 output streams (sequential writes the
    caches absorb), then the remaining bits inside each partition, whose few thousand values
    stay in cache. One pass over 2^17 groups scattered every write to a random cache line."""
    n = column.shape[0]
    high = min(bits, 8)
    low = bits - high
    shift_high = np.uint64(64 - high)
    shift_low = np.uint64(64 - bits)
    mask_low = np.uint64((1 << low) - 1)
    starts = np.zeros((1 << high) + 1, np.int64)
    for x in range(n):
        starts[(column[x] >> shift_high) + np.uint64(1)] += 1
    for g in range(1 << high):
        starts[g + 1] += starts[g]
    fill = starts[:-1].copy()
    tmp_keys = np.empty(n, np.uint64)
    tmp_docs = np.empty(n, np.int64)
    for x in range(n):
        g = column[x] >> shift_high
        tmp_keys[fill[g]] = column[x]
        tmp_docs[fill[g]] = docs[x]
        fill[g] += 1
    counts = np.zeros((1 << low) + 1, np.int64)
    for g in range(1 << high):
        lo, hi = starts[g], starts[g + 1]
        counts[:] = 0
        for x in range(lo, hi):
            counts[((tmp_keys[x] >> shift_low) & mask_low) + np.uint64(1)] += 1
        counts[0] = lo
        for c in range(1 << low):
            counts[c + 1] += counts[c]
        for x in range(lo, hi):
            c = (tmp_keys[x] >> shift_low) & mask_low
            out_keys[counts[c]] = tmp_keys[x]
            out_docs[counts[c]] = tmp_docs[x]
            counts[c] += 1


@njit(cache=True, parallel=True)
def jaccard_pairs(pairs, starts, ends, hashes, floor):
    """Jaccard similarity of the sets ``hashes[starts[d]:ends[d]]`` (distinct values) of each
    pair: float64[M]; exact whenever it is >= ``floor``, otherwise some value < ``floor`` (0 for
    two empty sets).

    For each run of pairs with the same first document ``a`` (pairs sorted by ``a`` make one run
    per document), ``a``'s set goes into an open-addressing table (linear probing on the top bits
    of the uniform hash, load <= 1/4); each partner ``b`` then probes its values. Probes are
    independent loads, so they pipeline, unlike a sorted merge whose every step waits on an
    unpredictable branch; and a run of ``k`` partners builds the table once. A partner stops as
    soon as it cannot reach ``floor``: |A & B| <= |B| - (values of B already missed), and the
    value returned then is that bound, J <= m / (|A| + |B| - m) < floor. ``floor = 0`` computes
    every Jaccard exactly.
    """
    n = pairs.shape[0]
    out = np.zeros(n, np.float64)
    if n == 0:
        return out
    run_starts = [0]
    for p in range(1, n):
        if pairs[p, 0] != pairs[p - 1, 0]:
            run_starts.append(p)
    run_starts.append(n)
    n_runs = len(run_starts) - 1
    runs = np.array(run_starts, np.int64)
    # Interleaved chunks: chunk c takes runs c, c + n_chunks, ..., so neighbouring runs (often
    # of similar, large documents) spread over the threads, which prange hands contiguous
    # ranges of chunks. One table per chunk, allocated and zeroed once for the chunk's largest
    # set, reused by its runs; results do not depend on the chunking.
    n_chunks = min(n_runs, 64)
    for c in prange(n_chunks):
        largest = 1
        for r in range(c, n_runs, n_chunks):
            a = pairs[runs[r], 0]
            largest = max(largest, ends[a] - starts[a])
        table = np.zeros(_table_size(largest), np.uint64)
        for r in range(c, n_runs, n_chunks):
            a = pairs[runs[r], 0]
            size_a = ends[a] - starts[a]
            slots = _table_size(size_a)
            mask = np.uint64(slots - 1)
            shift = np.uint64(64 - _log2(slots))
            has_zero = False  # 0 marks an empty slot, so a hash equal to 0 is kept aside
            for i in range(starts[a], ends[a]):
                x = hashes[i]
                if x == 0:
                    has_zero = True
                    continue
                slot = x >> shift
                while table[slot] != 0:
                    slot = (slot + np.uint64(1)) & mask
                table[slot] = x
            for p in range(runs[r], runs[r + 1]):
                b = pairs[p, 1]
                size_b = ends[b] - starts[b]
                total = size_a + size_b
                if total == 0:
                    continue
                # the smallest intersection that reaches the floor, I / (total - I) >= floor,
                # found with the same float expression as the result so the two never disagree
                need = min(np.int64(floor * total / (1.0 + floor)), total)
                while need > 0 and (need - 1) / (total - need + 1) >= floor:
                    need -= 1
                while need < total and need / (total - need) < floor:
                    need += 1
                spare = size_b - need  # misses B can afford
                misses = 0
                for t in range(starts[b], ends[b]):
                    y = hashes[t]
                    if y == 0:
                        found = has_zero
                    else:
                        slot = y >> shift
                        while table[slot] != y and table[slot] != 0:
                            slot = (slot + np.uint64(1)) & mask
                        found = table[slot] == y
                    if not found:
                        misses += 1
                        if misses > spare:
                            break
                best = min(size_a, size_b - misses)
                out[p] = best / (total - best)
            # Empty the table for the next run in O(|A|): walking from each value's home slot
            # to the end of its cluster zeroes every occupied slot (all of them hold A's values).
            for i in range(starts[a], ends[a]):
                slot = hashes[i] >> shift
                while table[slot] != 0:
                    table[slot] = 0
                    slot = (slot + np.uint64(1)) & mask
    return out


@njit(cache=True, inline="always")
def _log2(x):
    bits = 0
    while (np.int64(1) << bits) < x:
        bits += 1
    return bits


@njit(cache=True, inline="always")
def _table_size(n_values):
    """Open-addressing table slots for ``n_values``: a power of two >= 4 n (load <= 1/4)."""
    return np.int64(1) << max(_log2(4 * n_values), 4)


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
