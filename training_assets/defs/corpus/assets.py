"""held_out_sets, minhash_signatures[batch] and curated_corpus: the curation stage.

The MinHash shingling (``ngram``, ``num_perm``, ``seed``) that ``minhash_signatures`` stores and
``curated_corpus`` must match to reuse those signatures is declared once, as the ``minhash``
resource (``resources.MinhashShingling``): both assets read the same instance, so they cannot
disagree. The run configs derive from the library's settings models (``CurationConfig``,
``QualityConfig``, ``HeldOutConfig``): a field's default and help are declared there once.
"""

import glob
from typing import Literal

import dagster as dg
from pydantic import Field

from training_assets import data_engine
from training_assets.data_engine import staged
from training_assets.data_engine.corpus import RUN_ONLY_FIELDS, HeldOutConfig
from training_assets.defs.automation import batch_condition, corpus_condition, once_condition
from training_assets.defs.corpus.resources import DEDUP_DEFAULTS, MinhashShingling
from training_assets.defs.metadata import counts_table, figure_png, png_markdown, table
from training_assets.defs.partitions import trace_batches
from training_assets.defs.resources import DataRoot
from training_assets.defs.settings import spec_config
from training_assets.traces import check_batch_id

NO_OVERLAP_CHECK = "no_held_out_overlap"
DEDUP_RATE_CHECK = "dedup_rate_within_bounds"


HeldOutSetsConfig = spec_config("HeldOutSetsConfig", HeldOutConfig)


@dg.asset(group_name="corpus", code_version=data_engine.CURATION_VERSION, kinds={"parquet"},
          automation_condition=once_condition())
def held_out_sets(config: HeldOutSetsConfig, data_root: DataRoot) -> dg.MaterializeResult:
    """Held-out eval examples that training data must not contain (indexed by decontamination)."""
    root = data_root.root()
    patterns = config.paths or [str(root / "held_out" / "*.jsonl")]
    files = sorted({f for p in patterns for f in glob.glob(p)})
    info = data_engine.write_held_out_sets(files, root, config.fields)
    return dg.MaterializeResult(
        metadata={"examples": info["examples"], "per_set": counts_table(info["per_set"], "eval_set", "examples"),
                  "files": table([{"file": f} for f in files], ["file"]), "dagster/row_count": info["examples"],
                  "uri": dg.MetadataValue.path(info["uri"])},
        data_version=dg.DataVersion(info["data_version"]),
    )


@dg.asset(partitions_def=trace_batches, group_name="corpus", code_version=data_engine.CURATION_VERSION,
          deps=["raw_traces"], kinds={"parquet", "numba"}, automation_condition=batch_condition())
def minhash_signatures(context: dg.AssetExecutionContext, minhash: MinhashShingling, data_root: DataRoot
                       ) -> dg.MaterializeResult:
    """Stage 1 of staged dedup: MinHash signatures and shingle sets of one batch, computed once."""
    batch_id = check_batch_id(context.partition_key)
    info = staged.write_partition_signatures(batch_id, minhash.params(), data_root.root())
    return dg.MaterializeResult(
        metadata={"documents": info["documents"], "params": info["params"], "dagster/row_count": info["documents"],
                  "uri": dg.MetadataValue.path(info["uri"])},
        data_version=dg.DataVersion(info["data_version"]),
    )


def _flat(config_class: type[dg.Config]) -> dict:
    """A derived config's fields, to declare flat in another (run configs keep ``min_chars`` at the top)."""
    return {name: (info.annotation, info) for name, info in config_class.model_fields.items()}


# What a run may set of CurationConfig besides the quality thresholds (all of them, flat) and the dedup
# method and threshold: the shingling is the ``minhash`` resource's. No demo changes a default.
CURATION_FIELDS = ("decontam_ngram", "decontam_min_ngram", "extra_sources", *RUN_ONLY_FIELDS)
QUALITY_FIELDS = tuple(data_engine.QualityConfig.model_fields)
_CuratedCorpusFields = spec_config(
    "CuratedCorpusFields", data_engine.CurationConfig, CURATION_FIELDS,
    **_flat(spec_config("QualityOptions", data_engine.QualityConfig)),
    method=(Literal["minhash", "cosine"], Field(DEDUP_DEFAULTS["method"], description=(
        "Near-dup method: 'minhash' (Jaccard of word n-grams) or 'cosine'. Shingling: the minhash resource."))),
    threshold=(float, Field(DEDUP_DEFAULTS["threshold"],
                            description="Similarity at or above which two records are duplicates.")),
    min_dedup_rate=(float, Field(0.0, ge=0.0, le=1.0, description=(
        "Blocking check: lowest acceptable share of records removed by dedup."))),
    max_dedup_rate=(float, Field(0.5, ge=0.0, le=1.0, description=(
        "Blocking check: highest acceptable share (more means a broken source)."))),
)


class CuratedCorpusConfig(_CuratedCorpusFields):
    """Run config of ``curated_corpus``: CurationConfig's and QualityConfig's fields, the dedup choice and the
    dedup-rate check's bounds."""

    def to_library(self, minhash: MinhashShingling) -> data_engine.CurationConfig:
        values = self.model_dump()
        return data_engine.CurationConfig(
            quality=data_engine.QualityConfig(**{k: values[k] for k in QUALITY_FIELDS}),
            dedup=minhash.params(self.method, self.threshold), **{k: values[k] for k in CURATION_FIELDS})


def _cluster_plot(sizes: dict[int, int]) -> dg.MetadataValue:
    import matplotlib  # ~0.5 s, only when a plot is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # matplotlib: after use("Agg"), only when a plot is drawn

    fig, ax = plt.subplots(figsize=(5, 3))
    ax.bar([str(k) for k in sizes], list(sizes.values()))
    ax.set_xlabel("cluster size (records)")
    ax.set_ylabel("clusters")
    ax.set_yscale("log")
    ax.set_title("near/exact duplicate clusters")
    png = figure_png(fig)
    plt.close(fig)
    return png_markdown(png, "cluster sizes")


@dg.asset(
    group_name="corpus", code_version=data_engine.CURATION_VERSION, kinds={"parquet", "numba"},
    automation_condition=corpus_condition(),
    deps=[dg.AssetDep("raw_traces", partition_mapping=dg.AllPartitionMapping()),
          dg.AssetDep("minhash_signatures", partition_mapping=dg.AllPartitionMapping()), "held_out_sets"],
    check_specs=[
        dg.AssetCheckSpec(NO_OVERLAP_CHECK, asset="curated_corpus", blocking=True,
                          description="No kept record shares an n-gram with a held-out example."),
        dg.AssetCheckSpec(DEDUP_RATE_CHECK, asset="curated_corpus", blocking=True,
                          description="The share of records removed by dedup is within [min_dedup_rate, max_dedup_rate]."),
    ],
)
def curated_corpus(context: dg.AssetExecutionContext, config: CuratedCorpusConfig, minhash: MinhashShingling,
                   data_root: DataRoot) -> dg.MaterializeResult:
    """Traces rendered to text, normalised, quality-filtered, decontaminated and deduplicated, with a
    decision (kept, or dropped with the reason and duplicate-of) for every input record."""
    report = data_engine.curate(data_root.root(), config.to_library(minhash))
    context.log.info(f"curation: {report.stage_counts}; signatures {report.store_report}")
    rate = report.dedup_stats["dedup_rate"]
    rate_ok = config.min_dedup_rate <= rate <= config.max_dedup_rate
    return dg.MaterializeResult(
        metadata={
            "records": report.stage_counts["dedup"],
            "dagster/row_count": report.stage_counts["dedup"],
            "counts_per_stage": counts_table(report.stage_counts, "stage", "records left"),
            "drop_reasons": counts_table(report.drop_reasons),
            "cluster_sizes": _cluster_plot(report.cluster_sizes),
            "dedup": dg.MetadataValue.json(report.dedup_stats),
            "signatures": dg.MetadataValue.json(report.store_report),
            "engine": config.engine,
            **({"ray": dg.MetadataValue.json(report.engine_info)} if report.engine_info else {}),
            **({"ray_dashboard": dg.MetadataValue.url(report.engine_info["dashboard_url"])}
               if report.engine_info.get("dashboard_url") else {}),
            "dataset_version": report.version.id,
            "uri": dg.MetadataValue.path(str(report.output_dir)),
        },
        data_version=dg.DataVersion(report.version.id),
        check_results=[
            dg.AssetCheckResult(
                check_name=NO_OVERLAP_CHECK, passed=not report.residual_overlaps, severity=dg.AssetCheckSeverity.ERROR,
                metadata={"overlapping_records": len(report.residual_overlaps),
                          "index_ngrams": report.decontam_stats["index_ngrams"],
                          "held_out_too_short": len(report.decontam_stats["too_short"])},
                description=None if not report.residual_overlaps else
                f"kept records still overlap held-out examples: {report.residual_overlaps[:5]}"),
            dg.AssetCheckResult(
                check_name=DEDUP_RATE_CHECK, passed=rate_ok, severity=dg.AssetCheckSeverity.ERROR,
                metadata={"dedup_rate": rate, "min_dedup_rate": config.min_dedup_rate,
                          "max_dedup_rate": config.max_dedup_rate},
                description=None if rate_ok else
                f"dedup removed {rate:.1%} of records, outside "
                f"[{config.min_dedup_rate:.0%}, {config.max_dedup_rate:.0%}]"),
        ],
    )
