"""Numba kernels for near-duplicate detection: shingle hashing, MinHash, LSH, hashed features.

All kernels work on a corpus laid out as one UTF-8 byte buffer ``data`` (uint8) plus document
offsets ``offsets`` (int64, length N+1; doc ``i`` is ``data[offsets[i]:offsets[i+1]]``), so
Python never touches a shingle. Variable-length per-document outputs come back in the same
CSR form: ``(out_offsets int64[N+1], values)``.

Hashes (the reference twins in ``kernels/reference.py`` compute the same bits):

- word hash: the word's bytes (ASCII upper case folded to lower) in big-endian 8-byte chunks,
  ``h = (h ^ chunk) * M`` from the FNV-1a offset basis, then ``fmix64(h ^ length)`` (murmur3's
  finaliser);
- shingle hash of words ``w_i .. w_{i+n-1}``: ``fmix64((...(h(w_i)*P + h(w_{i+1}))*P ...) ^ n)``
  with wrapping 64-bit arithmetic. A document with fewer than ``n`` words has one shingle made
  of all its words; an empty document has none. Words are maximal runs of bytes other than
  ASCII whitespace (the caller's ``normalize`` maps Unicode whitespace to spaces);
- MinHash: one-permutation hashing with optimal densification (``_oph_row``): the shingle
  hash re-mixed with the seed's salt picks one of ``P`` bins (high 32 bits) and is that bin's
  candidate minimum (low 32 bits); empty bins borrow along a seeded probe sequence;
- band key of band ``j``: ``fmix64`` chain over the band's ``r`` signature values, seeded by ``j``.

Every kernel is deterministic: parallel loops write disjoint slices, never reduce across threads.
Only the kernels whose work grows with the corpus bytes or the shingle count run in parallel
(``prange``); the cheap per-pair or per-band ones stay serial, which also keeps compile time down.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

HASH_VERSION = 2  # bump when any hash below changes: stored signatures then count as stale
FNV_OFFSET = np.uint64(0xCBF29CE484222325)
WORD_MULT = np.uint64(0xC2B2AE3D27D4EB4F)  # odd 64-bit multiplier (xxHash's PRIME64_2)
SHINGLE_PRIME = np.uint64(0x9E3779B97F4A7C15)  # golden-ratio odd constant: the polynomial base
EMPTY_MINHASH = np.uint32(0xFFFFFFFF)
EMPTY_BIN = np.uint64(1 << 32)  # above every 32-bit bin value: no shingle fell in this bin


@njit(cache=True, inline="always")
def fmix64(h):
    """murmur3 64-bit finaliser: every input bit flips each output bit with probability ~1/2."""
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> np.uint64(33)
    return h


def _byte_classes():
    """Per byte value: the byte with ASCII upper case folded to lower, or SPACE for ASCII whitespace."""
    table = np.arange(256, dtype=np.uint64)
    table[65:91] += np.uint64(32)  # ASCII case folding: "The" and "the" are one word
    table[[9, 10, 11, 12, 13, 32]] = SPACE
    return table


SPACE = np.uint64(256)
BYTE_CLASS = _byte_classes()


@njit(cache=True)
def _count_words(data, start, end):
    """Number of words: the non-space bytes that follow a space (or the start). Branch-free, so
    LLVM vectorises it."""
    n = 0
    prev_space = 1
    for p in range(start, end):
        c = np.int64(data[p])
        space = np.int64(c == 32) | np.int64(np.uint64(c - 9) < np.uint64(5))
        n += prev_space & (1 - space)
        prev_space = space
    return n


@njit(cache=True)
def _word_hashes(data, start, end, out):
    """Fill ``out`` with the hash of each word of ``data[start:end]``; returns the word count.

    The word's (case-folded) bytes are packed eight at a time, big-endian, into a 64-bit chunk,
    and each chunk is mixed in with one multiply, ``h = (h ^ chunk) * M``: one multiply per
    eight bytes instead of one per byte (FNV-1a). Then ``fmix64(h ^ length)``. Words of up to
    eight bytes never collide (every step is a bijection).
    """
    n = 0
    p = start
    while p < end:
        c = BYTE_CLASS[data[p]]
        p += 1
        if c == SPACE:
            continue
        h = FNV_OFFSET
        chunk = c
        length = 1
        while p < end:
            c = BYTE_CLASS[data[p]]
            if c == SPACE:
                break
            p += 1
            if length & 7 == 0:
                h = (h ^ chunk) * WORD_MULT
                chunk = c
            else:
                chunk = (chunk << np.uint64(8)) | c
            length += 1
        h = (h ^ chunk) * WORD_MULT
        out[n] = fmix64(h ^ np.uint64(length))
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
def _raw_shingles(data, offsets, ngram):
    """Every document's shingle hashes in text order (repeats kept): (hash_offsets int64[N+1], uint64[S])."""
    n_docs = offsets.shape[0] - 1
    word_counts = np.empty(n_docs, np.int64)
    counts = np.empty(n_docs, np.int64)
    for d in prange(n_docs):
        word_counts[d] = _count_words(data, offsets[d], offsets[d + 1])
        counts[d] = _shingle_count(word_counts[d], ngram)
    hash_offsets = np.zeros(n_docs + 1, np.int64)
    hash_offsets[1:] = np.cumsum(counts)
    hashes = np.empty(hash_offsets[n_docs], np.uint64)
    for d in prange(n_docs):
        if counts[d]:
            _doc_shingles(data, offsets[d], offsets[d + 1], ngram, word_counts[d],
                          hashes[hash_offsets[d]:hash_offsets[d + 1]])
    return hash_offsets, hashes


@njit(cache=True)
def _sort_unique(block, scratch):
    """Sort ``block`` (uniformly distributed 64-bit hashes) and move its distinct values to the
    front; returns their count. Counting sort on the top bits (about two values per bucket), then
    one insertion-sort pass that only fixes the order inside buckets: O(n) for hash values, and
    several times faster than a comparison sort on blocks of 10^2-10^4 shingles."""
    n = block.shape[0]
    if n < 2:
        return n
    bits = 1
    while (np.int64(1) << bits) < n // 2 and bits < 24:
        bits += 1
    shift = np.uint64(64 - bits)
    starts = np.zeros((1 << bits) + 1, np.int64)
    for i in range(n):
        starts[(block[i] >> shift) + np.uint64(1)] += 1
    for b in range(1 << bits):
        starts[b + 1] += starts[b]
    for i in range(n):
        bucket = block[i] >> shift
        scratch[starts[bucket]] = block[i]
        starts[bucket] += 1
    for i in range(1, n):
        x = scratch[i]
        j = i - 1
        while j >= 0 and scratch[j] > x:
            scratch[j + 1] = scratch[j]
            j -= 1
        scratch[j + 1] = x
    block[0] = scratch[0]
    u = 1
    for i in range(1, n):
        if scratch[i] != scratch[i - 1]:
            block[u] = scratch[i]
            u += 1
    return u


@njit(cache=True, parallel=True)
def sort_unique_blocks(hash_offsets, hashes, docs):
    """Turn the raw shingle blocks of documents ``docs`` into sorted sets, in place.

    -> ends int64[N]: document ``d``'s set is ``hashes[hash_offsets[d]:ends[d]]`` for every ``d``
    in ``docs``; the other documents' blocks are left as they were (``ends[d] = hash_offsets[d+1]``).
    """
    ends = hash_offsets[1:].copy()
    for i in prange(docs.shape[0]):
        d = docs[i]
        start, stop = hash_offsets[d], hash_offsets[d + 1]
        ends[d] = start + _sort_unique(hashes[start:stop], np.empty(stop - start, np.uint64))
    return ends


@njit(cache=True)
def shingle_hashes(data, offsets, ngram):
    """Sorted unique 64-bit word-``ngram`` shingle hashes of every document of a packed corpus.

    data: uint8[B], offsets: int64[N+1] -> (out_offsets int64[N+1], hashes uint64[S]).
    """
    raw_offsets, raw = _raw_shingles(data, offsets, ngram)
    n_docs = offsets.shape[0] - 1
    ends = sort_unique_blocks(raw_offsets, raw, np.arange(n_docs))
    out_offsets = np.zeros(n_docs + 1, np.int64)
    out_offsets[1:] = np.cumsum(ends - raw_offsets[:-1])
    # Compact in place, left to right (a destination never passes its source): no second
    # buffer, which at 1M documents is ~1.3 GB saved.
    for d in range(n_docs):
        base, dst = raw_offsets[d], out_offsets[d]
        if dst != base:
            for i in range(out_offsets[d + 1] - dst):
                raw[dst + i] = raw[base + i]
    return out_offsets, raw[:out_offsets[n_docs]]


@njit(cache=True, parallel=True)
def content_hashes(data, offsets):
    """64-bit hash of each document's exact bytes: uint64[N] (no case folding, whitespace counts).

    The bytes are packed eight at a time, big-endian, into a chunk mixed in with
    ``h = (h ^ chunk) * M`` from the FNV-1a offset basis, then ``fmix64(h ^ length)``: the word
    hash's construction applied to the whole document. Only a grouping key: ``exact_roots``
    compares the bytes of documents whose hashes are equal.
    """
    n_docs = offsets.shape[0] - 1
    out = np.empty(n_docs, np.uint64)
    for d in prange(n_docs):
        start, end = offsets[d], offsets[d + 1]
        h = FNV_OFFSET
        p = start
        while p + 8 <= end:
            chunk = np.uint64(0)
            for k in range(8):
                chunk = (chunk << np.uint64(8)) | np.uint64(data[p + k])
            h = (h ^ chunk) * WORD_MULT
            p += 8
        if p < end:
            chunk = np.uint64(0)
            while p < end:
                chunk = (chunk << np.uint64(8)) | np.uint64(data[p])
                p += 1
            h = (h ^ chunk) * WORD_MULT
        out[d] = fmix64(h ^ np.uint64(end - start))
    return out


@njit(cache=True)
def _same_bytes(data, offsets, a, b):
    n = offsets[a + 1] - offsets[a]
    if offsets[b + 1] - offsets[b] != n:
        return False
    pa, pb = offsets[a], offsets[b]
    for i in range(n):
        if data[pa + i] != data[pb + i]:
            return False
    return True


@njit(cache=True)
def exact_roots(data, offsets):
    """Exact duplicates: each document's root is the first document (lowest index) with the same
    bytes: int64[N]. Documents are grouped by ``content_hashes`` (a stable sort, so a group lists
    its members in input order) and a member's bytes are compared with the group's distinct
    texts seen so far, so a hash collision never merges different texts."""
    hashes = content_hashes(data, offsets)
    order = np.argsort(hashes, kind="mergesort")
    n = hashes.shape[0]
    root = np.arange(n)
    i = 0
    while i < n:
        e = i + 1
        while e < n and hashes[order[e]] == hashes[order[i]]:
            e += 1
        for x in range(i + 1, e):
            d = order[x]
            for y in range(i, x):
                r = order[y]
                if root[r] == r and _same_bytes(data, offsets, r, d):
                    root[d] = r
                    break
        i = e
    return root


@njit(cache=True)
def take_docs(data, offsets, index):
    """The documents ``index`` (int64[K], in that order) as a new packed corpus (data, offsets)."""
    out_offsets = np.zeros(index.shape[0] + 1, np.int64)
    for i in range(index.shape[0]):
        out_offsets[i + 1] = out_offsets[i] + offsets[index[i] + 1] - offsets[index[i]]
    out = np.empty(out_offsets[-1], np.uint8)
    for i in range(index.shape[0]):
        out[out_offsets[i]:out_offsets[i + 1]] = data[offsets[index[i]]:offsets[index[i] + 1]]
    return out, out_offsets


@njit(cache=True, inline="always")
def _bin_of(x, n_bins):
    return (x >> np.uint64(32)) * np.uint64(n_bins) >> np.uint64(32)


@njit(cache=True)
def _oph_row(block, salt, out):
    """One-permutation MinHash of one document's shingle hashes into ``out`` (uint32[P]).

    Each shingle hash ``x`` is re-mixed with the seed, ``y = fmix64(x ^ salt)``; the high 32 bits
    of ``y`` pick one of ``P`` bins, the low 32 bits are the value, and each bin keeps its minimum
    (Li, Owen & Zhang 2012, "One permutation hashing", NeurIPS). An empty bin ``k`` borrows the
    value of the first non-empty bin along its own probe sequence
    ``bin(fmix64(salt + (k + 1) * P + t))``, t = 1, 2, ... (optimal densification, Shrivastava
    2017, "Optimal densification for fast and accurate minwise hashing", ICML): two documents
    then agree on every bin, empty or not, with probability equal to their Jaccard similarity,
    as with ``P`` independent permutations, for one hash per shingle instead of ``P``.
    A document without shingles gets all 0xFFFFFFFF.
    """
    n_bins = out.shape[0]
    if block.shape[0] == 0:
        for k in range(n_bins):
            out[k] = EMPTY_MINHASH
        return
    row = np.full(n_bins, EMPTY_BIN, np.uint64)
    for i in range(block.shape[0]):
        y = fmix64(block[i] ^ salt)
        b = _bin_of(y, n_bins)
        v = y & np.uint64(0xFFFFFFFF)
        if v < row[b]:
            row[b] = v
    for k in range(n_bins):
        src = row[k]
        attempt = np.uint64(0)
        while src == EMPTY_BIN:
            attempt += np.uint64(1)
            src = row[_bin_of(fmix64(salt + np.uint64(k + 1) * SHINGLE_PRIME + attempt), n_bins)]
        out[k] = np.uint32(src)


@njit(cache=True, parallel=True)
def minhash_signatures(hash_offsets, hashes, n_bins, salt):
    """MinHash signature per document (one-permutation hashing, see ``_oph_row``): uint32[N, P].

    P(sig[d1, k] == sig[d2, k]) equals the Jaccard similarity of the two shingle sets (Broder
    1997, "On the resemblance and containment of documents"); order and repeats do not matter.
    ``salt`` (uint64) derives from the seed: ``oph_salt(seed)``.
    """
    n_docs = hash_offsets.shape[0] - 1
    sig = np.empty((n_docs, n_bins), np.uint32)
    for d in prange(n_docs):
        _oph_row(hashes[hash_offsets[d]:hash_offsets[d + 1]], salt, sig[d])
    return sig


@njit(cache=True)
def shingle_signatures(data, offsets, ngram, n_bins, salt):
    """Shingling and MinHash in one pass over the UTF-8 buffer, each shingle hashed once.

    -> (hash_offsets int64[N+1], raw shingle hashes uint64[S] in text order, signatures
    uint32[N, P]). The raw blocks are kept for verification: ``sort_unique_blocks`` turns only
    the candidate documents' blocks into sorted sets.
    """
    hash_offsets, hashes = _raw_shingles(data, offsets, ngram)
    return hash_offsets, hashes, minhash_signatures(hash_offsets, hashes, n_bins, salt)


def oph_salt(seed):
    """The uint64 salt of the one-permutation hash for an integer seed."""
    return np.uint64(fmix64(np.uint64(seed % (1 << 64)) ^ SHINGLE_PRIME))


@njit(cache=True, parallel=True)
def band_keys(signatures, bands, rows):
    """LSH band keys: uint64[N, bands]; two documents share bucket ``j`` iff rows ``j*r..j*r+r-1`` agree.

    Collision probability for Jaccard s is ``1 - (1 - s^r)^b`` (Leskovec et al., MMDS ch. 3.4).
    """
    n_docs = signatures.shape[0]
    keys = np.empty((n_docs, bands), np.uint64)
    for d in prange(n_docs):
        for j in range(bands):
            h = fmix64(np.uint64(j) + SHINGLE_PRIME)
            for i in range(j * rows, (j + 1) * rows):
                h = fmix64(h ^ np.uint64(signatures[d, i]))
            keys[d, j] = h
    return keys


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
        group = np.zeros((1 << bits) + 1, np.int64)
        for x in range(n_keys):
            group[(column[x] >> shift) + np.uint64(1)] += 1
        for g in range(1 << bits):
            group[g + 1] += group[g]
        fill = group[:-1].copy()
        sorted_keys = np.empty(n_keys, np.uint64)
        for x in range(n_keys):
            g = column[x] >> shift
            sorted_keys[fill[g]] = column[x]
            members[j, fill[g]] = docs[x]
            fill[g] += 1
        for g in range(1 << bits):
            lo, hi = group[g], group[g + 1]
            if hi - lo < 2:
                continue
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
