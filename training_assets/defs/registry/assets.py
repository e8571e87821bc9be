"""registry_entry: register the merged adapter for its role once its promotion gate has passed."""

import os

import dagster as dg
from pydantic import Field

from training_assets import evaluation, paths
from training_assets.defs.metadata import md_table
from training_assets.defs.registry.resources import VllmDeployment
from training_assets.defs.resources import DataRoot, MlflowTracking
from training_assets.evaluation.agentic import REPORT_FILE as AGENTIC_REPORT_FILE, report_verdict as agentic_verdict
from training_assets.lineage import collect_lineage
from training_assets.registry import DEFAULT_MODEL_NAME, SERVE_DIR_ENV, ModelRegistry, promotion_verdict
from training_assets.storage import write_json_atomic
from training_assets.checkpoint_manifest import read_manifest

REGISTRY_CODE_VERSION = "registry-3"  # MLflow models through any artifact store; adapters name a registered base
CHECKPOINT = "merged_adapter"
REPORT = "merged_eval_report"
AGENTIC_REPORT = "agentic_eval_report"


class RegistryEntryConfig(dg.Config):
    role: str = Field("generator", description="The role this model serves (its MLflow alias).")
    served_model_name: str = Field("agent-generator", description="Name clients request from the serving endpoint.")
    base_url: str = Field("", description="vLLM server to load the adapter into; it must be one the deployment "
                                          "resource allows (TRAINING_ASSETS_DEPLOY_ALLOWED_URLS). Empty: the "
                                          "resource's server (VLLM_BASE_URL), else record the `vllm serve` command.")
    model_name: str = Field(DEFAULT_MODEL_NAME, description="MLflow registered model that holds the role aliases.")


@dg.asset(deps=[REPORT, AGENTIC_REPORT, CHECKPOINT], group_name="registry", code_version=REGISTRY_CODE_VERSION, kinds={"mlflow"})
def registry_entry(context: dg.AssetExecutionContext, config: RegistryEntryConfig, data_root: DataRoot,
                   mlflow: MlflowTracking, deployment: VllmDeployment) -> dg.MaterializeResult:
    """The merged adapter registered for its role in MLflow, with lineage back to the trace batches."""
    target = deployment.target(config.role, config.served_model_name, config.base_url)  # refused before anything runs
    root = data_root.root()
    manifest = read_manifest(root, CHECKPOINT)
    report = evaluation.load_eval_report(paths.asset_dir(REPORT, root))
    ok, reason = promotion_verdict(report, manifest)
    if ok:
        ok, reason = agentic_verdict(paths.asset_dir(AGENTIC_REPORT, root) / AGENTIC_REPORT_FILE, manifest.data_version)
    if not ok:
        raise dg.Failure(description=f"not registering {CHECKPOINT}: {reason}")
    lineage = collect_lineage(root, CHECKPOINT, {"metrics": report["metrics"], "gate": report["gate"],
                                                  "eval_config": report.get("eval_config"),
                                                  "report": str(paths.asset_dir(REPORT, root) / evaluation.REPORT_FILE)})
    serve_dir = os.environ.get(SERVE_DIR_ENV) or paths.data_root(root) / "registry" / "served"  # what vLLM mounts
    registry = ModelRegistry(mlflow.uri(root), config.model_name, serve_dir=serve_dir)
    entry = registry.register(
        paths.asset_dir(CHECKPOINT, root), target, checkpoint_id=f"{CHECKPOINT}-{manifest.data_version}", lineage=lineage)
    out = write_json_atomic(paths.asset_dir("registry_entry", root) / "entry.json",
                            {k: v for k, v in entry.to_dict().items() if k != "note"})
    context.log.info(entry.note)
    return dg.MaterializeResult(
        metadata={
            "uri": dg.MetadataValue.path(str(out)),
            "version": entry.version, "role": entry.role, "served_model_name": entry.served_model_name,
            "checkpoint_id": entry.checkpoint_id, "checkpoint_uri": entry.checkpoint_uri, "what_happened": entry.note,
            "model_uri": entry.model_uri, "mlflow_run_id": entry.run_id,
            **({"mlflow_run": dg.MetadataValue.url(entry.run_url)} if entry.run_url else {}),
            **({"base_model_uri": entry.base["model_uri"]} if entry.base else {}),
            "deployment": entry.deployment["status"],
            "serve_command": dg.MetadataValue.md(f"```\n{entry.deployment['serve_command']}\n```"),
            "trace_partitions": md_table([{"batch_id": b} for b in entry.lineage.trace_partitions]),
            "lineage": dg.MetadataValue.json(entry.to_dict()["lineage"]),
        },
        data_version=dg.DataVersion(f"{entry.checkpoint_id}-v{entry.version}"),
    )
