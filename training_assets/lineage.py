"""Lineage of a checkpoint: which trace batches, datasets, tokenizer and training runs made it.

    lineage = collect_lineage(root, "merged_adapter", eval_summary)
    lineage.trace_partitions      # the raw_traces batches the training examples came from

The one source of lineage for the registry (``registry_entry``, ``training-assets register``):
everything is read from the files the stages wrote — the checkpoint manifests up the chain
(``checkpoint_manifest``), the dataset and tokenizer versions they recorded, and the trace batches
behind the examples (``trained_trace_batches``). No Dagster instance is consulted, so the CLI,
the asset and a notebook give the same answer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from training_assets.checkpoint_manifest import CheckpointManifest, read_manifest
from training_assets.tokenizer_trainer import tokenizer_hash
from training_assets.training_data import contributing_batches


class LineageError(RuntimeError):
    """The checkpoint chain on disk is not the one the checkpoint was trained from."""


@dataclass(frozen=True)
class Lineage:
    """Everything needed to answer "what trained this model?"."""

    trace_partitions: tuple[str, ...] = ()  # raw_traces batch ids behind the training examples
    corpus_version: str | None = None
    dataset_versions: Mapping[str, str] = field(default_factory=dict)  # sft_dataset, preference_pairs, ...
    tokenizer_hash: str | None = None
    training_run_ids: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # asset -> {tracker, dagster}
    eval_summary: Mapping[str, Any] = field(default_factory=dict)  # {"metrics": {...}, "gate": [...]}
    upstream_data_versions: Mapping[str, str] = field(default_factory=dict)  # checkpoints' and the tokenizer's versions


def _is_checkpoint(key: str) -> bool:
    return key.endswith(("_checkpoint", "_adapter"))


def manifest_chain(root: str | os.PathLike[str] | None, checkpoint_asset: str) -> dict[str, CheckpointManifest]:
    """The manifests of ``checkpoint_asset`` and every checkpoint up its chain, by asset key.

    Refuses when an upstream checkpoint was re-trained after the downstream one was made (its
    current data version differs from the recorded one): the lineage would name the wrong run.
    """
    manifests: dict[str, CheckpointManifest] = {}
    pending: list[tuple[str, str | None]] = [(checkpoint_asset, None)]
    while pending:
        asset, expected = pending.pop()
        manifest = read_manifest(root, asset)
        if expected is not None and manifest.data_version != expected:
            raise LineageError(f"{asset} is now {manifest.data_version} but {checkpoint_asset}'s chain was "
                               f"trained on {expected}: re-materialise the downstream checkpoints first")
        if asset in manifests:
            continue
        manifests[asset] = manifest
        pending += [(k, v) for k, v in manifest.data_versions.items() if _is_checkpoint(k)]
    return manifests


def lineage_from_manifests(manifests: Mapping[str, CheckpointManifest]) -> dict[str, Any]:
    """Dataset versions, upstream data versions and training run ids gathered from the manifests."""
    datasets: dict[str, str] = {}
    upstream: dict[str, str] = {}
    runs: dict[str, dict[str, str]] = {}
    for asset, manifest in sorted(manifests.items()):
        for key, version in sorted(manifest.data_versions.items()):
            (upstream if _is_checkpoint(key) or key == "tokenizer" else datasets)[key] = str(version)
        ids = {"dagster": manifest.dagster_run_id}
        if manifest.tracker != "none":
            ids[manifest.tracker] = manifest.tracker_run_id
        runs[asset] = {k: str(v) for k, v in sorted(ids.items()) if v}
    return {"dataset_versions": datasets, "upstream_data_versions": upstream, "training_run_ids": runs}


def trained_trace_batches(root: str | os.PathLike[str] | None,
                          manifests: Mapping[str, CheckpointManifest]) -> tuple[str, ...]:
    """The raw_traces batches behind the examples the checkpoints in ``manifests`` trained on (sorted).

    The one place trace-batch lineage is decided. Each manifest records the dataset and the row
    limit it trained on (``manifest.examples``); every dataset row carries the batches it came
    from (``source_batches``), so the answer is the batches of the rows actually used — a batch
    whose traces were all dropped, or that only reached rows past the limit, is not named. A
    checkpoint trained on in-memory examples (``training_pipeline``) names no dataset and adds
    nothing; a merge adds nothing of its own (its sources are in the chain).
    """
    batches: set[str] = set()
    for manifest in manifests.values():
        source = manifest.examples or {}
        if source.get("dataset"):
            batches.update(contributing_batches(source["dataset"], source.get("root") or root, source.get("limit")))
    return tuple(sorted(batches))


def collect_lineage(root: str | os.PathLike[str] | None, checkpoint_asset: str,
                    eval_summary: Mapping[str, Any] | None = None) -> Lineage:
    """Lineage of a checkpoint asset from the files upstream stages wrote (no Dagster needed)."""
    from training_assets.data_engine import corpus_version  # numba: ~1 s; registry imports this module for Lineage alone

    manifests = manifest_chain(root, checkpoint_asset)
    gathered = lineage_from_manifests(manifests)
    gathered["upstream_data_versions"][checkpoint_asset] = manifests[checkpoint_asset].data_version
    return Lineage(trace_partitions=trained_trace_batches(root, manifests), corpus_version=corpus_version(root),
                   tokenizer_hash=tokenizer_hash(root), eval_summary=dict(eval_summary or {}), **gathered)
