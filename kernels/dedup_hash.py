"""Dedup kernels, part 1: byte-level hashing of a packed corpus (words, shingles, whole documents).

A corpus is one UTF-8 byte buffer ``data`` (uint8) plus document offsets ``offsets`` (int64,
length N+1; doc ``i`` is ``data[offsets[i]:offsets[i+1]]``); variable-length per-document
outputs come back in the same CSR form ``(out_offsets int64[N+1], values)``. The hash
definitions are in ``kernels/dedup.py``'s docstring; ``kernels/reference.py`` has plain twins.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from .threads import launch

launch()  # Numba's pool, started with OpenMP nesting off (kernels/threads.py)

HASH_VERSION = 2  # bump when any hash below changes: stored signatures then count as stale
FNV_OFFSET = np.uint64(0xCBF29CE484222325)
WORD_MULT = np.uint64(0xC2B2AE3D27D4EB4F)  # odd 64-bit multiplier (xxHash's PRIME64_2)
SHINGLE_PRIME = np.uint64(0x9E3779B97F4A7C15)  # golden-ratio odd constant: the polynomial base


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
    # the first window folded word by word, then rolled: s' = (s - w_i P^(width-1)) P + w_{i+width}
    # (exact in wrapping arithmetic; two multiplies per shingle instead of ``width``)
    s = np.uint64(0)
    top_power = np.uint64(1)
    for j in range(width):
        s = s * SHINGLE_PRIME + words[j]
        if j:
            top_power = top_power * SHINGLE_PRIME
    mix = np.uint64(width)
    out[0] = fmix64(s ^ mix)
    for i in range(1, out.shape[0]):
        s = (s - words[i - 1] * top_power) * SHINGLE_PRIME + words[i + width - 1]
        out[i] = fmix64(s ^ mix)


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
    if ngram < 1:
        raise ValueError("shingle_hashes: ngram must be >= 1")
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


@intrinsic
def _load_u64(typingctx, array, index):
    """The 8 bytes ``array[index:index + 8]`` (uint8, C-contiguous) as one little-endian uint64,
    in one unaligned load. Numba has no such primitive: ``array[i:i + 8].view(np.uint64)[0]``
    builds an array per call (measured 2x slower than this whole hash). The caller guarantees
    ``index + 8 <= len(array)``."""

    if not (isinstance(array, types.Array) and array.dtype == types.uint8 and array.ndim == 1
            and array.layout == "C" and isinstance(index, types.Integer)):
        return None  # a typing error: only a contiguous uint8 buffer is read this way (strides are ignored)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        position = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = builder.bitcast(builder.gep(ary.data, [position]), ir.IntType(64).as_pointer())
        return builder.load(ptr, align=1)

    return types.uint64(array, index), codegen


@njit(cache=True, parallel=True)
def content_hashes(data, offsets):
    """64-bit hash of each document's exact bytes: uint64[N] (no case folding, whitespace counts).

    The bytes are read as little-endian 8-byte words ``w_i`` (native loads: x86-64 and aarch64 are
    little-endian; ``reference.content_hash`` assumes it), the last one zero-padded; word
    ``i`` goes to lane ``i % 4``, each lane ``l`` folding its words with ``h = (h ^ w) * M`` from
    the FNV-1a offset basis plus ``l``. Four independent multiply chains, so the hash runs at
    the load rate rather than one multiply's latency per word (one chain measured 2.5x slower).
    The lanes are then combined, ``h = (h ^ fmix64(lane)) * M`` from lane 0, and the result is
    ``fmix64(h ^ length)``. Only a grouping key, never stored: ``exact_roots`` compares the bytes
    of documents whose hashes are equal.
    """
    n_docs = offsets.shape[0] - 1
    out = np.empty(n_docs, np.uint64)
    for d in prange(n_docs):
        start, end = offsets[d], offsets[d + 1]
        h0 = FNV_OFFSET
        h1 = FNV_OFFSET + np.uint64(1)
        h2 = FNV_OFFSET + np.uint64(2)
        h3 = FNV_OFFSET + np.uint64(3)
        p = start
        while p + 32 <= end:
            h0 = (h0 ^ _load_u64(data, p)) * WORD_MULT
            h1 = (h1 ^ _load_u64(data, p + 8)) * WORD_MULT
            h2 = (h2 ^ _load_u64(data, p + 16)) * WORD_MULT
            h3 = (h3 ^ _load_u64(data, p + 24)) * WORD_MULT
            p += 32
        lane = 0
        while p < end:
            if p + 8 <= end:
                word = _load_u64(data, p)
            else:
                word = np.uint64(0)
                for k in range(end - p):
                    word |= np.uint64(data[p + k]) << np.uint64(8 * k)
            if lane == 0:
                h0 = (h0 ^ word) * WORD_MULT
            elif lane == 1:
                h1 = (h1 ^ word) * WORD_MULT
            elif lane == 2:
                h2 = (h2 ^ word) * WORD_MULT
            else:
                h3 = (h3 ^ word) * WORD_MULT
            lane += 1
            p += 8
        h = (h0 ^ fmix64(h1)) * WORD_MULT
        h = (h ^ fmix64(h2)) * WORD_MULT
        h = (h ^ fmix64(h3)) * WORD_MULT
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
