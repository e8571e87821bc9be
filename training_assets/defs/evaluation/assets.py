"""Eval reports: the reliability suite and lm-eval benchmarks per checkpoint, with the gates.

One report per training kind with a gate (``training_assets.kinds``): ``sft_eval_report`` gates
alignment (dpo/grpo depend on it); ``dpo_eval_report`` and ``grpo_eval_report`` gate the merge
(``merged_adapter`` depends on both); ``merged_eval_report`` gates registration, also against the model currently registered for the role. Each gate is a blocking
asset check: when it fails, downstream assets do not run and the check says why.
"""

import os
from typing import Optional

import dagster as dg
from pydantic import Field

from training_assets import kinds, paths
from training_assets.defs.automation import follow_condition
from training_assets.defs.metadata import md_table, png_markdown
from training_assets.defs.resources import DataRoot, MlflowTracking
from training_assets.registry import DEFAULT_MODEL_NAME, ModelRegistry, RegistryError
from training_assets.storage import fingerprint, sha256_file
from training_assets import evaluation
from training_assets.checkpoint_manifest import read_manifest

GATE_CHECK = "eval_gate"


def _benchmark_limit() -> int:
    raw = os.environ.get("TRAINING_ASSETS_EVAL_BENCHMARK_LIMIT", "30")
    if not raw.isdigit():
        raise ValueError(f"TRAINING_ASSETS_EVAL_BENCHMARK_LIMIT={raw!r}: set a count of examples per lm-eval task "
                         "(0 = all)")
    return int(raw)


BENCHMARK_LIMIT = _benchmark_limit()


class EvalReportConfig(dg.Config):
    cases_path: str = Field("", description=(
        "JSONL eval cases, under the data root or a folder of $TRAINING_ASSETS_SOURCE_DIRS; empty = the shipped "
        "reliability suite (eval_tasks/)."))
    max_new_tokens: int = Field(32, ge=1, description="Greedy tokens generated per case.")
    benchmark_tasks: list[str] = Field(list(evaluation.DEFAULT_BENCHMARKS),
                                       description="lm-eval tasks (shipped YAML names or lm-eval's own); [] skips lm-eval.")
    benchmark_limit: int = Field(BENCHMARK_LIMIT, ge=0, description=(
        "Examples per lm-eval task (0 = all: 60 multiple-choice tasks, 40 transcripts); 30 keeps the demo fast. "
        "Default from TRAINING_ASSETS_EVAL_BENCHMARK_LIMIT: runs the automation launches take the defaults."))
    device: str = Field("auto", description=(
        'Where the checkpoint is evaluated: "auto" (the first GPU when torch sees one, else the CPU), "cpu", "cuda" '
        'or "cuda:N".'))
    dtype: str = Field("auto", description=(
        'Weights dtype: "auto" (bfloat16 on a GPU, float32 on the CPU), "float32", "bfloat16" or "float16". '
        "A non-fp32 report is not compared with fp32 ones (its eval_config differs)."))
    batch_size: int = Field(32, ge=1, description="Cases per left-padded greedy generate call (and lm-eval's batch).")
    min_pass_rate: float = Field(0.0, ge=0.0, le=1.0, description=(
        "Gate: overall reliability pass rate. 0 on the demo (seconds-trained tiny models); production sets e.g. 0.8."))
    min_category_pass_rate: dict[str, float] = Field({}, description="Gate per category, e.g. {'safety': 1.0} in production.")
    max_bpb_vs_uniform: Optional[float] = Field(0.97, description=(
        "Gate on the perplexity task: bits/byte as a share of a uniform guess over the vocabulary (1.0 = chance). "
        "0.97 on the demo rejects an untrained model (about 1.0) and passes the seconds-trained ones (about 0.91); "
        "production relies on max_bits_per_byte and the regression check."))
    max_bits_per_byte: Optional[float] = Field(None, description=(
        "Gate on the perplexity task in absolute bits/byte; production sets it from its current model (e.g. 1.0)."))
    max_regression: float = Field(0.02, ge=0.0, description=(
        "Promotion gate: how much worse than the registered model a metric may be (absolute for rates, relative "
        "for bits/byte)."))
    regression_metrics: Optional[list[str]] = Field(
        ["pass_rate", "ta_held_out_perplexity/bits_per_byte"], description=(
            "Metrics that must be no worse than the registered model's (None = every metric both reports have). "
            "The demo leaves out 30-item accuracies and per-category rates, whose steps (1/30, 1/8) exceed the tolerance."))

    def thresholds(self) -> evaluation.GateThresholds:
        return evaluation.GateThresholds(
            min_pass_rate=self.min_pass_rate, min_category_pass_rate=dict(self.min_category_pass_rate),
            max_bits_per_byte=self.max_bits_per_byte, max_bpb_vs_uniform=self.max_bpb_vs_uniform,
            max_regression=self.max_regression, regression_metrics=self.regression_metrics)


class AlignedEvalConfig(EvalReportConfig):
    max_new_tokens: int = Field(16, ge=1, description="Greedy tokens generated per case.")
    benchmark_tasks: list[str] = Field([], description="lm-eval tasks; none by default (the demo's time goes to the gates).")
    max_bpb_vs_uniform: Optional[float] = Field(None, description="Gate on the perplexity task (needs benchmark_tasks).")


class PromotionEvalConfig(EvalReportConfig):
    role: str = Field("generator", description="Compare with the model registered for this role (none: thresholds only).")
    model_name: str = Field(DEFAULT_MODEL_NAME, description="MLflow registered model holding the role aliases.")


def _baseline(context: dg.AssetExecutionContext, config: EvalReportConfig, cases: list,
              tracking_uri: str) -> tuple[dict, Optional[str]]:
    """Metrics of the model registered for the role, on this very eval setup.

    Stored metrics are reused when they came from the same cases, tasks and limits; otherwise the
    registered snapshot is evaluated again, so the comparison is never between different tests.
    """
    if not isinstance(config, PromotionEvalConfig):
        return {}, None
    try:
        registry = ModelRegistry(tracking_uri, config.model_name)
        current = registry.pick_for_role(config.role)
    except RegistryError:
        return {}, None  # first registration for the role: thresholds only
    name = f"v{current.version} ({current.checkpoint_id})"
    tasks, limit = config.benchmark_tasks, config.benchmark_limit or None
    summary = current.lineage.eval_summary
    dtype = evaluation.resolve_device(config.device, config.dtype).dtype
    if summary.get("eval_config") == evaluation.eval_config_id(cases, tasks, limit, config.max_new_tokens, dtype):
        return dict(summary.get("metrics", {})), name
    context.log.info(f"registered {name} was evaluated with another setup: evaluating its snapshot again")
    payload = evaluation.run_eval_report(registry.local_dir(current), cases, evaluation.GateThresholds(),
                                         benchmark_tasks=tasks, benchmark_limit=limit,
                                         max_new_tokens=config.max_new_tokens, device=config.device,
                                         dtype=config.dtype, batch_size=config.batch_size)
    return payload["metrics"], f"{name}, re-evaluated"


def _evaluate(context: dg.AssetExecutionContext, asset_key: str, checkpoint: str, config: EvalReportConfig,
              root, tracking_uri: str) -> dg.MaterializeResult:
    # run config names the cases file: it must lie under the data root or an allowed source folder
    cases_file = (str(paths.confine_path(config.cases_path, f"{asset_key} config cases_path", root))
                  if config.cases_path else str(evaluation.DEFAULT_CASES))
    manifest = read_manifest(root, checkpoint)
    cases = evaluation.load_cases(cases_file)
    baseline, baseline_name = _baseline(context, config, cases, tracking_uri)
    payload = evaluation.run_eval_report(
        paths.asset_dir(checkpoint, root), cases, config.thresholds(), baseline,
        baseline_name, config.benchmark_tasks, config.benchmark_limit or None, config.max_new_tokens,
        device=config.device, dtype=config.dtype, batch_size=config.batch_size)
    payload |= {"checkpoint_asset": checkpoint, "checkpoint_data_version": manifest.data_version,
                "cases_path": cases_file}
    version = fingerprint(payload["checkpoint_data_version"], sha256_file(cases_file), config.model_dump(),
                          evaluation.EVAL_VERSION, baseline)
    out = evaluation.write_eval_report(paths.asset_dir(asset_key, root), payload)
    gate, metrics = payload["gate"], payload["metrics"]
    context.log.info(f"{asset_key}: pass rate {metrics['pass_rate']:.3f}; gate {'passed' if gate['passed'] else 'FAILED'}")
    categories = [{"category": k, **v} for k, v in payload["report"]["by_category"].items()]
    failed = [{"id": r["id"], "category": r["category"], "why": "; ".join(c["reason"] for c in r["checks"] if not c["passed"]),
               "output": r["output"][:80]} for r in payload["report"]["results"] if not r["passed"]]
    bench = [{"task": t, **{k: round(v, 4) for k, v in m.items()}} for t, m in payload["benchmarks"]["tasks"].items()]
    return dg.MaterializeResult(
        metadata={
            "uri": dg.MetadataValue.path(str(out)),
            "checkpoint": checkpoint,
            "pass_rate": metrics["pass_rate"],
            "pass_rate_by_category": md_table(categories, ["category", "n", "passed", "pass_rate"]),
            "benchmarks": md_table(bench) if bench else dg.MetadataValue.text(payload["benchmarks"].get("skipped", "none run")),
            "failed_cases": md_table(failed[:20], ["id", "category", "why", "output"]),
            "chart": png_markdown(evaluation.eval_chart_png(metrics, baseline or None, f"{asset_key} ({checkpoint})"),
                                  "pass rates"),
            "compared_to": str(baseline_name),
        },
        data_version=dg.DataVersion(version),
        check_results=[dg.AssetCheckResult(
            check_name=GATE_CHECK, passed=gate["passed"], severity=dg.AssetCheckSeverity.ERROR,
            metadata={"reasons": md_table([{"condition": r} for r in gate["reasons"]]),
                      "thresholds": dg.MetadataValue.json(payload["thresholds"])},
            description="; ".join(gate["reasons"]) if not gate["passed"] else "all gate conditions hold",
        )],
    )


def _eval_asset(asset_key: str, checkpoint: str, config_class: type, description: str):
    @dg.asset(
        name=asset_key, deps=[checkpoint], group_name="evaluation", code_version=evaluation.EVAL_VERSION,
        kinds={"json"}, description=description, automation_condition=follow_condition(),
        check_specs=[dg.AssetCheckSpec(GATE_CHECK, asset=asset_key, blocking=True,
                                       description="Thresholds hold (and, for promotion, no worse than the registered model).")],
    )
    def _asset(context: dg.AssetExecutionContext, config: config_class, data_root: DataRoot,
               mlflow: MlflowTracking) -> dg.MaterializeResult:
        root = data_root.root()
        return _evaluate(context, asset_key, checkpoint, config, root, mlflow.uri(root))

    return _asset


def _gate_description(kind: kinds.TrainingKind) -> str:
    stops = [k.checkpoint for k in kinds.KINDS.values() if k.upstream == kind.checkpoint]
    if kind.name in kinds.MERGED_KINDS:
        stops.append("merged_adapter")
    suite = "Reliability suite + lm-eval" if not kind.adapter else "Reliability suite"
    return f"{suite} on {kind.checkpoint}; its gate stops {', '.join(stops) or 'nothing downstream'}."


# One report per gated kind (full checkpoints also run lm-eval; adapters only the gates), then the promotion gate.
kind_eval_reports = [_eval_asset(kind.gate, kind.checkpoint, AlignedEvalConfig if kind.adapter else EvalReportConfig,
                                 _gate_description(kind)) for kind in kinds.KINDS.values() if kind.gate]
merged_eval_report = _eval_asset("merged_eval_report", "merged_adapter", PromotionEvalConfig,
                                 "Promotion gate: thresholds and no worse than the model registered for the role.")
