"""The Ray engine's outputs: ``<root>/curated_corpus/`` streamed from the shards' parts, and the
``CurationReport`` built from the tasks' counts (the same numbers ``local_engine.curate`` reports).

    out = write_outputs(work, root, n_shards, n_parts, results)
    report = build_report(root, config, results, out, info)
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from training_assets import paths
from training_assets.data_engine import corpus
from training_assets.data_engine.decontam import build_index
from training_assets.data_engine.dedup import DedupParams, DedupResult, lsh_params
from training_assets.data_engine.filters import Dropped
from training_assets.data_engine.provenance import dataset_provenance
from training_assets.data_engine.ray_assemble import CLUSTER_SCHEMA, concat_parquet
from training_assets.data_engine.ray_files import read_tables, row_of, shard_of
from training_assets.data_engine.ray_reduce import BUCKET_SCHEMA, EDGE_SCHEMA
from training_assets.storage import atomic_dir, sha256_file, write_json_atomic


def write_outputs(work: Path, root: Path, n_shards: int, n_parts: int, results: dict[str, Any]) -> dict[str, Any]:
    """Write corpus, decisions, buckets and clusters whole into a temp folder; -> the folder's parts.

    The version file needs the counts, so the caller finishes the folder (``build_report``)."""
    final = [work / "final" / f"s{s}" for s in range(n_shards)]
    tmp_dir = work / "output"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    concat_parquet([f / "corpus.parquet" for f in final], corpus.CORPUS_SCHEMA, tmp_dir / corpus.CORPUS_FILE)
    concat_parquet([f / "decisions.parquet" for f in final], corpus.DECISION_SCHEMA, tmp_dir / corpus.DECISIONS_FILE)
    concat_parquet([work / "buckets" / f"p{p}.parquet" for p in range(n_parts)], BUCKET_SCHEMA,
                   tmp_dir / corpus.BUCKETS_FILE)
    concat_parquet([f / "clusters.parquet" for f in final], CLUSTER_SCHEMA, tmp_dir / corpus.CLUSTERS_FILE)
    return {"folder": tmp_dir}


def _counts(results: dict[str, Any], reasons: Counter) -> dict[str, int]:
    def dropped(stage: str) -> int:
        return sum(n for key, n in reasons.items() if key.split("/", 1)[0] == stage)

    n_input = sum(r["records"] for r in results["shards"])
    counts = {"input": n_input, "unique_trace_ids": n_input - dropped("input")}
    counts["quality_filter"] = counts["unique_trace_ids"] - dropped("quality")
    counts["decontaminate"] = counts["quality_filter"] - dropped("decontaminate")
    counts["dedup"] = counts["decontaminate"] - dropped("dedup")
    return counts


def build_report(root: Path, config: corpus.CurationConfig, results: dict[str, Any], out: dict[str, Any],
                 info: dict[str, Any]) -> corpus.CurationReport:
    reasons = sum((Counter(r["reasons"]) for r in results["assembled"]), Counter())
    counts = _counts(results, reasons)
    params = config.dedup
    version = dataset_provenance(corpus.input_versions(root, config.extra_sources), config.to_dict(), counts, reasons)
    target = paths.asset_dir(corpus.CORPUS_ASSET, root)
    with atomic_dir(target) as tmp:
        for f in sorted(out["folder"].iterdir()):
            f.replace(tmp / f.name)
        write_json_atomic(tmp / corpus.VERSION_FILE, version.to_dict())
    dedup_stats = _dedup_stats(params, results, counts["decontaminate"], counts["dedup"], reasons["dedup/exact_duplicate"])
    index = build_index(corpus.load_held_out_sets(root), config.decontam_ngram, config.decontam_min_ngram)
    decontam_stats = {"input": counts["quality_filter"], "kept": counts["decontaminate"],
                      "dropped": counts["quality_filter"] - counts["decontaminate"], "index_ngrams": index.size,
                      "ngram": config.decontam_ngram, "min_ngram": config.decontam_min_ngram,
                      "too_short": [f"{s}/{i}" for s, i in index.too_short]}
    partitions = {spec["batch_id"]: r["store"] for spec, r in zip(results["specs"], results["shards"], strict=True)
                  if spec["kind"] == "batch"}
    store_report = {"partitions": dict(sorted(partitions.items())),
                    "from_store": sum(r["from_store"] for r in results["bands"]),
                    "computed": sum(r["computed"] for r in results["bands"])}
    sizes = sum((Counter(r["sizes"]) for r in results["clusters"]), Counter())
    residual = [i for r in results["assembled"] for i in r["residual"]]
    return corpus.CurationReport(version, target, counts, version.drop_reasons, dict(sorted(sizes.items())),
                                 dedup_stats, store_report, residual, decontam_stats,
                                 sha256_file(target / corpus.CORPUS_FILE)[:16], engine_info=info)


def _dedup_stats(params: DedupParams, results: dict[str, Any], n_input: int, n_kept: int, n_exact: int
                 ) -> dict[str, Any]:
    """``dedup``'s stats, from the tasks' counts (key for key what ``dedup_unique`` + ``assemble`` report)."""
    bands, rows = lsh_params(params.threshold, params.num_perm, params.target_recall, params.method)
    candidates = sum(r["candidate_pairs"] for r in results["verified"])
    return {"method": params.method, "threshold": params.threshold, "num_perm": params.num_perm,
            "ngram": params.ngram, "seed": params.seed, "bands": bands, "rows": rows,
            "candidate_pairs": candidates, "accepted_on_signature": 0, "checked_exactly": candidates,
            "verified_pairs": sum(r["verified_pairs"] for r in results["verified"]),
            "empty_documents": sum(r["empty_unique"] for r in results["bands"]),
            "input": n_input, "kept": n_kept, "exact_duplicates": n_exact, "near_duplicates": n_input - n_kept - n_exact,
            "dedup_rate": (n_input - n_kept) / n_input if n_input else 0.0}


def dedup_result(work: Path, records: list[dict[str, Any]], params: DedupParams, results: dict[str, Any],
                 n_parts: int) -> DedupResult:
    """The ``DedupResult`` of a ``filters=False`` run, read back from the shards' parts."""
    n_shards = len(results["specs"])
    decisions = pa.concat_tables([pq.read_table(work / "final" / f"s{s}" / "decisions.parquet") for s in range(n_shards)])
    clusters_table = pa.concat_tables([pq.read_table(work / "final" / f"s{s}" / "clusters.parquet")
                                       for s in range(n_shards)])
    kept, dropped = [], []
    for record, row in zip(records, decisions.to_pylist(), strict=True):
        if row["kept"]:
            kept.append(record)
        else:
            dropped.append(Dropped(row["id"], row["stage"], row["reason"], row["detail"], row["duplicate_of"],
                                   row["similarity"]))
    clusters: dict[str, list[str]] = {}
    for member, rep in zip(clusters_table.column("id").to_pylist(), clusters_table.column("representative").to_pylist(),
                           strict=True):
        clusters.setdefault(rep, []).append(member)
    starts = np.cumsum([0] + [spec["stop"] - spec["start"] for spec in results["specs"]])
    edges = read_tables_many([work / "edges" / f"n{q}" for q in range(n_parts)], EDGE_SCHEMA)
    src, dst, sim = (edges.column(c).to_numpy() for c in ("src", "dst", "sim"))
    forward = src < dst
    a = starts[shard_of(src[forward])] + row_of(src[forward])
    b = starts[shard_of(dst[forward])] + row_of(dst[forward])
    order = np.lexsort((b, a))
    pair_index = np.stack([a[order], b[order]], axis=1).astype(np.int64) if len(a) else np.zeros((0, 2), np.int64)
    n_exact = sum(d.reason == "exact_duplicate" for d in dropped)
    stats = _dedup_stats(params, results, len(records), len(kept), n_exact)
    return DedupResult(kept, clusters, dropped, pair_index, sim[forward][order], [r["id"] for r in records], stats)


def read_tables_many(folders: list[Path], schema: pa.Schema) -> pa.Table:
    return pa.concat_tables([read_tables(f, schema) for f in folders])
