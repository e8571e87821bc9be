"""The Ray engine's last stages: every record's decision, clusters, and the corpus files.

``assemble_stage`` (one shard): each record's final answer in the local engine's words
(``dedup.assemble``): a repeated trace id, a quality or decontamination drop, an exact duplicate
(``same text as`` its exact root, ``duplicate_of`` the cluster's representative), a near
duplicate (its best verified similarity), or kept; kept records are checked once more against
the held-out index (residual overlaps). Dropped members go to their representative's shard.
``cluster_stage`` (one shard): cluster sizes and cluster rows of the representatives it holds.
``concat_parquet`` streams the shards' parts, in shard order, into one file written with the
project's Parquet settings in the same row groups ``storage.write_parquet`` makes, so the bytes
equal the local engine's.

    concat_parquet([Path("s0.parquet"), Path("s1.parquet")], CORPUS_SCHEMA, Path("corpus.parquet"))
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from training_assets.data_engine.corpus import CORPUS_SCHEMA, DECISION_SCHEMA, load_held_out_sets
from training_assets.data_engine.decontam import build_index, find_overlaps
from training_assets.data_engine.ray_files import (
    gpos_of,
    read_tables,
    row_of,
    save_table,
    shard_of,
    shards_with,
    write_partitioned,
)
from training_assets.data_engine.ray_reduce import LABEL_SCHEMA
from training_assets.data_engine.ray_shard import EXACT_DUP_SCHEMA, REPEAT_SCHEMA
from training_assets.storage import PARQUET_OPTIONS, write_parquet

MEMBER_SCHEMA = pa.schema([("root", pa.int64()), ("gpos", pa.int64()), ("id", pa.string())])
KEPT_SCHEMA = pa.schema([("gpos", pa.int64()), ("id", pa.string()), ("text", pa.string()), ("source", pa.string()),
                         ("trace_id", pa.string()), ("task_id", pa.string()), ("batch_id", pa.string()),
                         ("n_chars", pa.int64())])
CLUSTER_SCHEMA = pa.schema([("id", pa.string()), ("representative", pa.string())])


def _lookup_ids(work: Path, gpos: np.ndarray) -> dict[int, str]:
    """Record ids of ``gpos`` (any shard), read from the shards' record files (id column only)."""
    out: dict[int, str] = {}
    for shard in shards_with(gpos):
        ids = pq.read_table(work / "shards" / f"s{shard}" / "records.parquet", columns=["id"]).column("id")
        mine = np.unique(gpos[shard_of(gpos) == shard])
        out.update(zip(mine.tolist(), ids.take(pa.array(row_of(mine))).to_pylist(), strict=True))
    return out


def _labels(work: Path, shard: int) -> dict[int, tuple[int, float]]:
    table = read_tables(work / "labels" / f"s{shard}", LABEL_SCHEMA)
    return {g: (r, b) for g, r, b in zip(*(table.column(c).to_pylist() for c in ("gpos", "root", "best")), strict=True)}


def assemble_stage(work: str, shard: int, root: str, method: str, threshold: float, decontam: bool,
                   decontam_ngram: int, decontam_min_ngram: int, n_shards: int) -> dict[str, Any]:
    base = Path(work)
    records = pq.read_table(base / "shards" / f"s{shard}" / "records.parquet").to_pylist()
    gpos = gpos_of(shard, np.arange(len(records))).tolist()
    repeats = read_tables(base / "repeats", REPEAT_SCHEMA)
    repeat_of = dict(zip(repeats.column("gpos").to_pylist(), repeats.column("first_batch").to_pylist(), strict=True))
    exact = read_tables(base / "exact_dups" / f"s{shard}", EXACT_DUP_SCHEMA)
    exact_root = dict(zip(exact.column("gpos").to_pylist(), exact.column("root").to_pylist(), strict=True))
    labels = _labels(base, shard)
    roots = np.array(sorted(set(exact_root.values())), np.int64)
    for other in shards_with(roots):  # the labels of exact roots held by other shards
        if other != shard:
            wanted = set(roots[shard_of(roots) == other].tolist())
            labels.update({g: v for g, v in _labels(base, other).items() if g in wanted})

    def rep_of(g: int) -> int:
        return labels.get(g, (g, 0.0))[0]

    reps = {g: rep_of(exact_root.get(g, g)) for g in gpos if records[row_of(np.int64(g))]["stage"] is None
            and g not in repeat_of}
    names = _lookup_ids(base, np.array(sorted({*reps.values(), *exact_root.values()}), np.int64))
    decisions, kept, members, reasons = [], [], [], Counter()
    for g, r in zip(gpos, records, strict=True):
        row = {k: r[k] for k in ("id", "source", "batch_id", "trace_id", "task_id")}
        row.update(kept=False, duplicate_of=None, similarity=None)
        if g in repeat_of:
            row.update(id=f"{r['id']}@{r['batch_id']}", stage="input", reason="duplicate_trace_id",
                       detail=f"trace id already in batch {repeat_of[g]}", duplicate_of=r["id"])
        elif r["stage"] is not None:
            row.update(stage=r["stage"], reason=r["reason"], detail=r["detail"])
        elif reps[g] == g:
            row.update(kept=True, stage="kept", reason="kept", detail="passed every stage")
            kept.append({"gpos": g, **{k: r[k] for k in ("id", "text", "source", "trace_id", "task_id", "batch_id")},
                         "n_chars": len(r["text"])})
        else:
            rep = names[reps[g]]
            members.append({"root": reps[g], "gpos": g, "id": r["id"]})
            if g in exact_root:
                row.update(stage="dedup", reason="exact_duplicate", detail=f"same text as {names[exact_root[g]]}",
                           duplicate_of=rep, similarity=1.0)
            else:
                sim = labels[g][1]
                row.update(stage="dedup", reason="near_duplicate",
                           detail=f"{method} similarity {sim:.3f} >= {threshold} within the cluster of {rep}",
                           duplicate_of=rep, similarity=sim)
        if not row["kept"]:
            reasons[f"{row['stage']}/{row['reason']}"] += 1
        decisions.append(row)
    save_table(base / "final" / f"s{shard}" / "decisions.parquet", pa.Table.from_pylist(decisions, schema=DECISION_SCHEMA))
    save_table(base / "final" / f"s{shard}" / "kept.parquet", pa.Table.from_pylist(kept, schema=KEPT_SCHEMA))
    member_table = pa.Table.from_pylist(members, schema=MEMBER_SCHEMA)
    write_partitioned(base / "members", f"s{shard}", member_table, shard_of(member_table.column("root").to_numpy()),
                      n_shards, prefix="s")
    residual = []
    if decontam and kept:
        index = build_index(load_held_out_sets(root), decontam_ngram, decontam_min_ngram)
        residual = [k["id"] for k, hit in zip(kept, find_overlaps([k["text"] for k in kept], index), strict=True)
                    if hit is not None]
    return {"reasons": dict(reasons), "kept": len(kept), "residual": residual}


def cluster_stage(work: str, shard: int) -> dict[str, Any]:
    base = Path(work)
    kept = pq.read_table(base / "final" / f"s{shard}" / "kept.parquet")
    members = read_tables(base / "members" / f"s{shard}", MEMBER_SCHEMA).sort_by([("root", "ascending"),
                                                                                 ("gpos", "ascending")])
    by_root: dict[int, list[str]] = {}
    for g, rid in zip(members.column("root").to_pylist(), members.column("id").to_pylist(), strict=True):
        by_root.setdefault(g, []).append(rid)
    ids = kept.column("id").to_pylist()
    group = [by_root.get(g, []) for g in kept.column("gpos").to_pylist()]
    corpus = kept.drop_columns(["gpos", "n_chars"]).append_column(
        "cluster_size", pa.array([1 + len(m) for m in group], pa.int32())).append_column("n_chars", kept["n_chars"])
    save_table(base / "final" / f"s{shard}" / "corpus.parquet", corpus.select(CORPUS_SCHEMA.names).cast(CORPUS_SCHEMA))
    rows = [(m, rep) for rep, group_members in zip(ids, group, strict=True) for m in [rep, *group_members]]
    save_table(base / "final" / f"s{shard}" / "clusters.parquet",
               pa.table({"id": pa.array([m for m, _ in rows], pa.string()),
                         "representative": pa.array([r for _, r in rows], pa.string())}, schema=CLUSTER_SCHEMA))
    return {"sizes": dict(Counter(1 + len(m) for m in group))}


def concat_parquet(parts: Sequence[Path], schema: pa.Schema, target: Path) -> int:
    """Stream ``parts`` into ``target`` with row groups of exactly ``PARQUET_OPTIONS['row_group_size']``
    rows, each written from one contiguous table (as ``pq.write_table`` slices a whole table), so the
    file's bytes equal ``storage.write_parquet`` of the concatenated table. Holds one row group."""
    size = PARQUET_OPTIONS["row_group_size"]
    options = {k: v for k, v in PARQUET_OPTIONS.items() if k != "row_group_size"}
    pending: list[pa.Table] = []
    held = total = 0
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with pq.ParquetWriter(tmp, schema, **options) as writer:
        def flush(rows: int) -> None:
            nonlocal pending, held
            table = pa.concat_tables(pending).combine_chunks()
            writer.write_table(table.slice(0, rows), row_group_size=size)
            pending, held = [table.slice(rows)], held - rows
        for part in parts:
            for batch in pq.ParquetFile(part).iter_batches(batch_size=size):
                pending.append(pa.Table.from_batches([batch], schema=schema))
                held += batch.num_rows
                total += batch.num_rows
                while held >= size:
                    flush(size)
        if held:
            flush(held)
    if not total:  # write_table of an empty table: no row group at all
        write_parquet(tmp, schema.empty_table())
    os.replace(tmp, target)
    return total
