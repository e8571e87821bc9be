"""Resumable training checkpoints: ``checkpoint-<step>/`` written atomically, pruned, and restored.

A training checkpoint ``<output_dir>/checkpoint-<step:06d>/`` holds:

* ``trainable.safetensors`` — every parameter that requires grad (all weights, or only the LoRA
  factors); frozen weights come back from the base model, so they are not duplicated;
* ``trainer_state.pt`` — optimizer, scheduler and GradScaler state dicts, RNG states (python,
  numpy, torch CPU and CUDA), written by us and read back with ``torch.load(weights_only=True)``;
* ``trainer_state.json`` — step, data position, losses so far, config (for people and tools).

It is built in a hidden temp dir and renamed into place, so a SIGKILL mid-write leaves only a
``.checkpoint-*.tmp`` dir that resume ignores and removes. Older checkpoints are pruned to
``save_total_limit`` after each save.

The finished model and its record are elsewhere: ``<output_dir>/final`` (``modeling.save_final``),
the manifest (``trainers.manifest``), loading a checkpoint (``trainers.loading``).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from training_assets.storage import atomic_dir

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
TRAINABLE_FILE = "trainable.safetensors"
STATE_PT = "trainer_state.pt"
STATE_JSON = "trainer_state.json"


def checkpoint_dirs(output_dir: str | os.PathLike[str]) -> list[Path]:
    """Complete checkpoints in ``output_dir``, oldest first."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in out.iterdir() if p.is_dir() and (m := CHECKPOINT_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(output_dir: str | os.PathLike[str]) -> Path | None:
    dirs = checkpoint_dirs(output_dir)
    return dirs[-1] if dirs else None


def remove_partial_checkpoints(output_dir: str | os.PathLike[str]) -> list[str]:
    """Delete temp dirs left by a checkpoint write that was killed; returns their names."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    partial = [p for p in out.iterdir() if p.is_dir() and p.name.startswith(".checkpoint-")]
    for p in partial:
        shutil.rmtree(p, ignore_errors=True)
    return sorted(p.name for p in partial)


def resolve_resume(resume_from: str | None, output_dir: str | os.PathLike[str]) -> Path | None:
    """``None`` → fresh run; ``"auto"`` → newest checkpoint in output_dir (or fresh); else that dir."""
    if resume_from is None:
        return None
    if resume_from == "auto":
        remove_partial_checkpoints(output_dir)
        return latest_checkpoint(output_dir)
    path = Path(resume_from)
    if not (path / STATE_PT).is_file():
        raise FileNotFoundError(f"resume_from={resume_from!r} is not a checkpoint dir (no {STATE_PT}); "
                                f"use 'auto' or one of {[str(p) for p in checkpoint_dirs(output_dir)]}")
    return path


def rng_state() -> dict[str, Any]:
    import torch

    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state = {
        "python": [version, list(internal), gauss],
        "numpy": {"bit_generator": np_state["bit_generator"], "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                  "pos": int(np_state["state"]["pos"]), "has_gauss": int(np_state["has_gauss"]),
                  "gauss": float(np_state["gauss"])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state({"bit_generator": n["bit_generator"],
                         "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
                         "has_gauss": n["has_gauss"], "gauss": n["gauss"]})
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainable_state(model: Any) -> dict[str, Any]:
    return {n: p.detach().contiguous().cpu() for n, p in model.named_parameters() if p.requires_grad}


def save_checkpoint(output_dir: str | os.PathLike[str], step: int, model: Any, optimizer: Any, scheduler: Any,
                    scaler: Any, data_position: int, losses: list[float], config: dict[str, Any],
                    save_total_limit: int) -> Path:
    """Write ``checkpoint-<step>`` atomically, then prune to ``save_total_limit``."""
    import torch
    from safetensors.torch import save_file

    target = Path(output_dir) / f"checkpoint-{step:06d}"
    state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "scaler": scaler.state_dict() if scaler is not None else None, "rng": rng_state(),
             "step": step, "data_position": data_position}
    with atomic_dir(target) as tmp:
        save_file(trainable_state(model), str(tmp / TRAINABLE_FILE))
        torch.save(state, tmp / STATE_PT)
        (tmp / STATE_JSON).write_text(json.dumps(
            {"step": step, "data_position": data_position, "losses": losses, "config": config}, indent=2, default=str))
    if save_total_limit > 0:
        for old in checkpoint_dirs(output_dir)[:-save_total_limit]:
            shutil.rmtree(old, ignore_errors=True)
    return target


def load_checkpoint(path: Path, model: Any, optimizer: Any, scheduler: Any, scaler: Any) -> dict[str, Any]:
    """Restore a checkpoint in place; returns ``{"step", "data_position", "losses"}``."""
    import torch
    from safetensors.torch import load_file

    tensors = load_file(str(path / TRAINABLE_FILE))
    expected = {n for n, p in model.named_parameters() if p.requires_grad}
    if set(tensors) != expected:
        raise ValueError(f"checkpoint {path} does not fit this model: missing {sorted(expected - set(tensors))[:5]}, "
                         f"unexpected {sorted(set(tensors) - expected)[:5]}; was it written with another LoRA/model config?")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in tensors.items():
            params[name].copy_(value)
    state = torch.load(path / STATE_PT, weights_only=True)  # our own file: tensors, numbers, lists
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    set_rng_state(state["rng"])
    info = json.loads((path / STATE_JSON).read_text())
    return {"step": state["step"], "data_position": state["data_position"], "losses": info["losses"]}
