"""LoRA / DoRA / QLoRA adapters and TIES merging.

* ``LoraSpec`` — the adapter's shape (rank, alpha, dropout, target modules, DoRA, 4-bit base).
* ``PeftManager`` — wraps a model with PEFT (seeded LoRA init), guards QLoRA (bitsandbytes needs
  CUDA: on a CPU host it raises, it never silently trains a full-precision base instead), and
  saves adapters with a byte-stable ``adapter_config.json`` (same adapter → same bytes).
* ``ties_merge`` — TIES-Merging (Yadav et al. 2023, https://arxiv.org/abs/2306.01708) in NumPy:
  trim each task vector to its top-``density`` magnitudes, elect a sign per entry from the summed
  trimmed vectors, then average only the entries that agree with the elected sign ("disjoint
  mean"). ``merge_lora_adapters`` applies it to the ``lora_A`` and ``lora_B`` factors of several
  PEFT adapters exactly as PEFT's ``add_weighted_adapter(combination_type="ties")`` does
  (weights ``sqrt(w · scaling)`` on each factor, sign on A; merged ``lora_alpha = r``), and
  writes a PEFT adapter directory that ``PeftModel.from_pretrained`` loads.

This module imports torch/peft lazily: ``LoraSpec`` is used by the pure planning code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from training_assets.storage import atomic_dir

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


class LoraSpec(BaseModel):
    """A LoRA adapter (Hu et al. 2021, https://arxiv.org/abs/2106.09685): ``W + (alpha/r)·B·A``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    r: int = Field(16, gt=0, description="Rank of the update; 8-64 is usual, higher = more capacity and memory.")
    alpha: int = Field(32, gt=0, description="Update scale numerator: the effective scale is alpha/r.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapter input (0 keeps runs bit-reproducible).")
    target_modules: tuple[str, ...] = Field(("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
                                            min_length=1, description="Linear layers that get an adapter.")
    use_dora: bool = Field(False, description="DoRA (Liu et al. 2024): magnitude/direction split of the update.")
    quant_4bit: bool = Field(False, description="QLoRA (Dettmers et al. 2023): NF4 base via bitsandbytes; CUDA only.")

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> LoraSpec | None:
        return None if d is None else cls.model_validate(d)


class QLoraUnavailableError(RuntimeError):
    """QLoRA was asked for on a host that cannot run it (no CUDA or no bitsandbytes)."""


def check_qlora_available() -> None:
    """Raise ``QLoraUnavailableError`` unless 4-bit loading can really happen here.

    bitsandbytes' NF4 kernels run on CUDA; a CPU fallback would train a full-precision base and
    report it as QLoRA, so we refuse instead.
    """
    import torch  # the train extra: ~2 s, only when a 4-bit base is asked for

    if not torch.cuda.is_available():
        raise QLoraUnavailableError(
            "LoraSpec(quant_4bit=True) needs a CUDA GPU with bitsandbytes (NF4 base weights); this host has no "
            "CUDA device. Use quant_4bit=False for plain LoRA on CPU, or run on a GPU host with the 'gpu' extra.")
    try:
        import bitsandbytes  # noqa: F401  (the gpu extra: only probed, when a 4-bit base is asked for)
    except ImportError as exc:
        raise QLoraUnavailableError(
            "LoraSpec(quant_4bit=True) needs bitsandbytes: pip install 'training-assets[gpu]'") from exc


def quantization_config(spec: LoraSpec) -> Any:
    """The ``BitsAndBytesConfig`` for a QLoRA base (NF4, double quantisation, bf16 compute)."""
    check_qlora_available()
    import torch  # the train extra: ~2 s, only when training
    from transformers import BitsAndBytesConfig  # the train extra

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch.bfloat16)


@dataclass
class PeftManager:
    """Attach, save and load LoRA adapters for one ``LoraSpec``."""

    spec: LoraSpec
    adapter_name: str = "default"
    extra: dict[str, Any] = field(default_factory=dict)

    def lora_config(self) -> Any:
        from peft import LoraConfig  # the train extra: with torch, only when training

        return LoraConfig(r=self.spec.r, lora_alpha=self.spec.alpha, lora_dropout=self.spec.dropout,
                          target_modules=list(self.spec.target_modules), use_dora=self.spec.use_dora,
                          bias="none", task_type="CAUSAL_LM", **self.extra)

    def wrap(self, model: Any, gradient_checkpointing: bool = False, seed: int = 0) -> Any:
        """Return ``model`` with a trainable adapter; only adapter weights require grad.

        PEFT draws the ``lora_A`` factors at random (Kaiming-uniform; ``lora_B`` starts at 0). The
        draw is seeded with ``seed`` inside a forked RNG: torch seeds its default generator
        randomly at start-up, so an unseeded draw gave every process a different adapter, and the
        caller's RNG streams are left as they were.
        """
        import torch  # the train extra: ~2 s, only when training
        from peft import get_peft_model, prepare_model_for_kbit_training  # the train extra

        if self.spec.quant_4bit:
            check_qlora_available()
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing)
        missing = [m for m in self.spec.target_modules if not any(n.endswith(m) for n, _ in model.named_modules())]
        if missing:
            raise ValueError(f"LoraSpec.target_modules {missing} match no module of {type(model).__name__}; "
                             f"pick names from its Linear layers (e.g. q_proj, v_proj)")
        with torch.random.fork_rng(devices=list(range(torch.cuda.device_count()))):
            torch.manual_seed(seed)
            return get_peft_model(model, self.lora_config(), adapter_name=self.adapter_name)

    @staticmethod
    def save(model: Any, output_dir: str | Path) -> None:
        """``model.save_pretrained`` into ``output_dir``, with byte-stable ``adapter_config.json`` files."""
        model.save_pretrained(str(output_dir), safe_serialization=True)
        for config_path in sorted(Path(output_dir).rglob(ADAPTER_CONFIG)):  # one per adapter (named ones in subdirs)
            write_adapter_config(config_path.parent, json.loads(config_path.read_text()))


# PEFT keeps these as Python sets and writes them as ``list(the set)``.
SET_VALUED_FIELDS = ("target_modules", "exclude_modules")


def canonical_adapter_config(config: dict[str, Any]) -> dict[str, Any]:
    """An adapter config whose JSON is the same bytes in every process.

    PEFT stores ``target_modules`` as a set and saves it in set iteration order, which follows
    Python's string hashing, salted per process (``PYTHONHASHSEED``): the same adapter got a
    different ``adapter_config.json`` — and a different data version — on every run. Sorting the
    names changes nothing for PEFT, which reads them back into a set.
    """
    out = dict(config)
    for key in SET_VALUED_FIELDS:
        if isinstance(out.get(key), list):
            out[key] = sorted(out[key])
    return out


def write_adapter_config(adapter_dir: str | Path, config: dict[str, Any]) -> Path:
    """Write ``<adapter_dir>/adapter_config.json`` canonically (sorted keys and module names)."""
    path = Path(adapter_dir) / ADAPTER_CONFIG
    path.write_text(json.dumps(canonical_adapter_config(config), indent=2, sort_keys=True) + "\n")
    return path


# ---------------------------------------------------------------- TIES merging (NumPy)


def _trim_top_density(tensor: np.ndarray, density: float) -> np.ndarray:
    """Keep the ``int(density · numel)`` largest magnitudes, zero the rest (TIES step 1, "trim")."""
    if density >= 1.0:
        return tensor
    flat = tensor.reshape(-1)
    k = int(density * flat.size)
    out = np.zeros_like(flat)
    if k > 0:
        keep = np.argpartition(np.abs(flat), flat.size - k)[flat.size - k:]
        out[keep] = flat[keep]
    return out.reshape(tensor.shape)


def ties_merge(task_tensors: Sequence[np.ndarray], weights: Sequence[float], density: float = 0.5,
               majority_sign_method: str = "total") -> np.ndarray:
    """TIES-merge task vectors ``τ_1..τ_n`` (same shape) into one.

    1. trim: ``τ̂_i = top_k(|τ_i|)`` with ``k = int(density · numel)``;
    2. elect: ``γ = sign(Σ_i τ̂_i)`` ("total") or ``sign(Σ_i sign(τ̂_i))`` ("frequency"); 0 counts as +;
    3. disjoint mean: ``τ_m[p] = Σ_{i: sign(τ̂_i[p]) = γ[p]} w_i τ̂_i[p] / max(1, #{i: sign(τ̂_i[p]) = γ[p]})``.

    Weights scale each trimmed vector after the sign election (as PEFT does).
    """
    if not task_tensors:
        raise ValueError("ties_merge needs at least one task tensor")
    if len(weights) != len(task_tensors):
        raise ValueError(f"ties_merge: {len(task_tensors)} task tensors but {len(weights)} weights")
    if not 0.0 <= density <= 1.0:
        raise ValueError(f"ties_merge density must be in [0, 1], got {density}")
    shapes = {t.shape for t in task_tensors}
    if len(shapes) != 1:
        raise ValueError(f"ties_merge: task tensors differ in shape {sorted(shapes)}; adapters must share rank and targets")
    trimmed = np.stack([_trim_top_density(np.asarray(t), density) for t in task_tensors])  # (n, *shape)
    signs = np.sign(trimmed)
    if majority_sign_method == "total":
        magnitude = trimmed.sum(axis=0)
    elif majority_sign_method == "frequency":
        magnitude = signs.sum(axis=0)
    else:
        raise ValueError(f"majority_sign_method must be 'total' or 'frequency', got {majority_sign_method!r}")
    elected = np.where(magnitude >= 0, 1.0, -1.0)
    agree = signs == elected  # (n, *shape); trimmed zeros have sign 0 and never agree
    w = np.asarray(weights, dtype=trimmed.dtype).reshape((-1,) + (1,) * (trimmed.ndim - 1))
    total = (trimmed * w * agree).sum(axis=0)
    return (total / np.maximum(agree.sum(axis=0), 1.0)).astype(trimmed.dtype)


def _read_adapter(adapter_dir: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    from safetensors.numpy import load_file  # the train extra: merging needs it, importing this module does not

    config_path, weights_path = adapter_dir / ADAPTER_CONFIG, adapter_dir / ADAPTER_WEIGHTS
    if not config_path.is_file() or not weights_path.is_file():
        raise FileNotFoundError(f"{adapter_dir} is not a PEFT adapter dir (needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
    return json.loads(config_path.read_text()), load_file(str(weights_path))


def merge_lora_adapters(adapter_dirs: Sequence[str | Path], output_dir: str | Path, weights: Sequence[float] | None = None,
                        density: float = 0.5, majority_sign_method: str = "total") -> dict[str, Any]:
    """TIES-merge LoRA adapters (same base, rank and targets) into a new PEFT adapter dir.

    Each factor is merged separately, as PEFT's ``combination_type="ties"``: the A factors with
    weights ``sign(w·s)·sqrt(|w·s|)`` and the B factors with ``sqrt(|w·s|)`` where ``s = alpha/r`` of
    that adapter, so ``B_m A_m`` carries the scaling and the merged adapter has ``lora_alpha = r``.
    Returns a summary (tensors merged, rank, density, share of entries kept).
    """
    from safetensors.numpy import save_file  # the train extra: merging needs it, importing this module does not


    dirs = [Path(d) for d in adapter_dirs]
    if len(dirs) < 2:
        raise ValueError(f"merge_lora_adapters needs at least two adapters, got {len(dirs)}")
    weights = list(weights) if weights is not None else [1.0] * len(dirs)
    loaded = [_read_adapter(d) for d in dirs]
    configs = [c for c, _ in loaded]
    ranks = {c["r"] for c in configs}
    if len(ranks) != 1:
        raise ValueError(f"TIES merge needs adapters of one rank, got ranks {sorted(ranks)} from {[str(d) for d in dirs]}")
    bases = {c.get("base_model_name_or_path") for c in configs}
    if len(bases) != 1:
        raise ValueError(f"adapters were trained on different bases {sorted(map(str, bases))}; merge needs one base")
    keys = [set(t) for _, t in loaded]
    if any(k != keys[0] for k in keys[1:]):
        raise ValueError("adapters target different modules; TIES merge needs identical target_modules")
    scalings = [c["lora_alpha"] / c["r"] for c in configs]
    w_a = [math.copysign(math.sqrt(abs(w * s)), w * s) for w, s in zip(weights, scalings)]
    w_b = [math.sqrt(abs(w * s)) for w, s in zip(weights, scalings)]
    merged: dict[str, np.ndarray] = {}
    kept = total = 0
    for name in sorted(keys[0]):
        tensors = [t[name] for _, t in loaded]
        if ".lora_A." in name:
            merged[name] = ties_merge(tensors, w_a, density, majority_sign_method)
        elif ".lora_B." in name:
            merged[name] = ties_merge(tensors, w_b, density, majority_sign_method)
        else:
            raise ValueError(f"adapter tensor {name!r} is not a LoRA factor; only plain LoRA adapters can be TIES-merged")
        kept += int(np.count_nonzero(merged[name]))
        total += merged[name].size
    config = dict(configs[0])
    config["lora_alpha"] = config["r"]  # scaling already folded into the factors
    config["use_dora"] = False
    with atomic_dir(output_dir) as tmp:
        save_file(merged, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        write_adapter_config(tmp, config)
    return {"tensors": len(merged), "rank": config["r"], "density": density, "weights": weights,
            "nonzero_fraction": kept / max(total, 1), "adapters": [str(d) for d in dirs], "output_dir": str(output_dir)}
