"""Dedup kernels, part 2: MinHash signatures (one-permutation hashing with optimal
densification), LSH band keys and signature agreement."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .dedup_hash import SHINGLE_PRIME, _raw_shingles, fmix64
from .threads import launch

launch()  # Numba's pool, started with OpenMP nesting off (kernels/threads.py)

EMPTY_MINHASH = np.uint32(0xFFFFFFFF)
EMPTY_BIN = np.uint64(1 << 32)  # above every 32-bit bin value: no shingle fell in this bin


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
    _densify(row, salt, out)


@njit(cache=True, inline="always")
def _densify(row, salt, out):
    """``out[k]`` = bin ``k``'s minimum, or for an empty bin (``EMPTY_BIN``; at least one bin
    must be filled) the minimum of the first filled bin along its seeded probe sequence."""
    n_bins = out.shape[0]
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
