"""The checkpoint manifest: one typed record per checkpoint, and the only code that builds, writes and reads it.

    manifest = trained_manifest("sft_checkpoint", result, config, data_versions)   # after training
    write_asset_manifest(root, manifest)          # <root>/sft_checkpoint/manifest.json, written last
    read_manifest(root, "sft_checkpoint").checkpoint_dir

Where a manifest lives: ``<root>/<asset>/manifest.json`` for the checkpoint assets (written last: its
presence marks the asset complete), ``<output_dir>/manifest.json`` for CLI and pipeline runs, and
``<snapshot>/manifest.json`` inside a registered model version, whose paths are relative to it
(``snapshot_manifest``). ``checkpoint_loading.resolve_checkpoint`` resolves any of them.

It sits below the trainers (which write it) and evaluation, the registry and lineage (which read
it), and imports none of them: a reader of a manifest never loads the training code.

A checkpoint's data version is ``fingerprint(sha256_tree(checkpoint_dir), data_versions)``: the
weights' bytes and the data versions of everything it was trained from.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from training_assets import paths
from training_assets.storage import fingerprint, sha256_tree, write_json_atomic

MANIFEST_FILE = "manifest.json"
_FROZEN = ConfigDict(frozen=True, extra="forbid")


class TrainSummary(BaseModel):
    """The manifest's ``train`` block: what the loop did (all zero / empty for a merge)."""

    model_config = _FROZEN

    steps: int = 0
    final_loss: float | None = None
    losses: list[float] = Field(default_factory=list)
    tokens: int = 0
    tokens_per_s: float | None = None
    wall_s: float | None = None
    peak_rss_mb: float | None = None
    peak_gpu_mb: float | None = None
    resumed_from: str | None = None  # the checkpoint-<step> dir the run continued from
    skipped: list[dict[str, str]] = Field(default_factory=list)  # rows the trainer could not use, with the reason
    truncated: int = 0  # SFT: examples longer than max_seq_len, cut from the right
    mean_rewards: list[float] = Field(default_factory=list)  # GRPO: mean reward per rollout batch
    merge: dict[str, Any] | None = None  # merged_adapter: the TIES merge summary


class CheckpointManifest(BaseModel):
    """Where a checkpoint's weights, base and tokenizer are, what trained it, and its data version."""

    model_config = _FROZEN

    asset: str  # checkpoint asset key (or the pipeline's / CLI's stand-in for one)
    kind: Literal["full", "adapter"]
    checkpoint_dir: str  # HF model dir (full) or PEFT adapter dir
    base_model_dir: str | None = None  # the base an adapter applies to; None for a full model
    tokenizer_dir: str
    data_version: str
    data_versions: dict[str, str] = Field(default_factory=dict)  # what it was trained from, by asset key
    examples: dict[str, Any] = Field(default_factory=dict)  # the example source: {dataset, root, limit} | {jsonl, limit}
    train: TrainSummary = Field(default_factory=TrainSummary)
    plan: dict[str, Any] | None = None
    config: dict[str, Any] = Field(default_factory=dict)  # TrainConfig.to_dict(), or the merge's settings
    tracker: str = "none"
    tracker_run_id: str | None = None
    tracking_uri: str | None = None  # the MLflow store, or the wandb run directory
    dagster_run_id: str | None = None

    @property
    def is_adapter(self) -> bool:
        return self.kind == "adapter"

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def resolved(self, folder: str | os.PathLike[str]) -> CheckpointManifest:
        """The manifest with paths made absolute against ``folder`` (snapshot manifests store them relative)."""
        base = Path(folder)
        return self.model_copy(update={
            "checkpoint_dir": str(base / self.checkpoint_dir),
            "tokenizer_dir": str(base / self.tokenizer_dir),
            "base_model_dir": str(base / self.base_model_dir) if self.base_model_dir else None,
        })


def checkpoint_data_version(checkpoint_dir: str | os.PathLike[str], data_versions: Mapping[str, str]) -> str:
    return fingerprint(sha256_tree(checkpoint_dir), dict(data_versions))


def trained_manifest(asset: str, result: Mapping[str, Any], config: Mapping[str, Any],
                     data_versions: Mapping[str, str], examples: Mapping[str, Any] | None = None,
                     dagster_run_id: str | None = None) -> CheckpointManifest:
    """The manifest of a trained checkpoint from the training result (``TrainResult`` or its reported dict)."""
    known = set(TrainSummary.model_fields)
    return CheckpointManifest(
        asset=asset, kind="adapter" if result["adapter"] else "full", checkpoint_dir=result["checkpoint_dir"],
        base_model_dir=result["base_model_dir"] if result["adapter"] else None, tokenizer_dir=result["tokenizer_dir"],
        data_version=checkpoint_data_version(result["checkpoint_dir"], data_versions), data_versions=dict(data_versions),
        examples=dict(examples or {}), train=TrainSummary(**{k: v for k, v in result.items() if k in known}), plan=dict(result["plan"]),
        config=dict(config), tracker=result.get("tracker", "none"), tracker_run_id=result.get("tracker_run_id"),
        tracking_uri=result.get("tracking_uri"), dagster_run_id=dagster_run_id)


def merged_manifest(sources: Sequence[CheckpointManifest], adapter_dir: str | os.PathLike[str],
                    summary: Mapping[str, Any], config: Mapping[str, Any],
                    dagster_run_id: str | None = None) -> CheckpointManifest:
    """The manifest of an adapter merged from ``sources`` (adapters on one base)."""
    versions = {m.asset: m.data_version for m in sources}
    return CheckpointManifest(
        asset="merged_adapter", kind="adapter", checkpoint_dir=str(Path(adapter_dir).resolve()),
        base_model_dir=sources[0].base_model_dir, tokenizer_dir=sources[0].tokenizer_dir,
        data_version=checkpoint_data_version(adapter_dir, versions), data_versions=versions,
        train=TrainSummary(merge=dict(summary)), config=dict(config), dagster_run_id=dagster_run_id)


def folder_manifest(checkpoint_dir: str | os.PathLike[str], tokenizer_dir: str | os.PathLike[str],
                    base_model_dir: str | os.PathLike[str] | None, asset: str) -> CheckpointManifest:
    """A manifest for a plain HF / PEFT folder that has none (registered or evaluated as given)."""
    return CheckpointManifest(
        asset=asset, kind="adapter" if base_model_dir else "full", checkpoint_dir=str(checkpoint_dir),
        base_model_dir=str(base_model_dir) if base_model_dir else None, tokenizer_dir=str(tokenizer_dir),
        data_version=checkpoint_data_version(checkpoint_dir, {}))


def adopted_manifest(asset: str, model_dir: str | os.PathLike[str], tokenizer_dir: str | os.PathLike[str],
                     data_versions: Mapping[str, str], dagster_run_id: str | None = None) -> CheckpointManifest:
    """The manifest of a pretrained model taken as a checkpoint (``base_checkpoint`` from ``base_model``):
    its weights where they are (not copied), the tokenizer asset's folder, and a data version from
    the model's recorded hash and the tokenizer's (``data_versions``), so no 100s-of-MB tree is rehashed."""
    return CheckpointManifest(
        asset=asset, kind="full", checkpoint_dir=str(model_dir), tokenizer_dir=str(tokenizer_dir),
        data_version=fingerprint("adopted", dict(data_versions)), data_versions=dict(data_versions),
        dagster_run_id=dagster_run_id)


def snapshot_manifest(source: CheckpointManifest) -> CheckpointManifest:
    """The manifest of a registry snapshot (``checkpoint/``, ``tokenizer/``, ``base_model/`` beside it):
    relative paths, valid wherever the artifacts land; the source's provenance is kept."""
    return source.model_copy(update={"checkpoint_dir": "checkpoint", "tokenizer_dir": "tokenizer",
                                     "base_model_dir": "base_model" if source.is_adapter else None})


def write_manifest(folder: str | os.PathLike[str], manifest: CheckpointManifest) -> Path:
    """Write ``<folder>/manifest.json`` atomically (sorted keys: same manifest, same bytes)."""
    return write_json_atomic(Path(folder) / MANIFEST_FILE, manifest.to_dict())


def read_manifest_file(folder: str | os.PathLike[str]) -> CheckpointManifest:
    """The manifest in ``folder``; an error naming the file when it is missing or not a manifest."""
    path = Path(folder) / MANIFEST_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    try:
        return CheckpointManifest.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (ValidationError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a checkpoint manifest ({exc}); re-materialise the checkpoint that wrote it") from None


def write_asset_manifest(root: str | os.PathLike[str] | None, manifest: CheckpointManifest) -> Path:
    """``<root>/<manifest.asset>/manifest.json`` (call it last: it marks the asset complete)."""
    return write_manifest(paths.asset_dir(manifest.asset, root), manifest)


def read_manifest(root: str | os.PathLike[str] | None, asset_key: str) -> CheckpointManifest:
    """The manifest of a checkpoint asset (``base_checkpoint``, ``sft_checkpoint``, ...)."""
    folder = paths.asset_dir(asset_key, root)
    if not (folder / MANIFEST_FILE).is_file():
        raise FileNotFoundError(f"{folder / MANIFEST_FILE} not found: materialise {asset_key} first "
                                f"(dagster asset materialize --select {asset_key}, or `make demo`)")
    return read_manifest_file(folder)
