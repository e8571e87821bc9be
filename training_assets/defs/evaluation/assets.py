"""Eval reports: the reliability suite and lm-eval benchmarks per checkpoint, with the gates.

One report per training kind with a gate (``training_assets.kinds``): ``sft_eval_report`` gates
alignment (dpo/grpo depend on it); ``dpo_eval_report`` and ``grpo_eval_report`` gate the merge
(``merged_adapter`` depends on both); ``merged_eval_report`` gates registration, also against the model currently registered for the role. Each gate is a blocking
asset check: when it fails, downstream assets do not run and the check says why.

The run configs derive from ``evaluation.EvalSettings`` and ``GateThresholds`` (a field's help and
default declared there once); the demo's default changes are ``DEMO_RUN`` / ``DEMO_GATE`` and the
adapters' ``ALIGNED_RUN`` / ``ALIGNED_GATE``, each with its reason.
"""

import os
from typing import Optional

import dagster as dg
from pydantic import Field

from training_assets import kinds, paths
from training_assets.defs.automation import follow_condition
from training_assets.defs.metadata import md_table, png_markdown
from training_assets.defs.resources import DataRoot, MlflowTracking
from training_assets.registry import DEFAULT_MODEL_NAME, ModelRegistry
from training_assets.storage import fingerprint, sha256_file
from training_assets import evaluation
from training_assets.checkpoint_manifest import read_manifest
from training_assets.defs.settings import spec_config
from training_assets.evaluation.settings import RUN_FIELDS

GATE_CHECK = "eval_gate"


def _benchmark_limit() -> int:
    raw = os.environ.get("TRAINING_ASSETS_EVAL_BENCHMARK_LIMIT", "30")
    if not raw.isdigit():
        raise ValueError(f"TRAINING_ASSETS_EVAL_BENCHMARK_LIMIT={raw!r}: set a count of examples per lm-eval task "
                         "(0 = all)")
    return int(raw)


BENCHMARK_LIMIT = _benchmark_limit()


# The demo's changes to the library's defaults (tiny models trained for seconds, on a CPU), with their reasons.
DEMO_RUN = {"benchmark_limit": BENCHMARK_LIMIT}  # 30 examples per lm-eval task keep the demo fast
DEMO_GATE = {
    "max_bpb_vs_uniform": 0.97,  # rejects an untrained model (about 1.0), passes the seconds-trained ones (about 0.91)
    "max_regression": 0.02,
    # 30-item accuracies and per-category rates move in steps (1/30, 1/8) larger than the tolerance
    "regression_metrics": ["pass_rate", "ta_held_out_perplexity/bits_per_byte"],
}
# adapters run only the gates: fewer tokens, no lm-eval (the demo's time goes to the gates), so no bpb ceiling
ALIGNED_RUN = DEMO_RUN | {"max_new_tokens": 16, "benchmark_tasks": []}
ALIGNED_GATE = DEMO_GATE | {"max_bpb_vs_uniform": None}
CASES_PATH = (str, Field("", description=(
    "JSONL eval cases, under the data root or a folder of $TRAINING_ASSETS_SOURCE_DIRS; empty = the shipped "
    "reliability suite (eval_tasks/).")))


def _eval_config(name: str, run: dict, gate: dict, **extra) -> type[dg.Config]:
    """A run config with EvalSettings's run fields and GateThresholds's fields flat (``min_pass_rate`` at the top)."""
    gate_fields = spec_config(f"{name}Gate", evaluation.GateThresholds, defaults=gate).model_fields
    return spec_config(name, evaluation.EvalSettings, RUN_FIELDS, run, cases_path=CASES_PATH,
                       **{k: (info.annotation, info) for k, info in gate_fields.items()}, **extra)


EvalReportConfig = _eval_config("EvalReportConfig", DEMO_RUN, DEMO_GATE)
AlignedEvalConfig = _eval_config("AlignedEvalConfig", ALIGNED_RUN, ALIGNED_GATE)
PromotionEvalConfig = _eval_config(
    "PromotionEvalConfig", DEMO_RUN, DEMO_GATE,
    role=(str, Field("generator", description="Compare with the model registered for this role (none: thresholds only).")),
    model_name=(str, Field(DEFAULT_MODEL_NAME, description="MLflow registered model holding the role aliases.")))


def eval_settings(config: dg.Config) -> evaluation.EvalSettings:
    """The library's settings from an eval report's run config (validated there: bounds, dtype)."""
    values = config.model_dump()
    gate = evaluation.GateThresholds(**{k: values[k] for k in evaluation.GateThresholds.model_fields})
    return evaluation.EvalSettings(gate=gate, **{k: values[k] for k in RUN_FIELDS})


def _baseline(context: dg.AssetExecutionContext, config: dg.Config, settings: evaluation.EvalSettings, cases: list,
              tracking_uri: str) -> tuple[dict, Optional[str]]:
    """Metrics of the model registered for the role, on this very eval setup.

    Stored metrics are reused when they came from the same cases, tasks and limits; otherwise the
    registered snapshot is evaluated again, so the comparison is never between different tests.
    """
    if not isinstance(config, PromotionEvalConfig):
        return {}, None
    registry = ModelRegistry(tracking_uri, config.model_name)
    current = registry.serving(config.role)
    if current is None:
        return {}, None  # first registration for the role: thresholds only
    name = f"v{current.version} ({current.checkpoint_id})"
    tasks, limit = settings.benchmark_tasks, settings.benchmark_limit or None
    summary = current.lineage.eval_summary
    dtype = evaluation.resolve_device(settings.device, settings.dtype).dtype
    if summary.get("eval_config") == evaluation.eval_config_id(cases, tasks, limit, settings.max_new_tokens, dtype):
        return dict(summary.get("metrics", {})), name
    context.log.info(f"registered {name} was evaluated with another setup: evaluating its snapshot again")
    payload = evaluation.run_eval_report(registry.local_dir(current), cases, evaluation.GateThresholds(),
                                         benchmark_tasks=tasks, benchmark_limit=limit,
                                         max_new_tokens=settings.max_new_tokens, device=settings.device,
                                         dtype=settings.dtype, batch_size=settings.batch_size)
    return payload["metrics"], f"{name}, re-evaluated"


def _evaluate(context: dg.AssetExecutionContext, asset_key: str, checkpoint: str, config: dg.Config,
              root, tracking_uri: str) -> dg.MaterializeResult:
    # run config names the cases file: it must lie under the data root or an allowed source folder
    cases_file = (str(paths.confine_path(config.cases_path, f"{asset_key} config cases_path", root))
                  if config.cases_path else str(evaluation.DEFAULT_CASES))
    manifest = read_manifest(root, checkpoint)
    cases = evaluation.load_cases(cases_file)
    settings = eval_settings(config)
    baseline, baseline_name = _baseline(context, config, settings, cases, tracking_uri)
    payload = evaluation.run_eval_report(
        paths.asset_dir(checkpoint, root), cases, settings.gate, baseline,
        baseline_name, settings.benchmark_tasks, settings.benchmark_limit or None, settings.max_new_tokens,
        device=settings.device, dtype=settings.dtype, batch_size=settings.batch_size)
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
