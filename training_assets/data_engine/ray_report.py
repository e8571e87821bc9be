"""The Ray engine's outputs: ``<root>/curated_corpus/`` streamed from the shards' parts, and the
``CurationReport`` built from the tasks' counts (the same numbers ``corpus.curate`` reports).

    out = write_outputs(work, root, n_shards, n_parts, results)
    report = build_report(root, config, results, out, info)
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from training_assets import paths
from training_assets.data_engine import corpus
from training_assets.data_engine.decontam import build_index
from training_assets.data_engine.dedup import lsh_params
from training_assets.data_engine.provenance import dataset_provenance
from training_assets.data_engine.ray_assemble import CLUSTER_SCHEMA, concat_parquet
from training_assets.data_engine.ray_reduce import BUCKET_SCHEMA
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


def build_report(root: Path, config: Any, results: dict[str, Any], out: dict[str, Any], info: dict[str, Any]
                 ) -> corpus.CurationReport:
    reasons = sum((Counter(r["reasons"]) for r in results["assembled"]), Counter())
    counts = _counts(results, reasons)
    params = config.dedup
    version = dataset_provenance(corpus._input_versions(root, config.extra_sources), config.to_dict(), counts, reasons)
    target = paths.asset_dir(corpus.CORPUS_ASSET, root)
    with atomic_dir(target) as tmp:
        for f in sorted(out["folder"].iterdir()):
            f.replace(tmp / f.name)
        write_json_atomic(tmp / corpus.VERSION_FILE, version.to_dict())
    bands, rows = lsh_params(params.threshold, params.num_perm, params.target_recall, params.method)
    candidates = sum(r["candidate_pairs"] for r in results["verified"])
    n_exact, n_dedup_dropped = reasons["dedup/exact_duplicate"], counts["decontaminate"] - counts["dedup"]
    dedup_stats = {"method": params.method, "threshold": params.threshold, "num_perm": params.num_perm,
                   "ngram": params.ngram, "seed": params.seed, "bands": bands, "rows": rows,
                   "candidate_pairs": candidates, "accepted_on_signature": 0, "checked_exactly": candidates,
                   "verified_pairs": sum(r["verified_pairs"] for r in results["verified"]),
                   "empty_documents": sum(r["empty_unique"] for r in results["bands"]),
                   "input": counts["decontaminate"], "kept": counts["dedup"], "exact_duplicates": n_exact,
                   "near_duplicates": n_dedup_dropped - n_exact,
                   "dedup_rate": n_dedup_dropped / counts["decontaminate"] if counts["decontaminate"] else 0.0}
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
