"""Resumable training checkpoints: ``checkpoint-<step>/`` written durably, verified on resume, pruned.

A training checkpoint ``<output_dir>/checkpoint-<step:06d>/`` is a folder plain transformers /
PEFT load (``AutoModelForCausalLM.from_pretrained`` / ``PeftModel.from_pretrained``), plus the
trainer's state:

* full model: ``config.json`` + ``model.safetensors`` (every weight, unsharded; also the resume
  source). LoRA: ``adapter_config.json`` + ``adapter_model.safetensors`` (PEFT's names) and
  ``trainable.safetensors`` (the same factors under the model's parameter names, which resume
  copies back; frozen base weights come from the base model, so they are not duplicated);
* ``trainer_state.pt`` — optimizer (FSDP: gathered to full, keyed by parameter name), scheduler,
  GradScaler, and every rank's RNG states (python, numpy, torch CPU and CUDA), written by us and
  read back with ``torch.load(weights_only=True)``; under DeepSpeed ZeRO-3 its partitions are in
  ``zero/`` (DeepSpeed's own per-rank files);
* ``trainer_state.json`` — format, step, data position, world size, losses so far, config, and
  the byte size and SHA-256 of every other file, written last.

Durability: the files are written in a hidden temp dir, each file and every folder in it is
fsynced, the temp dir is renamed into place and the parent folder fsynced (``storage.atomic_dir``),
so after a crash or power loss a ``checkpoint-*`` name always holds a whole checkpoint. A SIGKILL
mid-write leaves only a ``.checkpoint-*.tmp`` dir that resume removes. Resume verifies a
checkpoint before touching the model (the JSON parses, every listed file exists with its size and
hash, the safetensors header reads and names this model's tensors); ``resume_from="auto"`` skips
one that fails with a warning naming it and the reason, and takes the one before.

Under several processes every rank calls ``save_checkpoint`` / ``resolve_resume`` /
``load_checkpoint`` (gathering sharded state is a collective, ``trainers.dist_state``); rank 0
decides which checkpoint to resume from and writes.

The finished model is written here too (``<output_dir>/final``, ``save_model_dir``); its record
and loading it are below the trainers: ``checkpoint_manifest`` and ``checkpoint_loading``.

torch and safetensors (the ``train`` extra) are imported by the functions that read or write
tensors: listing, pruning and resolving checkpoints (``gc``, the CLI) need neither.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from training_assets.peft_manager import ADAPTER_CONFIG, PeftManager, write_adapter_config
from training_assets.storage import atomic_dir, sha256_file
from training_assets.trainers import dist_state

log = logging.getLogger("training_assets.trainers")

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
FORMAT = 2  # 1: trainable.safetensors for every model, no file hashes (not resumable any more: skipped)
MODEL_FILE = "model.safetensors"
TRAINABLE_FILE = "trainable.safetensors"
STATE_PT = "trainer_state.pt"
STATE_JSON = "trainer_state.json"
ZERO_DIR = "zero"
STATE_KEYS = ("step", "data_position", "world_size", "adapter", "trainable", "files", "losses")


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: ``path`` and the ``reason``."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"checkpoint {path}: {reason}")
        self.path, self.reason = path, reason


def checkpoint_dirs(output_dir: str | os.PathLike[str]) -> list[Path]:
    """Checkpoint folders in ``output_dir`` (renamed into place, so complete when written), oldest first."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in out.iterdir() if p.is_dir() and (m := CHECKPOINT_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def remove_partial_checkpoints(output_dir: str | os.PathLike[str]) -> list[str]:
    """Delete temp dirs left by a checkpoint write that was killed; returns their names."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    partial = [p for p in out.iterdir() if p.is_dir() and p.name.startswith(".checkpoint-")]
    for p in partial:
        shutil.rmtree(p, ignore_errors=True)
    return sorted(p.name for p in partial)


# ---------------------------------------------------------------- verify


def verify_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint's ``trainer_state.json`` if the folder is whole, else ``CheckpointError`` with the reason.

    Reads every file once (sizes and SHA-256 against the record written last) and the
    safetensors header; it changes nothing, so a failure leaves the model untouched.
    """
    from safetensors import safe_open  # safetensors (train extra): only when weights are read or written

    try:
        info = json.loads((path / STATE_JSON).read_text())
    except FileNotFoundError:
        raise CheckpointError(path, f"{STATE_JSON} is missing") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(path, f"{STATE_JSON} is not readable JSON ({exc})") from exc
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise CheckpointError(path, f"{STATE_JSON} is not format {FORMAT} (written by an older version; "
                                    "its weights cannot be verified)")
    absent = sorted(set(STATE_KEYS) - set(info))
    if absent:
        raise CheckpointError(path, f"{STATE_JSON} lacks {absent}")
    for rel, record in sorted(info["files"].items()):
        f = path / rel
        if not f.is_file():
            raise CheckpointError(path, f"{rel} is missing")
        size = f.stat().st_size
        if size != record["bytes"]:
            raise CheckpointError(path, f"{rel} has {size} bytes, {record['bytes']} were written (truncated?)")
        if sha256_file(f) != record["sha256"]:
            raise CheckpointError(path, f"{rel} does not match its SHA-256 (corrupted)")
    weights = path / weights_file(info)
    try:
        with safe_open(str(weights), framework="pt") as handle:
            names = set(handle.keys())
    except Exception as exc:  # safetensors raises its own SafetensorError on a bad header
        raise CheckpointError(path, f"{weights.name} is not a readable safetensors file ({exc})") from exc
    missing = sorted(set(info["trainable"]) - names)
    if missing:
        raise CheckpointError(path, f"{weights.name} lacks trainable tensors {missing[:5]}")
    return info


def weights_file(info: dict[str, Any]) -> str:
    return TRAINABLE_FILE if info["adapter"] else MODEL_FILE


def _find_resume(resume_from: str, output_dir: str | os.PathLike[str]) -> Path | None:
    if resume_from == "auto":
        removed = remove_partial_checkpoints(output_dir)
        if removed:
            log.warning("removed partial checkpoint writes %s in %s", removed, output_dir)
        skipped = []
        for path in reversed(checkpoint_dirs(output_dir)):
            try:
                verify_checkpoint(path)
                return path
            except CheckpointError as exc:
                log.warning("skipping checkpoint %s: %s; trying the one before", path, exc.reason)
                skipped.append(path.name)
        if skipped:
            log.warning("no loadable checkpoint in %s (skipped %s): training from the start", output_dir, skipped)
        return None
    path = Path(resume_from)
    if not (path / STATE_JSON).is_file():
        raise FileNotFoundError(f"resume_from={resume_from!r} is not a checkpoint dir (no {STATE_JSON}); "
                                f"use 'auto' or one of {[str(p) for p in checkpoint_dirs(output_dir)]}")
    verify_checkpoint(path)  # an explicit choice that is broken is an error, not a silent fallback
    return path


def resolve_resume(resume_from: str | None, output_dir: str | os.PathLike[str]) -> Path | None:
    """``None`` → fresh run; ``"auto"`` → newest checkpoint that verifies (or fresh); else that dir, verified.

    Every rank calls it: rank 0 decides and the others follow (they may not see the same files
    at the same moment, and must not diverge).
    """
    if resume_from is None:
        return None
    rank, _ = dist_state.rank_and_world()
    decision: dict[str, Any] = {}
    error: Exception | None = None
    if rank == 0:
        try:
            found = _find_resume(resume_from, output_dir)
            decision = {"path": str(found) if found is not None else None}
        except Exception as exc:  # told to the other ranks below, then raised here
            error, decision = exc, {"error": f"{type(exc).__name__}: {exc}"}
    decision = dist_state.broadcast_object(decision)
    if error is not None:
        raise error
    if "error" in decision:
        raise RuntimeError(f"rank 0 could not resolve resume_from={resume_from!r}: {decision['error']}")
    return Path(decision["path"]) if decision["path"] is not None else None


# ---------------------------------------------------------------- RNG


def rng_state() -> dict[str, Any]:
    import torch  # torch: import-time stays torch-free

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
    import torch  # torch: import-time stays torch-free

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state({"bit_generator": n["bit_generator"],
                         "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
                         "has_gauss": n["has_gauss"], "gauss": n["gauss"]})
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------- save


def _fsync_tree(folder: Path) -> None:
    """fsync every file, then every folder bottom-up: the bytes are on disk before the rename publishes them."""
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        with open(f, "rb") as handle:
            os.fsync(handle.fileno())
    for d in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True) + [folder]:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_weights(folder: Path, model: Any, weights: dict[str, Any], trainable: list[str]) -> None:
    """The HF / PEFT files of ``weights`` (full, unsharded, on CPU) into ``folder``."""
    from safetensors.torch import save_file  # safetensors (train extra): only when weights are read or written

    bare = dist_state.unwrap(model)
    missing = sorted(set(trainable) - set(weights))
    if missing:
        raise RuntimeError(f"the gathered state dict lacks trainable parameters {missing[:5]}")
    if hasattr(bare, "peft_config"):
        save_file({n: weights[n] for n in trainable}, str(folder / TRAINABLE_FILE), metadata={"format": "pt"})
        bare.save_pretrained(str(folder), safe_serialization=True, state_dict=weights)
        for config_path in sorted(folder.rglob(ADAPTER_CONFIG)):  # byte-stable, as PeftManager.save writes it
            write_adapter_config(config_path.parent, json.loads(config_path.read_text()))
    else:
        save_file(weights, str(folder / MODEL_FILE), metadata={"format": "pt"})
        bare.config.save_pretrained(str(folder))


def save_checkpoint(output_dir: str | os.PathLike[str], step: int, model: Any, optimizer: Any, scheduler: Any,
                    scaler: Any, data_position: int, losses: list[float], config: dict[str, Any],
                    save_total_limit: int, accelerator: Any = None) -> Path:
    """Write ``checkpoint-<step>`` durably and atomically, then prune to ``save_total_limit``.

    Every rank calls it (the state is gathered collectively); rank 0 writes. Returns the path.
    """
    import torch  # torch: import-time stays torch-free

    rank, world = dist_state.rank_and_world()
    layout = dist_state.layout(model, accelerator)
    weights = dist_state.full_model_state(model, accelerator)
    optim = dist_state.full_optimizer_state(model, optimizer, accelerator)
    rngs = dist_state.all_gather_object(rng_state())
    target = Path(output_dir) / f"checkpoint-{step:06d}"
    if rank != 0:
        if layout == "deepspeed":
            dist_state.deepspeed_save(accelerator, Path(dist_state.broadcast_object(None)) / ZERO_DIR)
            dist_state.barrier()
        dist_state.barrier()
        return target
    trainable = dist_state.trainable_names(model)
    adapter = hasattr(dist_state.unwrap(model), "peft_config")
    with atomic_dir(target) as tmp:
        if layout == "deepspeed":
            dist_state.deepspeed_save(accelerator, Path(dist_state.broadcast_object(str(tmp))) / ZERO_DIR)
            dist_state.barrier()
        _write_weights(tmp, model, weights, trainable)
        torch.save({"optimizer": optim, "scheduler": scheduler.state_dict(),
                    "scaler": scaler.state_dict() if scaler is not None else None, "rng": rngs}, tmp / STATE_PT)
        files = {p.relative_to(tmp).as_posix(): {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
                 for p in sorted(tmp.rglob("*")) if p.is_file()}
        (tmp / STATE_JSON).write_text(json.dumps(
            {"format": FORMAT, "step": step, "data_position": data_position, "world_size": world, "layout": layout,
             "adapter": adapter, "trainable": trainable, "files": files, "losses": losses, "config": config},
            indent=2, default=str))
        _fsync_tree(tmp)
    if save_total_limit > 0:
        for old in checkpoint_dirs(output_dir)[:-save_total_limit]:
            shutil.rmtree(old)
    dist_state.barrier()
    return target


def save_model_dir(model: Any, out_dir: str | os.PathLike[str], accelerator: Any = None) -> Path:
    """The finished model as a HF dir (``_save_replica``), gathered first when it is sharded.

    Every rank calls it; rank 0 writes. One process or DDP: rank 0 saves its own copy.
    """
    rank, _ = dist_state.rank_and_world()
    if dist_state.layout(model, accelerator) == "replicated":
        if rank == 0:
            _save_replica(dist_state.unwrap(model), out_dir)
    else:
        weights = dist_state.full_model_state(model, accelerator)
        if rank == 0:
            bare = dist_state.unwrap(model)
            with atomic_dir(out_dir) as tmp:
                bare.save_pretrained(str(tmp), safe_serialization=True, state_dict=weights)
                if hasattr(bare, "peft_config"):
                    for config_path in sorted(tmp.rglob(ADAPTER_CONFIG)):
                        write_adapter_config(config_path.parent, json.loads(config_path.read_text()))
    dist_state.barrier()
    return Path(out_dir)


def _save_replica(model: Any, out_dir: str | os.PathLike[str]) -> None:
    """HF dir, atomically: config.json + model.safetensors (full) or adapter_config.json + adapter_model.safetensors.

    Same weights and config give the same bytes (the checkpoint's data version hashes this dir).
    """
    with atomic_dir(out_dir) as tmp:
        if hasattr(model, "peft_config"):
            PeftManager.save(model, tmp)
        else:
            model.save_pretrained(str(tmp), safe_serialization=True)


# ---------------------------------------------------------------- load


def load_checkpoint(path: Path, model: Any, optimizer: Any, scheduler: Any, scaler: Any,
                    accelerator: Any = None) -> dict[str, Any]:
    """Restore a checkpoint (chosen by ``resolve_resume``) in place; returns ``{"step", "data_position", "losses"}``.

    Every rank calls it. A checkpoint of another world size is refused: the data position counts
    global micro-batches of ``batch_size × world_size`` rows.
    """
    import torch  # torch: import-time stays torch-free
    from safetensors.torch import load_file  # safetensors (train extra): only when weights are read or written

    rank, world = dist_state.rank_and_world()
    layout = dist_state.layout(model, accelerator)
    info = json.loads((path / STATE_JSON).read_text())
    if info["world_size"] != world:
        raise ValueError(f"checkpoint {path} was written by {info['world_size']} process(es), this run has {world}: "
                         "resume with the same number of processes, or start a new output_dir")
    expected = set(dist_state.trainable_names(model))
    if set(info["trainable"]) != expected:
        raise ValueError(f"checkpoint {path} does not fit this model: missing {sorted(expected - set(info['trainable']))[:5]}, "
                         f"unexpected {sorted(set(info['trainable']) - expected)[:5]}; was it written with another LoRA/model config?")
    tensors = state = None
    if rank == 0 or layout == "replicated":  # fsdp: rank 0 reads and broadcasts shards
        state = torch.load(path / STATE_PT, weights_only=True)  # our own file: tensors, numbers, lists
        if layout != "deepspeed":  # DeepSpeed restores its fp32 masters from zero/, not the 16-bit copy
            tensors = load_file(str(path / weights_file(info)))
            tensors = {n: tensors[n] for n in info["trainable"]}
    if layout == "deepspeed":
        dist_state.deepspeed_load(accelerator, path / ZERO_DIR)
    dist_state.load_model_state(model, tensors, accelerator)
    dist_state.load_optimizer_state(model, optimizer, state["optimizer"] if state is not None else None, accelerator)
    small = dist_state.broadcast_object({"scheduler": state["scheduler"], "scaler": state["scaler"], "rng": state["rng"]}
                                        if rank == 0 else None)
    scheduler.load_state_dict(small["scheduler"])
    if scaler is not None and small["scaler"] is not None:
        scaler.load_state_dict(small["scaler"])
    set_rng_state(small["rng"][rank])
    return {"step": info["step"], "data_position": info["data_position"], "losses": info["losses"]}
