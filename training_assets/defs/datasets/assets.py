"""selected_traces, then sft_dataset, preference_pairs, grpo_groups, pretrain_windows: what the trainers consume.

``selected_traces`` is the one selection of traces (one row per trace, kept or dropped with the
stage, reason and batch) that SFT, DPO and GRPO read; pretraining windows read the curated
corpus. Each dataset's data version is ``fingerprint(key, sha256(data.parquet))``, where the key
holds the input versions (selection, corpus, held-out sets), the tokenizer and chat-template
hashes and the config: Dagster marks the datasets stale when an upstream version or the code
version changes, and a changed config shows up as a new data version downstream.
"""

from typing import Literal

import dagster as dg
from pydantic import Field

from training_assets import kinds
from training_assets.defs.automation import BATCH_ASSET, follow_condition
from training_assets.defs.metadata import counts_table, table
from training_assets.defs.resources import DataRoot
from training_assets.defs.settings import spec_config
from training_assets.training_data import builders, selection

CURATED_CHECK = "every_trace_curated"
FOLLOW = follow_condition()
CHECK_DESCRIPTIONS = {
    "no_empty_completions": "Every completion has assistant content or a tool call.",
    "end_of_turn_in_mask": "Every example trains on an end-of-turn token (so the model learns to stop).",
    "no_held_out_overlap": "No row shares a 13-gram with a held-out example.",
    "chosen_differs_from_rejected": "Chosen and rejected continuations differ in every pair.",
    "advantages_zero_mean": "Advantages average to 0 within every group.",
    "no_cross_document_loss": "No label is trained across a document boundary.",
}


class SelectedTracesConfig(dg.Config):
    near_duplicates: Literal["keep_within_task", "drop", "keep"] = Field(
        "keep_within_task", description="Near duplicates in the corpus: keep attempts at the same task (pairs and "
                                        "groups compare them), drop them all, or keep them all.")


@dg.asset(group_name="datasets", code_version=selection.SELECTION_VERSION, kinds={"parquet", "polars"},
          automation_condition=follow_condition((BATCH_ASSET,)),
          deps=[dg.AssetDep("raw_traces", partition_mapping=dg.AllPartitionMapping()), "curated_corpus"],
          check_specs=[dg.AssetCheckSpec(CURATED_CHECK, asset="selected_traces", blocking=True,
                                         description="Every trace has a decision of the current curated corpus.")])
def selected_traces(config: SelectedTracesConfig, data_root: DataRoot) -> dg.MaterializeResult:
    """Every trace of every batch, kept or dropped for training with the stage, reason and batch id."""
    report = selection.select_traces(data_root.root(), selection.SelectionConfig(config.near_duplicates))
    return dg.MaterializeResult(
        metadata={**report.counts, "dagster/row_count": report.counts["traces"],
                  "by_reason": counts_table(report.by_reason, "stage/reason (decision)", "traces"),
                  "by_batch": table([{"batch_id": b, **n} for b, n in report.by_batch.items()], ["batch_id", "kept", "dropped"]),
                  "key": dg.MetadataValue.json(report.key), "uri": dg.MetadataValue.path(str(report.output_dir))},
        data_version=dg.DataVersion(report.data_version),
        check_results=[dg.AssetCheckResult(
            check_name=CURATED_CHECK, passed=not report.not_curated, severity=dg.AssetCheckSeverity.ERROR,
            metadata={"not_curated_traces": report.counts["not_curated"]},
            description=None if not report.not_curated else
            f"batches {report.not_curated[:5]} are newer than curated_corpus: re-materialise curated_corpus")],
    )


def _specs(asset: str, names: list[str]) -> list[dg.AssetCheckSpec]:
    return [dg.AssetCheckSpec(n, asset=asset, blocking=True, description=CHECK_DESCRIPTIONS[n]) for n in names]


def _result(report: builders.DatasetReport) -> dg.MaterializeResult:
    info = report.info
    stats = dict(info.stats)
    skipped = stats.pop("builder_skipped", {})
    return dg.MaterializeResult(
        metadata={
            "rows": info.rows,
            "dagster/row_count": info.rows,
            **{k: dg.MetadataValue.json(v) if isinstance(v, dict) else v for k, v in stats.items() if v is not None},
            "skipped": counts_table(skipped),
            "preview": table(report.preview),
            "key": dg.MetadataValue.json(info.key),
            "reused": report.reused,
            "data_version": info.data_version,
            "uri": dg.MetadataValue.path(str(info.path)),
        },
        data_version=dg.DataVersion(info.data_version),
        check_results=[
            dg.AssetCheckResult(check_name=c.name, passed=c.passed, severity=dg.AssetCheckSeverity.ERROR,
                                description=c.description, metadata={k: dg.MetadataValue.json(v) for k, v in c.details.items()})
            for c in report.checks
        ],
    )


def dataset_asset(asset: str) -> dg.AssetsDefinition:
    """One training dataset asset from its builder (``builders.BUILDERS``): config, inputs and checks derived."""
    builder = builders.BUILDERS[asset]
    config_class = spec_config(f"{builder.config.__name__}Run", builder.config)

    def build(config: config_class, data_root: DataRoot) -> dg.MaterializeResult:  # type: ignore[valid-type]
        return _result(builder.build(data_root.root(), builder.config(**config.model_dump())))

    return dg.asset(name=asset, group_name="datasets", code_version=builders.DATASETS_VERSION,
                    automation_condition=FOLLOW, kinds={"parquet"}, deps=list(builder.inputs),
                    check_specs=_specs(asset, list(builder.checks)), description=builder.description)(build)


# one asset per training kind's dataset (training_assets.kinds), each built by its builder
dataset_assets = [dataset_asset(asset) for asset in dict.fromkeys(kinds.DATASETS)]
