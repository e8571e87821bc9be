"""Settings models declared once, with their defaults and help: every layer derives from them.

    from training_assets.settings import GrpoConfig
    GrpoConfig(scale_rewards="none")                 # the library takes it as it is
    spec_config("GrpoGroupsConfig", GrpoConfig)      # Dagster run config (defs/settings.py)
    add_model_options(parser, GrpoConfig)            # CLI options (commands/options.py)

Pure pydantic and light to import (the CLI builds its parsers from them at start-up): the dataset
builders' settings live here; the trainers' (``TrainConfig`` and its nested specs) in
``trainers.config`` and LoRA's in ``peft_manager``, each its one declaration.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

# composite GRPO reward: weight per component (training_data.rewards scores each)
DEFAULT_REWARD_WEIGHTS: dict[str, float] = {"success": 1.0, "answer": 0.5, "tool_json": 0.2, "efficiency": 0.1, "length": 0.1}
_SETTINGS = ConfigDict(frozen=True, extra="forbid")


class SftConfig(BaseModel):
    """How ``sft_dataset`` is built from the kept successful traces."""

    model_config = _SETTINGS
    max_tokens: int = Field(1024, ge=8, description="Conversations longer than this (in tokens) are skipped, never truncated.")


class PreferenceConfig(BaseModel):
    """How ``preference_pairs`` pairs attempts at one task."""

    model_config = _SETTINGS
    max_pairs_per_task: int = Field(4, ge=1, description="At most this many pairs per task (caps how much one task weighs).")
    require_success: bool = Field(True, description="Chosen must be a successful attempt; off: a higher score suffices.")


class GrpoConfig(BaseModel):
    """How ``grpo_groups`` groups attempts per prompt and scores them."""

    model_config = _SETTINGS
    reward_weights: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_REWARD_WEIGHTS), description=(
        "Weight per reward component (success, answer, tool_json, efficiency, length)."))
    scale_rewards: Literal["group", "none"] = Field("group", description=(
        "'group': divide advantages by the group std (GRPO); 'none': Dr. GRPO (no division)."))
    min_group_size: int = Field(2, ge=2, description="Groups with fewer completions are skipped.")
    min_pass_rate: float = Field(0.0, ge=0.0, le=1.0, description="Groups passing less often are dropped.")
    max_pass_rate: float = Field(1.0, ge=0.0, le=1.0, description="Groups passing more often are dropped.")
    drop_zero_variance: bool = Field(True, description="Drop groups whose rewards are all equal (all-zero advantages: no signal).")


class PretrainConfig(BaseModel):
    """How ``pretrain_windows`` packs the curated corpus."""

    model_config = _SETTINGS
    window: int = Field(256, ge=16, description="Tokens per packed window (the pretraining context length).")


class KtoConfig(BaseModel):
    """How ``binary_feedback`` labels each kept trace for KTO."""

    model_config = _SETTINGS
    max_per_task: int = Field(8, ge=1, description=(
        "At most this many traces per task, successes first (caps how much one task weighs)."))


# dataset asset -> the settings of its builder (training_data.builders.BUILDERS holds the builders)
DATASET_SETTINGS: dict[str, type[BaseModel]] = {
    "sft_dataset": SftConfig, "preference_pairs": PreferenceConfig, "grpo_groups": GrpoConfig,
    "pretrain_windows": PretrainConfig,
    "binary_feedback": KtoConfig,
}


def fields_model(model: type[BaseModel], names: Sequence[str]) -> type[BaseModel]:
    """``model`` cut to the fields ``names`` (their types, defaults, help and bounds unchanged): what a layer
    offers when it lets users set only these, e.g. ``add_model_options(p, fields_model(CurationConfig, ["engine"]))``."""
    return create_model(model.__name__, __config__=_SETTINGS,
                        **{name: (model.model_fields[name].annotation, model.model_fields[name]) for name in names})


class LoopSettings(BaseModel):
    """The loop's sizes; the defaults are the CPU run the README reports (`make loop`)."""

    model_config = ConfigDict(extra="forbid")

    generations: int = Field(2, ge=1, le=20, description="Generations to train after the base (generation 0).")
    model: str = Field("smollm2-135m-instruct", description="The base: a fetch recipe or an HF model folder.")
    teacher_tasks: int = Field(150, ge=0, description="Training-pool tasks whose ideal conversations are written "
                                                      "as the teacher batch in generation 0 (0: none).")
    collect_tasks: int = Field(30, ge=1, description="Training-pool tasks the served model attempts each generation.")
    attempts: int = Field(2, ge=1, le=8, description="Attempts per task (sampled): success/failure pairs and GRPO groups.")
    temperature: float = Field(0.7, ge=0.0, description="Sampling temperature while collecting (the held-out eval is greedy).")
    held_out_tasks: int = Field(105, ge=1, description="Held-out tasks of the agentic eval (families in turn).")
    concurrency: int = Field(8, ge=1, le=64, description="Attempts in flight against a server that batches (vLLM, continuous "
                             "batching); a sequential server gets one at a time.")
    engine: Literal["auto", "transformers", "vllm"] = Field("auto", description="Model server engine.")
    sft_steps: int = Field(28, ge=1, description="SFT optimizer steps (every weight: the graph's sft kind; 28 x 8: ~1.5 passes over the teacher batch).")
    dpo_steps: int = Field(6, ge=1, description="DPO optimizer steps on the success/failure pairs.")
    grpo_steps: int = Field(3, ge=1, description="GRPO optimizer steps on the logged attempts' task reward.")
    batch_size: int = Field(8, ge=1, description="Examples per optimizer step (SFT; DPO and GRPO take half).")
    lr: float = Field(2e-4, gt=0, description="SFT learning rate (the sft kind trains every weight).")
    adapter_lr: float = Field(5e-5, gt=0, description="DPO and GRPO learning rate (LoRA r=16 on the SFT model).")
    max_seq_len: int = Field(1536, ge=128, description="Tokens per training example, tools in the system turn included "
                             "(a lists conversation, seven tools, is ~1,240); longer ones are left out and counted.")
    seed: int = Field(0, description="Training and sampling seed.")
