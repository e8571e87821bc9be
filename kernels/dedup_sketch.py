"""Dedup kernels, part 5: MinHash signatures straight from the UTF-8 bytes, no shingle stored.

``minhash_sketch`` gives the same signatures as ``shingle_signatures`` (same word, shingle and
one-permutation hashes, bit for bit) in one pass per document: each word is hashed once, the
shingle hash is a rolling polynomial over a ring of the last ``n`` word hashes, and each
shingle goes straight into the document's MinHash bins. Nothing of size "shingles in the
corpus" is ever written: at 10^6 documents of 1 KB that is ~2 GB of raw 64-bit hashes not
allocated, and the memory traffic of writing and re-reading them saved. Exact verification
then re-shingles only the candidate documents (``shingle_hashes`` on ``take_docs``).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .dedup_hash import BYTE_CLASS, FNV_OFFSET, SHINGLE_PRIME, SPACE, WORD_MULT, fmix64
from .dedup_minhash import EMPTY_BIN, EMPTY_MINHASH, _bin_of, _densify
from .threads import launch

launch()  # Numba's pool, started with OpenMP nesting off (kernels/threads.py)


@njit(cache=True, inline="always")
def _add(row, shingle, salt, n_bins):
    y = fmix64(shingle ^ salt)
    b = _bin_of(y, n_bins)
    row[b] = min(row[b], y & np.uint64(0xFFFFFFFF))


@njit(cache=True, inline="always")
def _sketch_doc(data, start, end, ngram, salt, top_power, row, ring, out):
    """MinHash of one document into ``out`` (uint32[P]); returns its shingle count (repeats
    counted). ``top_power`` = P^(ngram-1) (wrapping): the weight of the word leaving the window.

    The shingle of words ``w_i .. w_{i+n-1}`` is ``fmix64(s ^ n)`` with
    ``s = sum_j w_{i+j} P^(n-1-j)`` mod 2^64, the value ``_doc_shingles`` folds word by word;
    rolling it, ``s' = (s - w_i P^(n-1)) P + w_{i+n}``, is exact in wrapping arithmetic.
    """
    n_bins = out.shape[0]
    for k in range(n_bins):
        row[k] = EMPTY_BIN
    n_words = 0
    slot = 0
    s = np.uint64(0)
    width = np.uint64(ngram)
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
        w = fmix64(h ^ np.uint64(length))
        if n_words >= ngram:
            s = (s - ring[slot] * top_power) * SHINGLE_PRIME + w
        else:
            s = s * SHINGLE_PRIME + w
        ring[slot] = w
        slot += 1
        if slot == ngram:
            slot = 0
        n_words += 1
        if n_words >= ngram:
            _add(row, fmix64(s ^ width), salt, n_bins)
    if n_words == 0:
        for k in range(n_bins):
            out[k] = EMPTY_MINHASH
        return 0
    if n_words < ngram:  # one shingle of all the words
        _add(row, fmix64(s ^ np.uint64(n_words)), salt, n_bins)
        _densify(row, salt, out)
        return 1
    _densify(row, salt, out)
    return n_words - ngram + 1


@njit(cache=True, parallel=True)
def minhash_sketch(data, offsets, ngram, n_bins, salt):
    """One-permutation MinHash signatures of a packed corpus without storing any shingle.

    data: uint8[B], offsets: int64[N+1] -> (signatures uint32[N, P], shingle counts int64[N]
    (0 for a document without words)). Bit-identical to ``shingle_signatures``'s signatures.
    The documents are cut into (up to) 1024 contiguous chunks, each with its own scratch (bins
    and word ring) allocated once; the result does not depend on the chunking.
    """
    n_docs = offsets.shape[0] - 1
    sig = np.empty((n_docs, n_bins), np.uint32)
    counts = np.zeros(n_docs, np.int64)
    top_power = np.uint64(1)
    for _ in range(ngram - 1):
        top_power = top_power * SHINGLE_PRIME
    n_chunks = min(n_docs, 1024)
    for c in prange(n_chunks):
        row = np.empty(n_bins, np.uint64)
        ring = np.empty(ngram, np.uint64)
        for d in range(c * n_docs // n_chunks, (c + 1) * n_docs // n_chunks):
            counts[d] = _sketch_doc(data, offsets[d], offsets[d + 1], ngram, salt, top_power, row, ring, sig[d])
    return sig, counts
