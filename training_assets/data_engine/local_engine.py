"""The local engine: the whole curation in one process, ``curate(root, config)`` -> ``<root>/curated_corpus/``.

traces (+ extra sources) -> normalise -> quality filter -> decontaminate -> exact/near dedup, with an
answer for every input record (``decisions.parquet``). The files and the report are ``corpus``'s
contract, which the Ray engine (``ray_engine``) writes too, byte for byte; the two engines never import
each other, and ``data_engine.curate`` (``engines``) picks one from ``config.engine``.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from training_assets import ingest, paths
from training_assets.data_engine import staged
from training_assets.data_engine.corpus import (
    BUCKETS_FILE,
    CLUSTERS_FILE,
    CORPUS_ASSET,
    CORPUS_FILE,
    CORPUS_SCHEMA,
    DECISION_SCHEMA,
    DECISIONS_FILE,
    VERSION_FILE,
    CurationConfig,
    CurationReport,
    input_versions,
    load_held_out_sets,
)
from training_assets.data_engine.decontam import build_index, decontaminate, find_overlaps
from training_assets.data_engine.dedup import DedupResult, dedup
from training_assets.data_engine.filters import Dropped, normalize, quality_filter
from training_assets.data_engine.provenance import dataset_provenance
from training_assets.data_engine.sources import stream_corpus
from training_assets.storage import atomic_dir, sha256_file, write_json_atomic, write_parquet


def gather_records(root: str | os.PathLike[str] | None, extra_sources: Sequence[str] = ()
                   ) -> tuple[list[dict[str, Any]], list[Dropped]]:
    """Every materialised trace partition (rendered, normalised), then the extra sources.

    Returns (records, repeats): a trace whose id already came in an earlier batch (batches in id
    order) is a repeat, not a new record: its record id becomes ``<trace id>@<batch id>`` and it
    is dropped before any stage, its decision naming the batch that had it first. Extra sources
    must lie under the data root or an allowed source folder (``paths.confine_path``), checked
    before any record is read.
    """
    for i, source in enumerate(extra_sources):
        paths.confine_path(source, f"extra_sources[{i}]", root)
    records, repeats = [], []
    first_batch: dict[str, str] = {}
    for batch_id in ingest.materialized_batches(root):
        for record in staged.batch_records(batch_id, root):
            if record["id"] in first_batch:
                repeats.append(Dropped(f"{record['id']}@{batch_id}", "input", "duplicate_trace_id",
                                       f"trace id already in batch {first_batch[record['id']]}",
                                       duplicate_of=record["id"]))
                record = {**record, "id": repeats[-1].id}
            else:
                first_batch[record["id"]] = batch_id
            records.append(record)
    for source in extra_sources:
        for record in stream_corpus(source):
            records.append({**record, "text": normalize(record["text"])})
    return records, repeats


def _decision_rows(records: Sequence[dict[str, Any]], dropped: Sequence[Dropped]) -> list[dict[str, Any]]:
    by_id = {d.id: d for d in dropped}
    rows = []
    for r in records:
        d = by_id.get(r["id"])
        row = {"id": r["id"], "source": r.get("source"), "batch_id": r.get("batch_id"), "trace_id": r.get("trace_id"),
               "task_id": r.get("task_id"), "kept": d is None,
               "stage": "kept", "reason": "kept", "detail": "passed every stage", "duplicate_of": None,
               "similarity": None}
        if d is not None:
            row.update(stage=d.stage, reason=d.reason, detail=d.detail, duplicate_of=d.duplicate_of,
                       similarity=d.similarity)
        rows.append(row)
    return rows


def curate(root: str | os.PathLike[str] | None = None, config: CurationConfig | None = None) -> CurationReport:
    """Run the whole pipeline in this process over the data root and write ``<root>/curated_corpus/``.

    The engine fields of ``config`` are not read here: ``data_engine.curate`` (``engines``) picks the engine."""
    config = config or CurationConfig()
    records, repeats = gather_records(root, config.extra_sources)
    ids = Counter(r["id"] for r in records)
    if len(ids) != len(records):
        dup = sorted(i for i, n in ids.items() if n > 1)[:5]
        raise ValueError(f"curate: record ids {dup} occur more than once across sources; give extra sources "
                         "their own ids")
    counts = {"input": len(records), "unique_trace_ids": len(records) - len(repeats)}
    repeated = {d.id for d in repeats}
    kept, dropped = quality_filter([r for r in records if r["id"] not in repeated], config.quality)
    dropped = repeats + dropped
    counts["quality_filter"] = len(kept)
    index = build_index(load_held_out_sets(root), config.decontam_ngram, config.decontam_min_ngram)
    decon = decontaminate(kept, index, config.decontam_ngram, config.decontam_min_ngram)
    dropped += decon.dropped
    counts["decontaminate"] = len(decon.kept)
    params = config.dedup
    features, store_report = (staged.load_store_features(decon.kept, ingest.materialized_batches(root), params, root)
                              if params.method == "minhash" else (None, {"partitions": {}, "from_store": 0, "computed": 0}))
    result: DedupResult = dedup(decon.kept, params.method, params.threshold, params.num_perm, params.ngram,
                                params.seed, params.target_recall, features=features)
    dropped += result.dropped
    counts["dedup"] = len(result.kept)
    residual = [r["id"] for r, hit in zip(result.kept, find_overlaps([r["text"] for r in result.kept], index),
                                          strict=True) if hit is not None]
    version = dataset_provenance(input_versions(root, config.extra_sources), config.to_dict(), counts, dropped)
    out = paths.asset_dir(CORPUS_ASSET, root)
    with atomic_dir(out) as tmp:
        corpus_rows = [{**{k: r.get(k) for k in ("id", "text", "source", "trace_id", "task_id", "batch_id")},
                        "cluster_size": len(result.clusters[r["id"]]), "n_chars": len(r["text"])} for r in result.kept]
        write_parquet(tmp / CORPUS_FILE, pa.Table.from_pylist(corpus_rows, schema=CORPUS_SCHEMA))
        write_parquet(tmp / DECISIONS_FILE, pa.Table.from_pylist(_decision_rows(records, dropped), schema=DECISION_SCHEMA))
        unique_ids = [r["id"] for r in decon.kept]
        sigs = features.signatures if features is not None else None
        if sigs is not None:
            write_parquet(tmp / BUCKETS_FILE, staged.bucket_table(unique_ids, sigs, params))
        write_parquet(tmp / CLUSTERS_FILE, staged.cluster_table(result.clusters))
        write_json_atomic(tmp / VERSION_FILE, version.to_dict())
    return CurationReport(version, out, counts, version.drop_reasons, result.cluster_sizes(), result.stats,
                          store_report, residual, decon.stats, sha256_file(out / CORPUS_FILE)[:16])
