"""Evaluation settings declared once, with their defaults and help: every layer derives from them.

    EvalSettings(max_new_tokens=16, gate=GateThresholds(min_pass_rate=0.8))
    spec_config("EvalReportConfig", EvalSettings, RUN_FIELDS)    # the eval report assets' run config
    add_model_options(parser, GateThresholds)                   # ``training-assets evaluate`` options

``EvalSettings`` is how a checkpoint is evaluated (generation, lm-eval, device) and ``gate`` what
its report must reach (``gates.decide_gate``). Defaults are the library's: the demo's changes
(tiny models trained for seconds) are made, with their reasons, where the assets declare their
run configs (``defs/evaluation/assets.py``). Pure pydantic: nothing heavy is imported.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from training_assets.evaluation.benchmarks import DEFAULT_BENCHMARKS
from training_assets.evaluation.device import DTYPES

_SETTINGS = ConfigDict(frozen=True, extra="forbid")
Dtype = Literal[DTYPES]  # type: ignore[valid-type]  # the values device.resolve_device accepts


class GateThresholds(BaseModel):
    """What an eval report must reach. The library's defaults check nothing but the overall pass rate's
    floor of 0: a run sets its thresholds (docs/evaluation.md)."""

    model_config = _SETTINGS
    min_pass_rate: float = Field(0.0, ge=0.0, le=1.0, description=(
        "Gate: lowest overall reliability pass rate (production sets e.g. 0.8)."))
    min_category_pass_rate: dict[str, float] = Field(default_factory=dict, description=(
        "Gate per category, e.g. {'safety': 1.0}; a category with no cases fails."))
    max_bits_per_byte: float | None = Field(None, description=(
        "Gate on the perplexity task in absolute bits/byte (production sets it from its current model, e.g. 1.0); "
        "empty: not checked."))
    max_bpb_vs_uniform: float | None = Field(None, description=(
        "Gate on the perplexity task: bits/byte as a share of a uniform guess over the vocabulary (1.0 = chance); "
        "needs benchmark_tasks; empty: not checked."))
    max_regression: float = Field(0.0, ge=0.0, description=(
        "Promotion gate: how much worse than the registered model a metric may be (absolute for rates, relative "
        "for bits/byte)."))
    regression_metrics: list[str] | None = Field(None, description=(
        "Metrics that must be no worse than the registered model's; empty: every metric both reports have."))


class EvalSettings(BaseModel):
    """How a checkpoint is evaluated, and the gate its report must pass."""

    model_config = _SETTINGS
    max_new_tokens: int = Field(32, ge=1, description="Greedy tokens generated per case.")
    benchmark_tasks: tuple[str, ...] = Field(DEFAULT_BENCHMARKS, description=(
        "lm-eval tasks (shipped YAML names or lm-eval's own); [] skips lm-eval."))
    benchmark_limit: int = Field(0, ge=0, description=(
        "Examples per lm-eval task (0 = all: 60 multiple-choice tasks, 40 transcripts)."))
    device: str = Field("auto", description=(
        'Where the checkpoint is evaluated: "auto" (the first GPU when torch sees one, else the CPU), "cpu", '
        '"cuda" or "cuda:N".'))
    dtype: Dtype = Field("auto", description=(
        'Weights dtype: "auto" (bfloat16 on a GPU, float32 on the CPU), "float32", "bfloat16" or "float16". '
        "A non-fp32 report is not compared with fp32 ones (its eval_config differs)."))
    batch_size: int = Field(32, ge=1, description="Cases per left-padded greedy generate call (and lm-eval's batch).")
    gate: GateThresholds = Field(default_factory=GateThresholds, description="What the report must reach.")


RUN_FIELDS = tuple(name for name in EvalSettings.model_fields if name != "gate")
