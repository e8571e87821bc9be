"""The Ray engine's per-shard map stages (plain functions over files; ``ray_engine`` runs them as tasks).

``shard_stage`` (one input shard): read and normalise the records, run the quality filter and
decontamination, and for the records that pass, the exact-content hash, the shingle set and the
MinHash signature (stored signatures of ``minhash_signatures`` reused where they match, as in
``staged.load_store_features``); writes the shard's records and features and its pieces of the
id shuffle and the exact-hash shuffle. ``band_stage`` (after the exact reducers): the band keys
of the shard's documents into the band-keyed shuffle, range-partitioned by (band, key) so that
the reducers' outputs, concatenated in partition order, are sorted the way ``staged.bucket_table`` is.

    shard_stage(work, 0, {"kind": "batch", "batch_id": "b1", "start": 0, "stop": 100}, root, config)
"""

from __future__ import annotations

import hashlib
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from training_assets_kernels import dedup as K
from training_assets.data_engine import staged
from training_assets.data_engine.corpus import load_held_out_sets
from training_assets.data_engine.decontam import build_index, decontaminate
from training_assets.data_engine.dedup import DedupParams, content_hash, lsh_params
from training_assets.data_engine.filters import QualityConfig, normalize, quality_filter
from training_assets.data_engine.ray_files import (
    gpos_of,
    load_npy,
    read_tables,
    save_npy,
    save_table,
    write_partitioned,
)
from training_assets.data_engine.sources import _record, stream_corpus

RECORD_SCHEMA = pa.schema([
    ("id", pa.string()), ("text", pa.string()), ("source", pa.string()), ("trace_id", pa.string()),
    ("task_id", pa.string()), ("batch_id", pa.string()),
    ("stage", pa.string()), ("reason", pa.string()), ("detail", pa.string()),  # null: passed filter + decontam
])
ID_SCHEMA = pa.schema([("id", pa.string()), ("gpos", pa.int64()), ("trace", pa.bool_())])
EXACT_SCHEMA = pa.schema([("h1", pa.uint64()), ("h2", pa.uint64()), ("gpos", pa.int64())])
BAND_SCHEMA = pa.schema([("band", pa.int32()), ("key", pa.uint64()), ("gpos", pa.int64()), ("id", pa.string()),
                         ("lsh", pa.bool_())])
REPEAT_SCHEMA = pa.schema([("gpos", pa.int64()), ("first_batch", pa.string())])
EXACT_DUP_SCHEMA = pa.schema([("gpos", pa.int64()), ("root", pa.int64())])
BAND_KEY_BITS = 16  # top key bits that, with the band, pick a band partition


def string_partition(values: list[str], n_parts: int) -> np.ndarray:
    """A stable partition per string (BLAKE2b; Python's ``hash`` differs between processes)."""
    return np.fromiter((int.from_bytes(hashlib.blake2b(v.encode(), digest_size=8).digest(), "little") % n_parts
                        for v in values), np.int64, len(values))


def read_shard(spec: dict[str, Any], root: str) -> list[dict[str, Any]]:
    """The shard's records, exactly as ``local_engine.gather_records`` produces them (normalised, ids as there)."""
    start, stop = spec["start"], spec["stop"]
    if spec["kind"] == "batch":
        return staged.batch_records(spec["batch_id"], root)[start:stop]
    source = spec["source"]
    if spec["kind"] == "raw":  # dedup's records as given: no normalisation, no source fields
        table = pq.ParquetFile(source).read_row_groups(spec["row_groups"], columns=["id", "text"])
        return [{"id": i, "text": t} for i, t in zip(table.column("id").to_pylist(), table.column("text").to_pylist(),
                                                     strict=True)]
    if spec.get("row_groups") is not None:  # a slice of a Parquet source: its row groups, numbered globally
        label = Path(source).stem
        table = pq.ParquetFile(source).read_row_groups(spec["row_groups"])
        rows = [_record(obj, label, start + i, "text") for i, obj in enumerate(table.to_pylist())]
    else:
        rows = list(islice(stream_corpus(source), start, stop))
    return [{**r, "text": normalize(r["text"])} for r in rows]


def _stored_features(records: list[dict[str, Any]], spec: dict[str, Any], params: DedupParams, root: str
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str | None]:
    """(shingle offsets int64[N+1], shingles uint64[S], signatures uint32[N, P], from_store bool[N], why)."""
    stored: dict[str, tuple[str, Any, Any]] = {}
    why = None
    if spec["kind"] == "batch":
        table, why = staged.stored_partition(spec["batch_id"], params, root)
        if table is not None:
            staged.add_stored_rows(stored, table)
    return (*staged.merge_stored(records, stored, params), why)


def shard_stage(work: str, shard: int, spec: dict[str, Any], root: str, quality: QualityConfig | None,
                decontam: bool, decontam_ngram: int, decontam_min_ngram: int, params: DedupParams,
                n_parts: int) -> dict[str, Any]:
    """Map stage 1 of one shard; see the module docstring. Returns counts for the driver."""
    folder = Path(work) / "shards" / f"s{shard}"
    records = read_shard(spec, root)
    gpos = gpos_of(shard, np.arange(len(records)))
    ids = [r["id"] for r in records]
    write_partitioned(Path(work) / "ids", f"s{shard}", pa.table(
        {"id": pa.array(ids, pa.string()), "gpos": gpos, "trace": np.full(len(records), spec["kind"] == "batch")},
        schema=ID_SCHEMA), string_partition(ids, n_parts), n_parts)
    verdict: dict[int, tuple[str, str, str]] = {}  # record position -> (stage, reason, detail)
    position = {id(r): i for i, r in enumerate(records)}
    kept = records
    if quality is not None:  # drops come back in record order, so they match the records not kept
        kept, dropped = quality_filter(records, quality)
        kept_set = {id(r) for r in kept}
        lost = [i for i, r in enumerate(records) if id(r) not in kept_set]
        for i, d in zip(lost, dropped, strict=True):
            verdict[i] = (d.stage, d.reason, d.detail)
    if decontam:
        index = build_index(load_held_out_sets(root), decontam_ngram, decontam_min_ngram)
        decon = decontaminate(kept, index, decontam_ngram, decontam_min_ngram)
        clean = {id(r) for r in decon.kept}
        lost = [r for r in kept if id(r) not in clean]
        for r, d in zip(lost, decon.dropped, strict=True):
            verdict[position[id(r)]] = (d.stage, d.reason, d.detail)
        kept = decon.kept
    save_table(folder / "records.parquet", pa.Table.from_pylist(
        [{**{k: r.get(k) for k in ("id", "text", "source", "trace_id", "task_id", "batch_id")},
          **dict(zip(("stage", "reason", "detail"), verdict.get(i, (None, None, None)), strict=True))}
         for i, r in enumerate(records)], schema=RECORD_SCHEMA))
    rows = np.array([position[id(r)] for r in kept], np.int64)
    offsets, shingles, sigs, from_store, why = _stored_features(kept, spec, params, root)
    bands, band_rows = lsh_params(params.threshold, params.num_perm, params.target_recall, params.method)
    keys = K.band_keys(sigs, bands, band_rows) if len(kept) else np.zeros((0, bands), np.uint64)
    for name, array in (("rows", rows), ("shingle_offsets", offsets), ("shingles", shingles), ("keys", keys),
                        ("from_store", from_store)):
        save_npy(folder / f"{name}.npy", array)
    digests = [bytes.fromhex(content_hash(r["text"])) for r in kept]
    h1 = np.array([int.from_bytes(d[:8], "big") for d in digests], np.uint64)
    h2 = np.array([int.from_bytes(d[8:], "big") for d in digests], np.uint64)
    write_partitioned(Path(work) / "exact", f"s{shard}",
                      pa.table({"h1": h1, "h2": h2, "gpos": gpos[rows]}, schema=EXACT_SCHEMA),
                      (h1 % np.uint64(n_parts)).astype(np.int64), n_parts)
    return {"records": len(records), "survivors": len(kept), "store": why}


def band_partition(band: np.ndarray, key: np.ndarray, bands: int, n_parts: int) -> np.ndarray:
    """Partition of (band, key), monotone in (band, key): partition p holds one contiguous range."""
    top = (key >> np.uint64(64 - BAND_KEY_BITS)).astype(np.int64)
    return ((band.astype(np.int64) << BAND_KEY_BITS | top) * n_parts) // (bands << BAND_KEY_BITS)


def band_stage(work: str, shard: int, n_parts: int) -> dict[str, Any]:
    """Map stage 2 of one shard: band keys of its documents (repeats out) into the band shuffle.

    Every document that reached dedup goes in (``buckets.parquet`` lists them all, as the local
    engine's does); ``lsh`` marks those that make candidate pairs: non-empty and not an exact
    duplicate (the local engine runs LSH over the exact-deduplicated documents only).
    """
    base = Path(work)
    folder = base / "shards" / f"s{shard}"
    rows, keys = load_npy(folder / "rows.npy"), load_npy(folder / "keys.npy")
    offsets, from_store = load_npy(folder / "shingle_offsets.npy"), load_npy(folder / "from_store.npy")
    gpos = gpos_of(shard, rows)
    repeats = read_tables(base / "repeats", REPEAT_SCHEMA).column("gpos").to_numpy()
    dups = read_tables(base / "exact_dups" / f"s{shard}", EXACT_DUP_SCHEMA).column("gpos").to_numpy()
    eligible = ~np.isin(gpos, repeats)
    unique = eligible & ~np.isin(gpos, dups)
    lsh = unique & (np.diff(offsets) > 0)
    ids = pq.read_table(folder / "records.parquet", columns=["id"]).column("id").take(pa.array(rows[eligible]))
    n, bands = int(eligible.sum()), keys.shape[1]
    band = np.tile(np.arange(bands, dtype=np.int32), n)
    key = keys[eligible].reshape(-1)
    table = pa.table({"band": band, "key": key, "gpos": np.repeat(gpos[eligible], bands),
                      "id": pa.array(np.repeat(np.asarray(ids.to_pylist(), dtype=object), bands), pa.string()),
                      "lsh": np.repeat(lsh[eligible], bands)}, schema=BAND_SCHEMA)
    write_partitioned(base / "bands", f"s{shard}", table, band_partition(band, key, bands, n_parts), n_parts)
    return {"dedup_input": n, "unique": int(unique.sum()), "empty_unique": int((unique & ~lsh).sum()),
            "from_store": int(from_store[eligible].sum()), "computed": int((~from_store[eligible]).sum())}
