"""Training jobs for the checkpoint assets: job spec in, manifest out (no Dagster here).

``prepare_job`` resolves the upstream assets (tokenizer, dataset, base checkpoint) under a data
root, builds the ``TrainConfig`` and writes the job spec that ``trainers.accelerate_launch``
runs (in a subprocess under Dagster Pipes, or torchrun / accelerate launch). The run directory
is named after a fingerprint of the config and the upstream data versions, with
``resume_from="auto"``: re-materialising after a crash with the same inputs resumes the
interrupted run instead of starting over, and changed inputs start a fresh one.
``finish_job`` reads the result and writes the asset's ``manifest.json`` (GRAPH.md contract).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training_assets import paths
from training_assets.storage import fingerprint, sha256_tree
from training_assets.trainers.base import TrainConfig
from training_assets.trainers.checkpoints import read_manifest, write_manifest

# asset key -> (trainer kind, dataset asset, upstream checkpoint asset or None)
CHECKPOINT_ASSETS: dict[str, tuple[str, str, str | None]] = {
    "base_checkpoint": ("pretrain", "pretrain_windows", None),
    "sft_checkpoint": ("sft", "sft_dataset", "base_checkpoint"),
    "dpo_checkpoint": ("dpo", "preference_pairs", "sft_checkpoint"),
    "grpo_checkpoint": ("grpo", "grpo_groups", "sft_checkpoint"),
}
RUNS_DIR = "runs"


@dataclass
class PreparedJob:
    asset_key: str
    kind: str
    job_path: Path
    result_path: Path
    run_dir: Path
    config: TrainConfig
    data_versions: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return {"asset_key": self.asset_key, "kind": self.kind, "job_path": str(self.job_path),
                "result_path": str(self.result_path), "run_dir": str(self.run_dir), "data_versions": self.data_versions,
                "config": self.config.to_dict()}


def upstream_versions(asset_key: str, root: Path) -> dict[str, str]:
    """Data versions of what a checkpoint asset is trained from (tokenizer, dataset, base checkpoint)."""
    from training_assets.tokenizer_trainer import tokenizer_hash
    from training_assets.training_data import read_dataset_info

    _, dataset, upstream = CHECKPOINT_ASSETS[asset_key]
    info = read_dataset_info(dataset, root)
    if info is None:
        raise FileNotFoundError(f"{asset_key} trains on {dataset}, which is not materialised under {root}; "
                                f"materialise {dataset} first")
    versions = {"tokenizer": tokenizer_hash(root), dataset: info.data_version}
    if upstream is not None:
        versions[upstream] = read_manifest(root, upstream)["data_version"]
    return versions


def prepare_job(asset_key: str, root: str | Path | None, overrides: dict[str, Any], tracking_uri: str | None = None,
                tags: dict[str, str] | None = None, limit: int | None = None) -> PreparedJob:
    """Resolve inputs and write the job spec for a checkpoint asset; ``overrides`` are TrainConfig fields."""
    from training_assets.tokenizer_trainer import tokenizer_dir
    from training_assets.trainers.accelerate_launch import write_job

    if asset_key not in CHECKPOINT_ASSETS:
        raise ValueError(f"{asset_key!r} is not a training asset; one of {sorted(CHECKPOINT_ASSETS)}")
    root = paths.data_root(root)
    kind, dataset, upstream = CHECKPOINT_ASSETS[asset_key]
    versions = upstream_versions(asset_key, root)
    fields: dict[str, Any] = {"tokenizer": str(tokenizer_dir(root)), **overrides}
    if upstream is not None:
        fields["base_model"] = read_manifest(root, upstream)["checkpoint_dir"]
    probe = TrainConfig.from_dict({**fields, "output_dir": "-"})
    run_id = fingerprint(probe.to_dict(), versions, limit)
    run_dir = paths.asset_dir(asset_key, root) / RUNS_DIR / run_id
    config = TrainConfig.from_dict({**fields, "output_dir": str(run_dir), "resume_from": "auto",
                                    "tracker": "mlflow" if tracking_uri else "none", "tracking_uri": tracking_uri,
                                    "tracker_tags": tags, "run_name": f"{asset_key}-{run_id}"})
    run_dir.mkdir(parents=True, exist_ok=True)
    result_path = run_dir / "result.json"
    if result_path.exists():
        result_path.unlink()  # a stale result must never be mistaken for this run's
    job_path = write_job(run_dir / "job.json", kind, config.to_dict(),
                         {"dataset": dataset, "root": str(root), "limit": limit}, str(result_path))
    return PreparedJob(asset_key, kind, job_path, result_path, run_dir, config, versions)


def finish_job(job: PreparedJob, root: str | Path | None, dagster_run_id: str | None = None) -> dict[str, Any]:
    """Read the job's result, write ``manifest.json`` (last), drop older runs; returns the manifest."""
    root = paths.data_root(root)
    if not job.result_path.is_file():
        raise RuntimeError(f"training job {job.job_path} finished without {job.result_path}; see its log")
    result = json.loads(job.result_path.read_text())
    manifest = {
        "asset": job.asset_key, "kind": "adapter" if result["adapter"] else "full",
        "checkpoint_dir": result["checkpoint_dir"], "base_model_dir": result["base_model_dir"] if result["adapter"] else None,
        "tokenizer_dir": result["tokenizer_dir"], "train": result["train"], "plan": result["plan"],
        "mlflow_run_id": result["mlflow_run_id"], "tracking_uri": job.config.tracking_uri,
        "dagster_run_id": dagster_run_id, "data_versions": job.data_versions, "config": job.config.to_dict(),
        "data_version": fingerprint(sha256_tree(result["checkpoint_dir"]), job.data_versions),
        "skipped": result.get("skipped", []), "mean_rewards": result.get("mean_rewards", []),
    }
    write_manifest(root, job.asset_key, manifest)
    runs = paths.asset_dir(job.asset_key, root) / RUNS_DIR
    for other in runs.iterdir():
        if other.is_dir() and other != job.run_dir:
            shutil.rmtree(other, ignore_errors=True)
    return manifest


def merge_job(root: str | Path | None, sources: tuple[str, ...] = ("dpo_checkpoint", "grpo_checkpoint"),
              weights: list[float] | None = None, density: float = 0.5, dagster_run_id: str | None = None) -> dict[str, Any]:
    """TIES-merge the LoRA adapters of ``sources`` into ``merged_adapter``; returns its manifest."""
    from training_assets.peft_manager import merge_lora_adapters

    root = paths.data_root(root)
    manifests = [read_manifest(root, s) for s in sources]
    not_adapters = [m["asset"] for m in manifests if m["kind"] != "adapter"]
    if not_adapters:
        raise ValueError(f"{not_adapters} are full checkpoints; TIES merge needs LoRA adapters (set lora_r > 0 on them)")
    bases = {m["base_model_dir"] for m in manifests}
    if len(bases) != 1:
        raise ValueError(f"adapters sit on different bases {sorted(bases)}; retrain them from the same sft_checkpoint")
    out = paths.asset_dir("merged_adapter", root) / "adapter"
    summary = merge_lora_adapters([m["checkpoint_dir"] for m in manifests], out, weights, density)
    versions = {m["asset"]: m["data_version"] for m in manifests}
    manifest = {
        "asset": "merged_adapter", "kind": "adapter", "checkpoint_dir": str(out.resolve()),
        "base_model_dir": manifests[0]["base_model_dir"], "tokenizer_dir": manifests[0]["tokenizer_dir"],
        "train": {"steps": 0, "final_loss": None, "tokens_per_s": None, "peak_rss_mb": None, "losses": [],
                  "merge": summary},
        "mlflow_run_id": None, "dagster_run_id": dagster_run_id, "data_versions": versions,
        "config": {"method": "ties", "weights": summary["weights"], "density": density, "sources": list(sources)},
        "data_version": fingerprint(sha256_tree(out), versions),
    }
    write_manifest(root, "merged_adapter", manifest)
    return manifest
