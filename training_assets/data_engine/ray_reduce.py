"""The Ray engine's reduce stages: id repeats, exact duplicates, LSH buckets, verification and
distributed connected components (plain functions over files; ``ray_engine`` runs them as tasks).

- ``id_reduce`` (one id partition): a trace id seen again in a later position is a repeat
  (``local_engine.gather_records``'s rule); ids that collide otherwise are reported to the driver.
- ``exact_reduce`` (one content-hash partition): every document's exact root is the first
  document (smallest gpos) with the same 128-bit content hash (BLAKE2b, ``dedup.content_hash``);
  the local engine compares bytes inside 64-bit hash groups, so the two differ only on a
  128-bit collision.
- ``band_reduce`` (one (band, key) range): buckets shared by two or more documents
  (``buckets.parquet``) and the candidate pairs among their LSH documents, sent to the shard of
  the pair's first document.
- ``verify_stage`` (one shard's pairs): distinct pairs, exact Jaccard from the stored shingle
  sets (``K.jaccard_pairs``, the floor at the threshold, as ``dedup_unique``), kept pairs sent
  to both nodes' partitions (``node % parts``) as directed edges.
- ``cc_init`` / ``cc_round`` / ``cc_final`` (one node partition each): min-label propagation.
  Each node starts with its own gpos as label; a round takes the minimum of its label and the
  labels its neighbours sent, and only nodes whose label fell send it on. It stops when no label
  changes (rounds = the largest component's diameter + 1); the label is then the component's
  smallest gpos, which is ``K.union_find``'s root: the first record in input order. No task
  holds more than one partition's edges.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from training_assets_kernels import dedup as K
from training_assets.data_engine.ray_files import (
    group_pairs,
    group_starts,
    load_npy,
    read_arrays,
    read_tables,
    row_of,
    save_npy,
    save_table,
    shard_of,
    shards_with,
    write_partitioned,
    write_partitioned_npy,
)
from training_assets.data_engine.ray_shard import (
    BAND_SCHEMA,
    EXACT_DUP_SCHEMA,
    EXACT_SCHEMA,
    ID_SCHEMA,
    REPEAT_SCHEMA,
)

BUCKET_SCHEMA = pa.schema([("band", pa.int32()), ("key", pa.uint64()), ("ids", pa.list_(pa.string()))])
EDGE_SCHEMA = pa.schema([("src", pa.int64()), ("dst", pa.int64()), ("sim", pa.float64())])
LABEL_SCHEMA = pa.schema([("gpos", pa.int64()), ("root", pa.int64()), ("best", pa.float64())])


def id_reduce(work: str, part: int, shard_batches: list[str | None]) -> dict[str, Any]:
    table = read_tables(Path(work) / "ids" / f"p{part}", ID_SCHEMA).sort_by("gpos")
    first: dict[str, int] = {}
    seen_other: dict[str, int] = {}
    repeats, firsts, collisions = [], [], set()
    for rid, gpos, trace in zip(table.column("id").to_pylist(), table.column("gpos").to_pylist(),
                                table.column("trace").to_pylist(), strict=True):
        if trace and rid in first:
            repeats.append(gpos)
            firsts.append(shard_batches[int(shard_of(np.int64(first[rid])))])
            continue
        if rid in first or rid in seen_other:
            collisions.add(rid)
        (first if trace else seen_other)[rid] = gpos
    save_table(Path(work) / "repeats" / f"p{part}.parquet",
               pa.table({"gpos": pa.array(repeats, pa.int64()), "first_batch": pa.array(firsts, pa.string())},
                        schema=REPEAT_SCHEMA))
    return {"repeats": len(repeats), "collisions": sorted(collisions)[:5]}


def exact_reduce(work: str, part: int, n_shards: int) -> dict[str, Any]:
    base = Path(work)
    table = read_tables(base / "exact" / f"p{part}", EXACT_SCHEMA)
    repeats = read_tables(base / "repeats", REPEAT_SCHEMA).column("gpos").to_numpy()
    h1, h2, gpos = (table.column(c).to_numpy() for c in ("h1", "h2", "gpos"))
    keep = ~np.isin(gpos, repeats)
    h1, h2, gpos = h1[keep], h2[keep], gpos[keep]
    order = np.lexsort((gpos, h2, h1))
    h1, h2, gpos = h1[order], h2[order], gpos[order]
    starts = group_starts(h1, h2)
    root = np.repeat(gpos[starts], np.diff(np.append(starts, len(gpos))))
    dup = root != gpos
    dups = pa.table({"gpos": gpos[dup], "root": root[dup]}, schema=EXACT_DUP_SCHEMA)
    write_partitioned(base / "exact_dups", f"p{part}", dups, shard_of(gpos[dup]), n_shards, prefix="s")
    return {"exact_duplicates": int(dup.sum())}


def band_reduce(work: str, part: int, n_shards: int) -> dict[str, Any]:
    base = Path(work)
    table = read_tables(base / "bands" / f"p{part}", BAND_SCHEMA)
    band, key, gpos = (table.column(c).to_numpy() for c in ("band", "key", "gpos"))
    order = np.lexsort((gpos, key, band))
    band, key, gpos = band[order], key[order], gpos[order]
    ids = table.column("id").take(pa.array(order)).combine_chunks()
    lsh = table.column("lsh").to_numpy(zero_copy_only=False)[order]
    starts = group_starts(band, key)
    sizes = np.diff(np.append(starts, len(gpos)))
    shared = sizes >= 2
    members = np.repeat(shared, sizes)
    list_offsets = np.zeros(int(shared.sum()) + 1, np.int32)
    np.cumsum(sizes[shared], out=list_offsets[1:])
    buckets = pa.table({"band": band[starts[shared]], "key": key[starts[shared]],
                        "ids": pa.ListArray.from_arrays(pa.array(list_offsets), ids.filter(pa.array(members)))},
                       schema=BUCKET_SCHEMA)
    save_table(base / "buckets" / f"p{part}.parquet", buckets)
    sel = lsh & members  # documents that make candidate pairs, still grouped by (band, key)
    pairs = group_pairs(gpos[sel], group_starts(band[sel], key[sel]))
    pairs = np.unique(pairs, axis=0) if len(pairs) else pairs
    write_partitioned_npy(base / "pairs", f"p{part}", pairs, shard_of(pairs[:, 0]), n_shards, prefix="s")
    return {"buckets": int(shared.sum()), "bucket_pairs": int(len(pairs))}


def _shingle_sets(work: Path, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR (offsets int64[D+1], shingles uint64[S]) of documents ``docs`` (sorted gpos), read from
    each shard's stored shingles (memory-mapped: only these documents' blocks are touched)."""
    lengths = np.zeros(len(docs), np.int64)
    pieces, where = [], []
    for shard in shards_with(docs):
        folder = work / "shards" / f"s{shard}"
        rows = load_npy(folder / "rows.npy")
        offsets, shingles = load_npy(folder / "shingle_offsets.npy"), load_npy(folder / "shingles.npy", mmap=True)
        mine = np.nonzero(shard_of(docs) == shard)[0]
        local = np.searchsorted(rows, row_of(docs[mine]))
        starts, ends = offsets[local], offsets[local + 1]
        lengths[mine] = ends - starts
        take = np.repeat(starts - np.concatenate([[0], np.cumsum(ends - starts)[:-1]]), ends - starts)
        pieces.append(np.asarray(shingles[take + np.arange(len(take))]))
        where.append(mine)
    out_offsets = np.zeros(len(docs) + 1, np.int64)
    np.cumsum(lengths, out=out_offsets[1:])
    values = np.zeros(int(out_offsets[-1]), np.uint64)
    for mine, piece in zip(where, pieces, strict=True):
        dest = np.repeat(out_offsets[mine], lengths[mine]) + (
            np.arange(len(piece)) - np.repeat(np.concatenate([[0], np.cumsum(lengths[mine])[:-1]]), lengths[mine]))
        values[dest] = piece
    return out_offsets, values


def verify_stage(work: str, shard: int, threshold: float, n_parts: int) -> dict[str, Any]:
    base = Path(work)
    pairs = read_arrays(base / "pairs" / f"s{shard}", 2)
    pairs = np.unique(pairs, axis=0) if len(pairs) else pairs
    docs = np.unique(pairs)
    offsets, values = _shingle_sets(base, docs)
    slots = np.searchsorted(docs, pairs)
    sims = K.jaccard_pairs(slots, offsets[:-1], offsets[1:], values, threshold) if len(pairs) else np.zeros(0)
    good = sims >= threshold
    a, b, s = pairs[good, 0], pairs[good, 1], sims[good]
    edges = pa.table({"src": np.concatenate([a, b]), "dst": np.concatenate([b, a]), "sim": np.concatenate([s, s])},
                     schema=EDGE_SCHEMA)
    write_partitioned(base / "edges", f"s{shard}", edges, edges.column("src").to_numpy() % n_parts, n_parts, prefix="n")
    return {"candidate_pairs": int(len(pairs)), "verified_pairs": int(good.sum())}


def _send(work: Path, round_no: int, part: int, dst: np.ndarray, label: np.ndarray, n_parts: int) -> int:
    """Messages (dst, label) to the destination nodes' partitions, the smallest label per node only."""
    if len(dst):
        order = np.lexsort((label, dst))
        dst, label = dst[order], label[order]
        first = group_starts(dst)
        dst, label = dst[first], label[first]
    messages = np.stack([dst, label], axis=1) if len(dst) else np.zeros((0, 2), np.int64)
    write_partitioned_npy(work / "cc" / f"r{round_no}", f"n{part}", messages, dst % n_parts, n_parts, prefix="n")
    return int(len(dst))


def cc_init(work: str, part: int, n_parts: int) -> dict[str, Any]:
    base = Path(work)
    edges = read_tables(base / "edges" / f"n{part}", EDGE_SCHEMA)
    src, dst, sim = (edges.column(c).to_numpy() for c in ("src", "dst", "sim"))
    order = np.lexsort((dst, src))
    src, dst, sim = src[order], dst[order], sim[order]
    starts = group_starts(src)
    nodes = src[starts]
    best = np.maximum.reduceat(sim, starts) if len(sim) else np.zeros(0)
    folder = base / "cc" / f"n{part}"
    for name, array in (("src", src), ("dst", dst), ("nodes", nodes), ("best", best), ("labels_0", nodes)):
        save_npy(folder / f"{name}.npy", array)
    return {"nodes": int(len(nodes)), "sent": _send(base, 0, part, dst, src, n_parts)}


def cc_round(work: str, part: int, round_no: int, n_parts: int) -> dict[str, Any]:
    """Round ``round_no`` >= 1: apply the messages of round - 1, send on the labels that fell."""
    base = Path(work)
    folder = base / "cc" / f"n{part}"
    nodes, labels = load_npy(folder / "nodes.npy"), load_npy(folder / f"labels_{round_no - 1}.npy")
    messages = read_arrays(base / "cc" / f"r{round_no - 1}" / f"n{part}", 2)
    new = labels.copy()
    if len(messages):
        np.minimum.at(new, np.searchsorted(nodes, messages[:, 0]), messages[:, 1])
    changed = new < labels
    save_npy(folder / f"labels_{round_no}.npy", new)
    src, dst = load_npy(folder / "src.npy"), load_npy(folder / "dst.npy")
    node_of_edge = np.searchsorted(nodes, src)
    moving = changed[node_of_edge]
    sent = _send(base, round_no, part, dst[moving], new[node_of_edge[moving]], n_parts)
    return {"changed": int(changed.sum()), "sent": sent}


def cc_final(work: str, part: int, round_no: int, n_shards: int) -> dict[str, Any]:
    """Each node's component root and best similarity, sent to the node's shard."""
    base = Path(work)
    folder = base / "cc" / f"n{part}"
    nodes = load_npy(folder / "nodes.npy")
    table = pa.table({"gpos": nodes, "root": load_npy(folder / f"labels_{round_no}.npy"),
                      "best": load_npy(folder / "best.npy")}, schema=LABEL_SCHEMA)
    write_partitioned(base / "labels", f"n{part}", table, shard_of(nodes), n_shards, prefix="s")
    return {"nodes": int(len(nodes)), "roots": int(len(np.unique(table.column("root").to_numpy())))}
