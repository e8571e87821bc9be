"""Numba kernels for near-duplicate detection: the public surface of ``training_assets_kernels.dedup``.

The kernels live in five modules, re-exported here under their historical names:
``dedup_hash`` (word / shingle / content hashes, sorted shingle sets, exact duplicates),
``dedup_minhash`` (one-permutation MinHash, band keys, signature agreement), ``dedup_lsh``
(LSH candidate pairs, exact Jaccard verification, union-find, decontamination lookup) and
``dedup_cosine`` (hashed features, hyperplane bits, cosine), plus ``dedup_sketch`` (MinHash
signatures streamed from the bytes, no shingle stored).

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

from .dedup_cosine import cosine_pairs, hashed_features, hyperplane_signatures
from .dedup_hash import (
    BYTE_CLASS,
    FNV_OFFSET,
    HASH_VERSION,
    SHINGLE_PRIME,
    SPACE,
    WORD_MULT,
    content_hashes,
    exact_roots,
    fmix64,
    shingle_hashes,
    sort_unique_blocks,
    take_docs,
)
from .dedup_lsh import contains_any, jaccard_pairs, lsh_candidates, union_find
from .dedup_minhash import (
    EMPTY_BIN,
    EMPTY_MINHASH,
    band_keys,
    minhash_signatures,
    oph_salt,
    shingle_signatures,
    signature_agreement,
)
from .dedup_sketch import minhash_sketch

__all__ = [
    "BYTE_CLASS", "EMPTY_BIN", "EMPTY_MINHASH", "FNV_OFFSET", "HASH_VERSION", "SHINGLE_PRIME", "SPACE", "WORD_MULT",
    "band_keys", "content_hashes", "contains_any", "cosine_pairs", "exact_roots", "fmix64", "hashed_features",
    "hyperplane_signatures", "jaccard_pairs", "lsh_candidates", "minhash_signatures", "minhash_sketch", "oph_salt",
    "shingle_hashes", "shingle_signatures", "signature_agreement", "sort_unique_blocks", "take_docs", "union_find",
]
