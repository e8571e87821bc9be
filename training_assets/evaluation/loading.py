"""Resolving a checkpoint to its weights, base and tokenizer, and loading it for evaluation.

Accepted: a checkpoint asset folder (``manifest.json``, paths relative to it), a Hugging Face
model folder (``config.json``) or a PEFT adapter folder (``adapter_config.json`` naming a local
base). The registry resolves checkpoints the same way when it snapshots them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class CheckpointDirs:
    """Where a checkpoint's pieces live: the weights (full or adapter), its base and its tokenizer."""

    checkpoint_dir: Path
    base_model_dir: Path | None  # set for an adapter
    tokenizer_dir: Path

    @property
    def is_adapter(self) -> bool:
        return self.base_model_dir is not None


def resolve_checkpoint(path: str | os.PathLike[str]) -> CheckpointDirs:
    """Accept a checkpoint asset folder (``manifest.json``), a HF model dir or a PEFT adapter dir."""
    path = Path(path)
    manifest = path / "manifest.json"
    if manifest.is_file():  # relative paths (registry snapshots) are relative to the manifest's folder
        m = json.loads(manifest.read_text(encoding="utf-8"))
        base = m.get("base_model_dir")
        return CheckpointDirs(path / m["checkpoint_dir"], path / base if base else None,
                              path / (m.get("tokenizer_dir") or base or m["checkpoint_dir"]))
    adapter_config = path / "adapter_config.json"
    if adapter_config.is_file():
        base = json.loads(adapter_config.read_text(encoding="utf-8")).get("base_model_name_or_path")
        if not base or not Path(base).is_dir():
            raise FileNotFoundError(f"{adapter_config}: base_model_name_or_path {base!r} is not a local folder; "
                                    "evaluate through the checkpoint's manifest.json, which names the base")
        has_tokenizer = (path / "tokenizer_config.json").is_file()
        return CheckpointDirs(path, Path(base), path if has_tokenizer else Path(base))
    if (path / "config.json").is_file():
        return CheckpointDirs(path, None, path)
    raise FileNotFoundError(f"{path}: neither manifest.json, adapter_config.json nor config.json; "
                            "pass a checkpoint asset folder or a Hugging Face model/adapter folder")


def load_model(path: str | os.PathLike[str]) -> tuple[Any, Any]:
    """(model in eval mode, tokenizer) on CPU in fp32, through the trainers' manifest loader.

    An adapter is loaded on its base and merged (``merge_and_unload``): same outputs, faster
    generation and a plain ``PreTrainedModel`` for lm-eval.
    """
    import torch

    from training_assets.trainers.checkpoints import load_model_for_eval

    dirs = resolve_checkpoint(path)
    manifest = {"asset": str(path), "kind": "adapter" if dirs.is_adapter else "full",
                "checkpoint_dir": str(dirs.checkpoint_dir), "tokenizer_dir": str(dirs.tokenizer_dir),
                "base_model_dir": str(dirs.base_model_dir) if dirs.is_adapter else None}
    model, tokenizer = load_model_for_eval(manifest, dtype=torch.float32)
    if dirs.is_adapter:
        model = model.merge_and_unload()
    return model.eval(), tokenizer
