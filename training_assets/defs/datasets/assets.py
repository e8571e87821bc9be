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

from training_assets.defs.automation import BATCH_ASSET, follow_condition
from training_assets.defs.metadata import counts_table, table
from training_assets.defs.resources import DataRoot
from training_assets.training_data import pipeline, selection
from training_assets.training_data.rewards import DEFAULT_REWARD_WEIGHTS

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


def _result(report: pipeline.DatasetReport) -> dg.MaterializeResult:
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


class SftDatasetConfig(dg.Config):
    max_tokens: int = Field(1024, ge=8, description="Conversations longer than this (in tokens) are skipped, never truncated.")


@dg.asset(group_name="datasets", code_version=pipeline.DATASETS_VERSION, automation_condition=FOLLOW, kinds={"parquet"},
          deps=["selected_traces", "held_out_sets", "tokenizer"],
          check_specs=_specs("sft_dataset", ["no_empty_completions", "end_of_turn_in_mask", "no_held_out_overlap"]))
def sft_dataset(config: SftDatasetConfig, data_root: DataRoot) -> dg.MaterializeResult:
    """Successful traces as chat examples: input_ids and an assistant-only loss mask (end-of-turn included)."""
    return _result(pipeline.build_sft_dataset(data_root.root(), pipeline.SftConfig(config.max_tokens)))


class PreferencePairsConfig(dg.Config):
    max_pairs_per_task: int = Field(4, ge=1, description="At most this many pairs per task.")
    require_success: bool = Field(True, description="Chosen must be a successful attempt; off: a higher score suffices.")


@dg.asset(group_name="datasets", code_version=pipeline.DATASETS_VERSION, automation_condition=FOLLOW, kinds={"parquet", "polars"},
          deps=["selected_traces", "held_out_sets"],
          check_specs=_specs("preference_pairs", ["no_empty_completions", "chosen_differs_from_rejected", "no_held_out_overlap"]))
def preference_pairs(config: PreferencePairsConfig, data_root: DataRoot) -> dg.MaterializeResult:
    """Better/worse attempts at the same task, split where they diverge, with the rejected one's failure point."""
    return _result(pipeline.build_preference_dataset(
        data_root.root(), pipeline.PreferenceConfig(config.max_pairs_per_task, config.require_success)))


class GrpoGroupsConfig(dg.Config):
    reward_weights: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_REWARD_WEIGHTS),
                                             description="Weight per reward component (success, answer, tool_json, efficiency, length).")
    scale_rewards: Literal["group", "none"] = Field("group", description="'group': divide by the group std (GRPO); 'none': Dr. GRPO.")
    min_group_size: int = Field(2, ge=2, description="Groups with fewer completions are skipped.")
    min_pass_rate: float = Field(0.0, ge=0.0, le=1.0, description="Groups passing less often are dropped.")
    max_pass_rate: float = Field(1.0, ge=0.0, le=1.0, description="Groups passing more often are dropped.")
    drop_zero_variance: bool = Field(True, description="Drop groups whose rewards are all equal (zero advantages).")


@dg.asset(group_name="datasets", code_version=pipeline.DATASETS_VERSION, automation_condition=FOLLOW, kinds={"parquet", "polars"},
          deps=["selected_traces", "held_out_sets"],
          check_specs=_specs("grpo_groups", ["no_empty_completions", "advantages_zero_mean", "no_held_out_overlap"]))
def grpo_groups(config: GrpoGroupsConfig, data_root: DataRoot) -> dg.MaterializeResult:
    """Attempts grouped per prompt with composite rewards and group-normalised advantages."""
    return _result(pipeline.build_grpo_dataset(data_root.root(), pipeline.GrpoConfig(
        dict(config.reward_weights), config.scale_rewards, config.min_group_size, config.min_pass_rate,
        config.max_pass_rate, config.drop_zero_variance)))


class PretrainWindowsConfig(dg.Config):
    window: int = Field(256, ge=16, description="Tokens per packed window (the pretraining context length).")


@dg.asset(group_name="datasets", code_version=pipeline.DATASETS_VERSION, automation_condition=FOLLOW, kinds={"parquet"},
          deps=["curated_corpus", "held_out_sets", "tokenizer"],
          check_specs=_specs("pretrain_windows", ["no_cross_document_loss", "no_held_out_overlap"]))
def pretrain_windows(config: PretrainWindowsConfig, data_root: DataRoot) -> dg.MaterializeResult:
    """The curated corpus tokenised and packed into fixed windows with per-document positions and labels."""
    return _result(pipeline.build_pretrain_dataset(data_root.root(), pipeline.PretrainConfig(config.window)))
