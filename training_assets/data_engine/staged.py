"""Staged, incremental near-dedup (the datatrove shape: signatures -> buckets -> clusters -> filter).

Stage 1, per trace partition, computed once: ``<root>/minhash_signatures/<batch_id>/``
``signatures.parquet`` (id, content_hash, shingles list<uint64>, signature list<uint32>) and
``meta.json`` (the parameters and the raw_traces partition version, ``ingest.partition_version``,
it was computed from).
Stage 2, buckets: every (band, band key) shared by two or more documents, a Parquet group-by
over the stored signatures' band keys. Stage 3, clusters: verified pairs -> union-find. Stage 4,
filter: keep the representatives.

A new batch only adds a stage-1 partition; stages 2-4 read the old partitions' stored
signatures and never recompute them. Stage 1 runs anywhere (one Dagster run per partition);
stage 2 is a group-by a query engine can run over the Parquet files at any scale.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from training_assets_kernels import dedup as K
from training_assets import ingest, paths
from training_assets.data_engine.dedup import (
    DedupParams,
    Features,
    content_hash,
    csr_jaccard,
    lsh_params,
    pack_texts,
)
from training_assets.data_engine.filters import normalize
from training_assets.traces import check_batch_id
from training_assets.storage import atomic_dir, sha256_file, write_json_atomic, write_parquet

SIGNATURES_ASSET = "minhash_signatures"
SIGNATURES_FILE = "signatures.parquet"
META_FILE = "meta.json"
SIGNATURE_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("content_hash", pa.string()),
    ("shingles", pa.list_(pa.uint64())),
    ("signature", pa.list_(pa.uint32())),
])


def signature_params(params: DedupParams) -> dict[str, Any]:
    """What a stored signature depends on (threshold and LSH shape do not matter)."""
    return {"ngram": params.ngram, "num_perm": params.num_perm, "seed": params.seed, "method": params.method,
            "hash_version": K.HASH_VERSION}


RECORD_COLUMNS = ["trace_id", "task_id", "source", "text"]


def partition_dir(batch_id: str, root: str | os.PathLike[str] | None = None) -> Path:
    return paths.asset_dir(SIGNATURES_ASSET, root) / check_batch_id(batch_id)


def batch_records(batch_id: str, root: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """The batch's traces as normalised corpus records, from the columns raw_traces stored (no parsing)."""
    table = ingest.read_traces_table([batch_id], root, columns=RECORD_COLUMNS)
    return [{"id": r["trace_id"], "text": normalize(r["text"]), "source": r["source"] or "traces",
             "trace_id": r["trace_id"], "task_id": r["task_id"], "batch_id": batch_id} for r in table.to_pylist()]


def shingles_and_signatures(texts: Sequence[str], params: DedupParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets int64[N+1], sorted unique shingle hashes uint64[S], MinHash uint32[N, P]) of texts."""
    data, offsets = pack_texts(texts)
    hash_offsets, hashes = K.shingle_hashes(data, offsets, params.ngram)
    return hash_offsets, hashes, K.minhash_signatures(hash_offsets, hashes, params.num_perm, K.oph_salt(params.seed))


def signature_table(records: Sequence[dict[str, Any]], params: DedupParams) -> pa.Table:
    offsets, hashes, signatures = shingles_and_signatures([r["text"] for r in records], params)
    shingles = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(hashes))
    n_perm = signatures.shape[1]
    flat = pa.array(signatures.reshape(-1))
    signature = pa.ListArray.from_arrays(pa.array(np.arange(0, len(records) * n_perm + 1, n_perm, dtype=np.int32)), flat)
    return pa.Table.from_arrays(
        [pa.array([r["id"] for r in records], pa.string()), pa.array([content_hash(r["text"]) for r in records]),
         shingles, signature], schema=SIGNATURE_SCHEMA)


def write_partition_signatures(batch_id: str, params: DedupParams, root: str | os.PathLike[str] | None = None
                               ) -> dict[str, Any]:
    """Stage 1 for one partition: compute and store its signatures (replacing the folder whole)."""
    if params.method != "minhash":
        raise ValueError(f"staged dedup stores MinHash signatures; method {params.method!r} runs in memory only")
    records = batch_records(batch_id, root)
    table = signature_table(records, params)
    meta = {"batch_id": batch_id, "params": signature_params(params),
            "traces_version": ingest.partition_version(batch_id, root), "documents": len(records)}
    with atomic_dir(partition_dir(batch_id, root)) as tmp:
        write_parquet(tmp / SIGNATURES_FILE, table)
        write_json_atomic(tmp / META_FILE, meta)
    return {**meta, "data_version": sha256_file(partition_dir(batch_id, root) / SIGNATURES_FILE)[:16],
            "uri": str(partition_dir(batch_id, root))}


def stored_partition(batch_id: str, params: DedupParams, root: str | os.PathLike[str] | None = None
                     ) -> tuple[pa.Table | None, str]:
    """(table, why): the stored signatures if they match the params and the current traces, else None."""
    folder = partition_dir(batch_id, root)
    if not (folder / META_FILE).is_file():
        return None, "not staged"
    meta = json.loads((folder / META_FILE).read_text())
    if meta.get("params") != signature_params(params):
        return None, f"staged with {meta.get('params')}, need {signature_params(params)}"
    if meta.get("traces_version") != ingest.partition_version(batch_id, root):
        return None, "raw_traces partition changed since signatures were staged"
    return pq.read_table(folder / SIGNATURES_FILE), "stored"


def add_stored_rows(stored: dict[str, tuple[str, Any, Any]], table: pa.Table) -> None:
    """``stored[id] = (content_hash, shingles, signature)`` for every row of a partition's signature table."""
    for row_id, chash, shingles, signature in zip(
            table.column("id").to_pylist(), table.column("content_hash").to_pylist(),
            table.column("shingles").to_numpy(zero_copy_only=False),
            table.column("signature").to_numpy(zero_copy_only=False), strict=True):
        stored[row_id] = (chash, shingles, signature)


def merge_stored(records: Sequence[dict[str, Any]], stored: dict[str, tuple[str, Any, Any]], params: DedupParams
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(shingle offsets int64[N+1], shingles uint64[S], signatures uint32[N, P], from_store bool[N]) of
    ``records`` in order: the stored entry where it holds the same content, computed here for the rest."""
    hits = [stored.get(r["id"]) for r in records]
    hits = [h if h is not None and h[0] == content_hash(r["text"]) else None for h, r in zip(hits, records, strict=True)]
    missing = [i for i, h in enumerate(hits) if h is None]
    if missing:
        c_offsets, c_hashes, c_sigs = shingles_and_signatures([records[i]["text"] for i in missing], params)
    parts, sigs = [], np.empty((len(records), params.num_perm), np.uint32)
    cursor = 0
    for i, hit in enumerate(hits):
        if hit is not None:
            parts.append(np.asarray(hit[1], np.uint64))
            sigs[i] = hit[2]
        else:
            parts.append(c_hashes[c_offsets[cursor]:c_offsets[cursor + 1]])
            sigs[i] = c_sigs[cursor]
            cursor += 1
    offsets = np.zeros(len(records) + 1, np.int64)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    values = np.concatenate(parts).astype(np.uint64) if parts else np.zeros(0, np.uint64)
    return offsets, values, sigs, np.array([h is not None for h in hits], bool)


def load_store_features(records: Sequence[dict[str, Any]], batch_ids: Iterable[str], params: DedupParams,
                        root: str | os.PathLike[str] | None = None) -> tuple[Features, dict[str, Any]]:
    """Features of ``records`` (in order): stored signatures where a valid partition holds the
    record with the same content, computed here for the rest. Returns (features, report)."""
    stored: dict[str, tuple[str, Any, Any]] = {}
    report: dict[str, Any] = {"partitions": {}, "from_store": 0, "computed": 0}
    for batch_id in sorted(batch_ids):
        table, why = stored_partition(batch_id, params, root)
        report["partitions"][batch_id] = why
        if table is not None:
            add_stored_rows(stored, table)
    offsets, values, sigs, from_store = merge_stored(records, stored, params)
    report["from_store"] = int(from_store.sum())
    report["computed"] = len(records) - report["from_store"]
    return Features(sigs, np.diff(offsets) > 0, csr_jaccard(offsets, values)), report


def bucket_table(ids: Sequence[str], signatures: np.ndarray, params: DedupParams) -> pa.Table:
    """Stage 2: (band, key, ids) for every band key shared by >= 2 documents, via a Parquet-style group-by."""
    bands, rows = lsh_params(params.threshold, params.num_perm, params.target_recall, params.method)
    keys = K.band_keys(signatures, bands, rows) if len(ids) else np.zeros((0, bands), np.uint64)
    flat = pa.table({"band": np.tile(np.arange(bands, dtype=np.int32), len(ids)), "key": keys.reshape(-1),
                     "id": np.repeat(np.asarray(ids, dtype=object), bands)})
    grouped = flat.group_by(["band", "key"], use_threads=False).aggregate([("id", "list")])
    grouped = grouped.filter(pc.greater_equal(pc.list_value_length(grouped["id_list"]), 2))
    return grouped.rename_columns(["band", "key", "ids"]).sort_by([("band", "ascending"), ("key", "ascending")])


def cluster_table(clusters: dict[str, list[str]]) -> pa.Table:
    """Stage 3: one row per record: its id and its cluster's representative."""
    rows = [(member, rep) for rep, members in clusters.items() for member in members]
    return pa.table({"id": [m for m, _ in rows], "representative": [r for _, r in rows]})
