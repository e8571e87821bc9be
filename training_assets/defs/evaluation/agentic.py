"""agentic_eval_report: the promotion candidate served with tools on held-out tasks; a blocking gate.

The candidate (``merged_adapter``) and the model the role serves now (its registered version; the
pretrained base before the first registration) run the held-out task file through the harness
(``evaluation.agentic``). The gate passes when the candidate does not regress and, for promotion,
gains with a 95% bootstrap interval above 0; ``registry_entry`` registers only a candidate whose
report passed. Metadata: success per family and overall with intervals, the gain, and a plot of
the held-out success per generation.

A random-init base (the demo's tiny decoder) is no tool-calling agent: the report then records
that the gate does not apply, and passes, so the demo's graph registers as before.
"""

from pathlib import Path

import dagster as dg
from pydantic import Field

from training_assets import paths
from training_assets.base_model.selection import current_base_model
from training_assets.checkpoint_manifest import read_manifest
from training_assets.defs.automation import follow_condition
from training_assets.defs.metadata import md_table, png_markdown
from training_assets.defs.resources import DataRoot, MlflowTracking
from training_assets.defs.settings import spec_config
from training_assets.evaluation import agentic
from training_assets.harness.families import HELD_OUT_TASKS
from training_assets.harness.tasks import load_tasks
from training_assets.registry import DEFAULT_MODEL_NAME, ModelRegistry
from training_assets.storage import fingerprint, write_json_atomic

ASSET = "agentic_eval_report"
CANDIDATE = "merged_adapter"
BASE = "base_checkpoint"
GATE_CHECK = "agentic_gate"

AgenticEvalConfig = spec_config(
    "AgenticEvalConfig", agentic.AgenticSettings,
    tasks_path=(str, Field("", description="Held-out task JSONL under the data root (or $TRAINING_ASSETS_SOURCE_DIRS); "
                                           "empty = the shipped held-out file (never trained on).")),
    role=(str, Field("generator", description="The role whose registered version is the baseline.")),
    model_name=(str, Field(DEFAULT_MODEL_NAME, description="MLflow registered model holding the role aliases.")),
)


def _baseline(context, config, root: Path, report_dir: Path, serve_cache: Path, tasks, settings, tracking_uri: str):
    """The role's registered version's results (evaluated once per version), else the base model's."""
    registry = ModelRegistry(tracking_uri, config.model_name)
    current = registry.serving(config.role)
    if current is not None:
        version = current.checkpoint_id.removeprefix(f"{CANDIDATE}-")
        stored = agentic.load_result(report_dir, version, agentic.settings_id(tasks, settings))
        if stored is not None:
            return stored
        snapshot = registry.local_dir(current)
        return agentic.evaluate_checkpoint(snapshot, version, f"{config.role} v{current.version}", tasks,
                                           report_dir=report_dir, serve_cache=serve_cache, settings=settings,
                                           log=context.log.info)[0]
    base = read_manifest(root, BASE)
    return agentic.evaluate_checkpoint(paths.asset_dir(BASE, root), base.data_version, "base", tasks, report_dir=report_dir,
                                       serve_cache=serve_cache, settings=settings, log=context.log.info)[0]


@dg.asset(
    deps=[CANDIDATE, BASE, "base_model"], group_name="evaluation", code_version=agentic.AGENTIC_VERSION, kinds={"json"},
    # it follows its candidate: the baseline it reads (base_checkpoint, base_model) changing is no new candidate
    automation_condition=follow_condition(ignore=(BASE, "base_model")),
    check_specs=[dg.AssetCheckSpec(GATE_CHECK, asset=ASSET, blocking=True, description=(
        "Served with tools on held-out tasks: no regression against the role's registered version, and a gain "
        "whose 95% bootstrap interval lies above 0."))],
)
def agentic_eval_report(context: dg.AssetExecutionContext, config: AgenticEvalConfig, data_root: DataRoot,
                        mlflow: MlflowTracking) -> dg.MaterializeResult:
    """The promotion candidate acting as an agent with real tools on the held-out tasks, against the role's model."""
    root = data_root.root()
    report_dir = paths.asset_dir(ASSET, root)
    manifest = read_manifest(root, CANDIDATE)
    base_model = current_base_model(root)
    if base_model is None or not base_model.folder:
        reason = "the base is random init (no tool-calling model to serve): the agentic gate does not apply"
        write_json_atomic(report_dir / agentic.REPORT_FILE, {"checkpoint_data_version": manifest.data_version,
                                                     "gate": {"passed": True, "reasons": [reason]}, "applied": False})
        return dg.MaterializeResult(
            metadata={"applied": False, "reason": reason},
            data_version=dg.DataVersion(fingerprint(manifest.data_version, "not-applied")),
            check_results=[dg.AssetCheckResult(check_name=GATE_CHECK, passed=True, description=reason)])
    settings = agentic.AgenticSettings(**{k: getattr(config, k) for k in agentic.AgenticSettings.model_fields})
    tasks_file = (paths.confine_path(config.tasks_path, f"{ASSET} config tasks_path", root) if config.tasks_path
                  else HELD_OUT_TASKS)
    tasks = agentic.pick_tasks(load_tasks(tasks_file), settings.max_tasks)
    serve_cache = paths.data_root(root) / "serving"
    baseline = _baseline(context, config, root, report_dir, serve_cache, tasks, settings, mlflow.uri(root))
    candidate, _ = agentic.evaluate_checkpoint(paths.asset_dir(CANDIDATE, root), manifest.data_version, "candidate",
                                               tasks, report_dir=report_dir, serve_cache=serve_cache, settings=settings,
                                               log=context.log.info)
    gate = agentic.agentic_gate(candidate, baseline, settings)
    payload = {"checkpoint_asset": CANDIDATE, "checkpoint_data_version": manifest.data_version, "applied": True,
               "tasks_path": str(tasks_file), "settings": settings.model_dump(), "gate": gate,
               "candidate": candidate.model_dump(mode="json"), "baseline": baseline.model_dump(mode="json")}
    out = write_json_atomic(report_dir / agentic.REPORT_FILE, payload)
    rows = [{"model": r.label, "family": f, "n": int(s["n"]), "rate": round(s["rate"], 3),
             "ci": f"[{s['low']:.3f}, {s['high']:.3f}]"} for r in (baseline, candidate) for f, s in sorted(r.families.items())]
    past = agentic.history(report_dir, candidate.settings_id)
    context.log.info(f"{ASSET}: candidate {candidate.overall['rate']:.3f} vs {baseline.label} {baseline.overall['rate']:.3f}; "
                     f"gate {'passed' if gate['passed'] else 'FAILED'}: {'; '.join(gate['reasons'])}")
    return dg.MaterializeResult(
        metadata={
            "uri": dg.MetadataValue.path(str(out)),
            "applied": True,
            "success_rate": float(candidate.overall["rate"]),
            "baseline": baseline.label,
            "baseline_success_rate": float(baseline.overall["rate"]),
            "gain": dg.MetadataValue.json(gate["gain"] or {}),
            "by_family": md_table(rows, ["model", "family", "n", "rate", "ci"]),
            "n_tasks": len(tasks),
            "success_per_generation": png_markdown(agentic.success_plot_png(past or [baseline, candidate]),
                                                   "held-out success per generation"),
        },
        data_version=dg.DataVersion(fingerprint(manifest.data_version, candidate.settings_id, baseline.checkpoint_data_version)),
        check_results=[dg.AssetCheckResult(
            check_name=GATE_CHECK, passed=gate["passed"], severity=dg.AssetCheckSeverity.ERROR,
            description="; ".join(gate["reasons"]),
            metadata={"reasons": md_table([{"condition": r} for r in gate["reasons"]])})],
    )
