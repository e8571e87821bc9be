"""Exact and near-duplicate removal: content hash, then MinHash-LSH (or hyperplane-LSH cosine).

Pipeline (each step a Numba kernel from ``training_assets_kernels.dedup`` (folder ``kernels/``), glued here with NumPy):

1. exact duplicates: records with the same text collapse onto the first (hash table on content);
2. features per unique text: word-n-gram shingle hashes, each shingle hashed once and kept in
   text order (``minhash``), or a hashing-vectorizer embedding (``cosine``), straight from
   UTF-8 buffers (MinHash: chunks of ~16M characters, packed and sketched in turn);
3. signatures: MinHash (``num_perm`` one-permutation-hashing bins, from the same shingle hashes)
   or ``num_perm`` random-hyperplane bits;
4. LSH: ``bands x rows`` chosen so a pair at the threshold collides with probability
   >= ``target_recall`` (``lsh_params``); documents sharing a band key are candidate pairs;
5. verification: exact Jaccard of the shingle sets (or exact cosine of the embeddings);
   pairs below the threshold are discarded. MinHash: every candidate is checked exactly; only
   the shingle blocks of candidate documents are sorted into sets, and a merge stops once the
   pair can no longer reach the threshold. Cosine: the hyperplane agreement decides the clear
   cases first (six binomial deviations either way, see ``dedup_unique``);
6. clusters: connected components of verified pairs (union-find). The representative kept for
   a cluster is its **first record in input order**: earlier data wins, and in the staged,
   incremental form an old batch's record is never displaced by a new batch.

Same records, parameters and seed give the same result, whatever the thread count.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from training_assets_kernels import dedup as K
from training_assets.data_engine.dedup_runtime import BYTES_PER_THREAD, DOCS_PER_THREAD, threads_for
from training_assets.data_engine.dedup_runtime import gc_paused as _gc_paused
from training_assets.data_engine.dedup_runtime import lap as _lap
from training_assets.data_engine.dedup_runtime import now as _now
from training_assets.data_engine.filters import Dropped

METHODS = ("minhash", "cosine")
DEFAULT_SEED = 42
N_HASHED_FEATURES = 1 << 20
PACK_CHUNK = 1 << 24  # characters per join+encode step of an ASCII corpus (16 MB of temporaries)


@dataclass(frozen=True)
class DedupParams:
    method: str = "minhash"  # "minhash" (Jaccard of word n-grams) or "cosine" (hashed unigram embedding)
    threshold: float = 0.8  # a pair at or above this similarity is a duplicate
    num_perm: int = 128  # MinHash values (one-permutation bins) / hyperplane bits
    ngram: int = 5  # words per shingle (minhash)
    seed: int = DEFAULT_SEED  # the MinHash salt and the hyperplanes derive from it
    target_recall: float = 0.995  # LSH collision probability required at the threshold

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"dedup method {self.method!r} is not one of {METHODS}")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"dedup threshold {self.threshold} must be in (0, 1]")
        if self.num_perm < 2 or self.ngram < 1:
            raise ValueError(f"num_perm ({self.num_perm}) must be >= 2 and ngram ({self.ngram}) >= 1")


def collision_probability(similarity: float, bands: int, rows: int) -> float:
    """P(two documents share at least one band) = 1 - (1 - s^r)^b for per-row agreement s."""
    return 1.0 - (1.0 - similarity ** rows) ** bands


def row_agreement(threshold: float, method: str) -> float:
    """Per-row collision probability at the threshold: Jaccard itself, or 1 - arccos(cos)/pi."""
    return threshold if method == "minhash" else 1.0 - float(np.arccos(threshold)) / np.pi


def lsh_params(threshold: float, num_perm: int, target_recall: float = 0.995, method: str = "minhash"
               ) -> tuple[int, int]:
    """(bands, rows): the most rows per band (fewest false candidates) that still catch a pair at
    the threshold with probability >= ``target_recall``, using ``bands = num_perm // rows``.

    Candidates are verified exactly, so false candidates cost time, never precision; missed pairs
    cost recall, which is why recall at the threshold is the constraint.
    """
    s = row_agreement(threshold, method)
    for rows in range(num_perm, 0, -1):
        bands = num_perm // rows
        if collision_probability(s, bands, rows) >= target_recall:
            return bands, rows
    return num_perm, 1


def content_hash(text: str) -> str:
    """BLAKE2b-128 of the UTF-8 text: a record's content identity in the signature store."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def pack_texts(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """One UTF-8 buffer (uint8[B]) and document offsets (int64[N+1]) for the kernels.

    An all-ASCII corpus (``str.isascii`` is a flag lookup in CPython) is its own UTF-8: texts are
    joined and encoded in chunks of ~``PACK_CHUNK`` characters straight into one preallocated
    buffer (three memcpy-speed passes, no per-text Python work, at most one chunk of
    temporaries). Otherwise each text is encoded and appended to one growing buffer: no join of
    mixed-width strings, which would widen every text to the widest one's width.
    """
    offsets = np.zeros(len(texts) + 1, np.int64)
    lengths = np.fromiter(map(len, texts), np.int64, len(texts))
    if all(map(str.isascii, texts)):
        np.cumsum(lengths, out=offsets[1:])
        data = np.empty(int(offsets[-1]), np.uint8)
        start = 0
        while start < len(texts):
            stop = int(np.searchsorted(offsets, offsets[start] + PACK_CHUNK, "right"))
            stop = min(max(stop - 1, start + 1), len(texts))
            data[offsets[start]:offsets[stop]] = np.frombuffer("".join(texts[start:stop]).encode("ascii"), np.uint8)
            start = stop
        return data, offsets
    buffer = bytearray()
    for i, text in enumerate(texts):
        encoded = text.encode("utf-8")
        lengths[i] = len(encoded)
        buffer += encoded
    np.cumsum(lengths, out=offsets[1:])
    return np.frombuffer(buffer, np.uint8), offsets


@dataclass
class Features:
    """What LSH and verification need per document: the signature matrix, which documents have
    any feature, and an exact similarity for candidate pairs (computed lazily: in memory, the
    shingle sets of only the candidate documents are ever built)."""

    signatures: np.ndarray  # uint32[N, num_perm]: MinHash values or hyperplane bits
    nonempty: np.ndarray  # bool[N]
    # (int64[M, 2] pairs, floor) -> float64[M]: exact where >= floor, some value < floor elsewhere
    similarity: Callable[[np.ndarray, float], np.ndarray]

    def take(self, index: np.ndarray) -> Features:
        """The features of documents ``index``, in that order."""
        parent = self.similarity
        return Features(self.signatures[index], self.nonempty[index],
                        lambda pairs, floor: parent(index[pairs], floor))


def csr_jaccard(offsets: np.ndarray, hashes: np.ndarray) -> Callable[[np.ndarray, float], np.ndarray]:
    """Exact Jaccard over stored sorted-unique shingle sets (CSR)."""
    return lambda pairs, floor: K.jaccard_pairs(pairs, offsets[:-1], offsets[1:], hashes, floor)


def packed_jaccard(data: np.ndarray, offsets: np.ndarray, ngram: int) -> Callable[[np.ndarray, float], np.ndarray]:
    """Exact Jaccard from the packed texts themselves (``lazy_jaccard`` over ``take_docs``)."""
    return lazy_jaccard(len(offsets) - 1, lambda index: K.take_docs(data, offsets, index), ngram)


def text_jaccard(texts: Sequence[str], index: np.ndarray, ngram: int) -> Callable[[np.ndarray, float], np.ndarray]:
    """Exact Jaccard of documents ``texts[index[i]]``: candidates are packed from the strings when
    first needed, so no corpus-sized byte buffer stays alive through LSH and verification."""
    return lazy_jaccard(len(index), lambda new: pack_texts([texts[i] for i in index[new].tolist()]), ngram)


def lazy_jaccard(n_docs: int, fetch: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
                 ngram: int) -> Callable[[np.ndarray, float], np.ndarray]:
    """Exact Jaccard over ``n_docs`` documents: on each call, the documents in the pairs not seen
    before are fetched as a packed corpus (``fetch(index) -> (data, offsets)``) and shingled into
    sorted sets (``shingle_hashes``); sets already built are reused. Only candidate documents are
    ever shingled into memory, so no corpus-sized shingle array exists."""
    slot = np.full(n_docs, -1, np.int64)  # document -> its row in the built sets, or -1
    state = {"offsets": np.zeros(1, np.int64), "hashes": np.zeros(0, np.uint64)}

    def similarity(pairs: np.ndarray, floor: float) -> np.ndarray:
        seen = np.zeros(n_docs, bool)
        seen[pairs.ravel()] = True
        new = np.nonzero(seen & (slot < 0))[0]
        if len(new):
            sub_data, sub_offsets = fetch(new)
            with threads_for(len(sub_data), BYTES_PER_THREAD):
                sub_offsets, sub_hashes = K.shingle_hashes(sub_data, sub_offsets, ngram)
            del sub_data
            base = len(state["offsets"]) - 1
            slot[new] = base + np.arange(len(new))
            state["offsets"] = np.concatenate([state["offsets"][:-1], sub_offsets + state["offsets"][-1]])
            state["hashes"] = np.concatenate([state["hashes"], sub_hashes])
        set_offsets = state["offsets"]
        with threads_for(8 * len(state["hashes"]), BYTES_PER_THREAD):
            return K.jaccard_pairs(slot[pairs], set_offsets[:-1], set_offsets[1:], state["hashes"], floor)
    return similarity


def packed_features(data: np.ndarray, offsets: np.ndarray, params: DedupParams) -> Features:
    """Features of a packed corpus (``pack_texts``'s data uint8[B] and offsets int64[N+1])."""
    with threads_for(len(data), BYTES_PER_THREAD):
        if params.method == "minhash":
            signatures, counts = K.minhash_sketch(data, offsets, params.ngram, params.num_perm,
                                                  K.oph_salt(params.seed))
            return Features(signatures, counts > 0, packed_jaccard(data, offsets, params.ngram))
        feat_offsets, ids, weights = K.hashed_features(data, offsets, N_HASHED_FEATURES)
        bits = K.hyperplane_signatures(feat_offsets, ids, weights, params.num_perm, params.seed)
    return Features(bits, np.diff(feat_offsets) > 0,
                    lambda pairs, floor: K.cosine_pairs(pairs, feat_offsets, ids, weights))


def _text_chunks(texts: Sequence[str]) -> Iterator[tuple[int, int]]:
    """``(lo, hi)`` runs of consecutive ``texts`` of ~``PACK_CHUNK`` characters (at least one text each)."""
    ends = np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts)))
    lo = 0
    while lo < len(texts):
        base = ends[lo - 1] if lo else 0
        hi = max(int(np.searchsorted(ends, base + PACK_CHUNK, "right")), lo + 1)
        yield lo, hi
        lo = hi


def exact_roots_from_hashes(texts: Sequence[str], hashes: np.ndarray) -> np.ndarray:
    """Each text's exact-duplicate root (int64[N]: the first index with an equal string, i.e. equal
    UTF-8 bytes), given its ``K.content_hashes`` value: inside each group of equal hashes (stable
    order, so input order) the strings are compared, so a hash collision never merges different
    texts. The same roots as ``K.exact_roots`` on the packed texts."""
    n = len(texts)
    root = np.arange(n)
    if n < 2:
        return root
    order = np.argsort(hashes, kind="stable")
    ordered = hashes[order]
    same = ordered[1:] == ordered[:-1]
    if not same.any():
        return root
    group_start = np.nonzero(np.concatenate([[True], ~same]))[0]
    group_end = np.append(group_start[1:], n)
    for g in np.nonzero(group_end - group_start > 1)[0].tolist():
        first: dict[str, int] = {}
        for d in order[group_start[g]:group_end[g]].tolist():
            root[d] = first.setdefault(texts[d], d)
    return root


def streamed_exact_roots(texts: Sequence[str]) -> np.ndarray:
    """``K.exact_roots`` of ``texts`` without packing the corpus at once: ``content_hashes`` chunk
    by chunk of ~``PACK_CHUNK`` characters (each chunk's buffer is reused by the allocator, so a
    1 GB corpus never faults in 1 GB of fresh pages), then ``exact_roots_from_hashes``."""
    hashes = np.empty(len(texts), np.uint64)
    for lo, hi in _text_chunks(texts):
        data, offsets = pack_texts(texts[lo:hi])
        with threads_for(len(data), 8 * BYTES_PER_THREAD):  # a hash at memory speed: more bytes per thread
            hashes[lo:hi] = K.content_hashes(data, offsets)
    return exact_roots_from_hashes(texts, hashes)


def streamed_minhash(texts: Sequence[str], params: DedupParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Content hashes (uint64[N]), MinHash signatures (uint32[N, P]) and shingle counts (int64[N]) of
    every text in one pass, chunk by chunk of ~``PACK_CHUNK`` characters: each chunk is packed
    once and both kernels read it (``content_hashes``, ``minhash_sketch``; neither result depends
    on the chunking). No corpus-sized byte buffer exists: at 10^6 ~1 KB documents, 1 GB not
    allocated, and ~1.5 s of first-touch page faults and one of two packing passes saved here.
    Exact duplicates are sketched too (their rows are dropped after): cheaper than packing twice."""
    n = len(texts)
    hashes = np.empty(n, np.uint64)
    signatures = np.empty((n, params.num_perm), np.uint32)
    counts = np.zeros(n, np.int64)
    salt = K.oph_salt(params.seed)
    for lo, hi in _text_chunks(texts):
        data, offsets = pack_texts(texts[lo:hi])
        with threads_for(len(data), BYTES_PER_THREAD):
            hashes[lo:hi] = K.content_hashes(data, offsets)
            signatures[lo:hi], counts[lo:hi] = K.minhash_sketch(data, offsets, params.ngram, params.num_perm, salt)
    return hashes, signatures, counts


def _keep_rows(matrix: np.ndarray, rows: np.ndarray, block: int = 1 << 14) -> np.ndarray:
    """``matrix[rows]`` for increasing ``rows``, compacted in place block by block (a fancy-indexed
    copy of 10^6 signatures would fault in 512 MB of fresh pages): the rows written never pass
    the rows still to be read. When fewer than half the rows are kept (a duplicate-heavy corpus),
    a copy instead, so the dropped rows' memory is freed rather than held by a view."""
    if len(rows) == len(matrix):
        return matrix
    if 2 * len(rows) < len(matrix):
        return matrix[rows]
    for lo in range(0, len(rows), block):
        take = rows[lo:lo + block]
        matrix[lo:lo + len(take)] = matrix[take]
    return matrix[:len(rows)]


def candidate_pairs(signatures: np.ndarray, nonempty: np.ndarray, bands: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Unique candidate pairs int64[M, 2] (a < b, sorted) and the band-key matrix uint64[N, bands]:
    documents sharing a band key in any band (``K.lsh_candidates``)."""
    with threads_for(len(signatures), DOCS_PER_THREAD):
        keys = K.band_keys(signatures, bands, rows)
        return K.lsh_candidates(keys, nonempty), keys


@dataclass
class DedupResult:
    """kept: records in input order; clusters: kept id -> [its own id, then the ids it stands for];
    dropped: one ``Dropped`` per removed record (``duplicate_of`` = the kept id); pairs: verified
    near-duplicate pairs (id_a, id_b, similarity); stats: counts and LSH parameters."""

    kept: list[dict[str, Any]]
    clusters: dict[str, list[str]]
    dropped: list[Dropped] = field(default_factory=list)
    pair_index: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64))  # record indices
    pair_similarity: np.ndarray = field(default_factory=lambda: np.zeros(0))
    ids: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def pairs(self) -> list[tuple[str, str, float]]:
        """Verified near-duplicate pairs as (id_a, id_b, similarity), built on demand."""
        return [(self.ids[a], self.ids[b], s)
                for (a, b), s in zip(self.pair_index.tolist(), self.pair_similarity.tolist(), strict=True)]

    def cluster_sizes(self) -> dict[int, int]:
        """Histogram: cluster size -> number of clusters."""
        hist: dict[int, int] = {}
        for members in self.clusters.values():
            hist[len(members)] = hist.get(len(members), 0) + 1
        return dict(sorted(hist.items()))


def dedup_unique(ids: Sequence[str], features: Features, params: DedupParams,
                 timings: dict[str, float] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """Near-dup clustering of already exact-deduplicated documents given their features.

    -> (root int64[N]: index of each document's representative, verified pairs int64[M, 2],
    similarities float64[M], stats). Shared by in-memory ``dedup`` and the staged store.
    ``timings``: when given, seconds per stage are added to it (``lsh``, ``verify``, ``clusters``).
    """
    n = len(ids)
    t = _now()
    bands, rows = lsh_params(params.threshold, params.num_perm, params.target_recall, params.method)
    nonempty = features.nonempty
    candidates, _ = candidate_pairs(features.signatures, nonempty, bands, rows)
    t = _lap(timings, "lsh", t)
    if params.method == "minhash":
        # Every MinHash candidate gets the exact Jaccard: the check stops as soon as a pair can no
        # longer reach the threshold, so clearly dissimilar candidates are cheap anyway, and the
        # signature is no safe judge for short documents (a one-permutation signature of a
        # handful of shingles borrows most bins from a few values: two 5-shingle documents with
        # Jaccard 0.8 agree on all 128 bins ~2 % of the time, far from the binomial 0.8^128).
        sure = np.zeros(len(candidates), bool)
        check = np.ones(len(candidates), bool)
        estimate = np.zeros(0)
    else:
        # Hyperplane bits are independent given the two vectors, so the agreement is binomial:
        # skip the exact cosine for candidates more than six standard deviations below the
        # agreement expected at the threshold, and accept those six above it (for cosine 0.8 and
        # 128 bits: all bits equal, which a pair below the threshold, per-bit agreement
        # < 1 - arccos(0.8)/pi = 0.795, does with probability < 0.795^128 ~ 2e-13) with the
        # estimate cos(pi * (1 - agreement)) as their similarity.
        expected = row_agreement(params.threshold, params.method)
        spread = 6.0 * float(np.sqrt(expected * (1.0 - expected) / params.num_perm))
        agreement = K.signature_agreement(candidates, features.signatures) if len(candidates) else np.zeros(0)
        sure = agreement >= min(1.0, expected + spread)
        check = (agreement >= expected - spread) & ~sure
        estimate = np.cos(np.pi * (1.0 - agreement[sure]))
    pairs = np.concatenate([candidates[sure], candidates[check]])
    sims = np.concatenate([estimate, features.similarity(candidates[check], params.threshold) if check.any() else np.zeros(0)])
    good = sims >= params.threshold
    t = _lap(timings, "verify", t)
    root = K.union_find(n, pairs[good]) if n else np.zeros(0, np.int64)
    _lap(timings, "clusters", t)
    stats = {"bands": bands, "rows": rows, "candidate_pairs": int(len(candidates)),
             "accepted_on_signature": int(sure.sum()), "checked_exactly": int(check.sum()),
             "verified_pairs": int(good.sum()), "empty_documents": int((~nonempty).sum())}
    return root, pairs[good], sims[good], stats


def unique_ids(records: Sequence[dict[str, Any]]) -> list[str]:
    """The records' ids, in order; a ``ValueError`` naming one that repeats (every record needs its own
    answer, so ids must be unique)."""
    ids = [r["id"] for r in records]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"dedup: record id {dup!r} appears more than once; ids must be unique")
    return ids


def dedup(records: Sequence[dict[str, Any]], method: str = "minhash", threshold: float = 0.8, num_perm: int = 128,
          ngram: int = 5, seed: int = DEFAULT_SEED, target_recall: float = 0.995,
          features: Features | None = None, timings: dict[str, float] | None = None) -> DedupResult:
    """Remove exact and near duplicates from ``records`` (dicts with ``id`` and ``text``), in this process.

    ``data_engine.dedup`` (``engines``) runs this, or with ``engine="ray"`` the same result on a Ray cluster.
    ``features``: precomputed features of every record, in order (the staged store passes the
    stored signatures so they are not recomputed); by default they are computed here. See the
    module docstring for the pipeline and the representative rule. ``timings``: when given, the
    seconds of each stage are added to it (``exact``, ``features`` (each with its packing), ``lsh``,
    ``verify``, ``clusters``, ``assemble``); they are kept out of ``stats`` so that stays deterministic.
    """
    t = _now()
    params = DedupParams(method, threshold, num_perm, ngram, seed, target_recall)
    ids = unique_ids(records)
    # Exact duplicates: a 64-bit hash of each text's UTF-8 bytes, then a comparison inside equal-hash
    # groups. MinHash: hashes and signatures come from one chunked pass over the texts (the packing
    # is in "features"); cosine features need every document's vector at once, after the exact stage.
    texts = [r["text"] for r in records]
    if features is None and method == "minhash":
        hashes, signatures, counts = streamed_minhash(texts, params)
        t = _lap(timings, "features", t)
        exact_root = exact_roots_from_hashes(texts, hashes)
        unique = np.nonzero(exact_root == np.arange(len(records)))[0]
        features = Features(_keep_rows(signatures, unique), counts[unique] > 0, text_jaccard(texts, unique, params.ngram))
        _lap(timings, "exact", t)
    else:
        exact_root = streamed_exact_roots(texts)
        unique = np.nonzero(exact_root == np.arange(len(records)))[0]
        t = _lap(timings, "exact", t)
        features = features.take(unique) if features is not None else packed_features(
            *pack_texts([texts[i] for i in unique.tolist()]), params)
        _lap(timings, "features", t)
    near_root, pairs, sims, stats = dedup_unique([ids[i] for i in unique], features, params, timings)
    t = _now()
    root = unique[near_root][np.searchsorted(unique, exact_root)] if len(records) else exact_root
    result = assemble(records, root, exact_root, unique[pairs] if len(pairs) else pairs, sims,
                      {"method": method, "threshold": threshold, "num_perm": num_perm, "ngram": ngram, "seed": seed,
                       **stats})
    _lap(timings, "assemble", t)
    return result


def assemble(records: Sequence[dict[str, Any]], root: np.ndarray, exact_root: np.ndarray,
             pair_index: np.ndarray, sims: np.ndarray, stats: dict[str, Any]) -> DedupResult:
    """Turn per-record representative indices into kept records, clusters and drop reasons.

    pair_index: int64[M, 2] record indices of the verified pairs, sims: float64[M].
    """
    with _gc_paused():
        return _assemble(records, root, exact_root, pair_index, sims, stats)


def _assemble(records: Sequence[dict[str, Any]], root: np.ndarray, exact_root: np.ndarray,
              pair_index: np.ndarray, sims: np.ndarray, stats: dict[str, Any]) -> DedupResult:
    best = np.zeros(len(records))  # each record's best similarity to anything in its cluster
    if len(pair_index):
        np.maximum.at(best, pair_index[:, 0], sims)
        np.maximum.at(best, pair_index[:, 1], sims)
    # Python work per dropped record only: kept records are picked by index, each gets its own
    # cluster list, and dropped ids are appended in input order (a representative is the first
    # record of its cluster, so it always precedes its members).
    ids = [r["id"] for r in records]
    index = np.arange(len(records))
    kept = [records[i] for i in np.nonzero(root == index)[0].tolist()]
    clusters: dict[str, list[str]] = {r["id"]: [r["id"]] for r in kept}
    dropped: list[Dropped] = []
    gone = np.nonzero(root != index)[0]
    for i, r, e, sim in zip(gone.tolist(), root[gone].tolist(), exact_root[gone].tolist(), best[gone].tolist(),
                            strict=True):
        rep = ids[r]
        clusters[rep].append(ids[i])
        if e != i:
            dropped.append(Dropped(ids[i], "dedup", "exact_duplicate", f"same text as {ids[e]}",
                                   duplicate_of=rep, similarity=1.0))
        else:
            dropped.append(Dropped(ids[i], "dedup", "near_duplicate",
                                   f"{stats['method']} similarity {sim:.3f} >= {stats['threshold']} "
                                   f"within the cluster of {rep}", duplicate_of=rep, similarity=sim))
    n_exact = sum(d.reason == "exact_duplicate" for d in dropped)
    stats = {**stats, "input": len(records), "kept": len(kept), "exact_duplicates": n_exact,
             "near_duplicates": len(dropped) - n_exact,
             "dedup_rate": (len(dropped) / len(records)) if len(records) else 0.0}
    return DedupResult(kept, clusters, dropped, pair_index, sims, ids, stats)
