"""The pure training plan: steps, effective batch, tokens per step, parameter counts and a memory estimate.

Nothing here imports torch or transformers: ``plan(...)`` answers "how many steps, how many tokens
per step, how much memory" in milliseconds, so the CLI, Dagster and agents can show it before
anything trains. The vocabulary size comes from the tokenizer's ``tokenizer.json`` (Rust
``tokenizers``), parameter counts from the ``PretrainSpec`` or the base model's ``config.json``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from training_assets.trainers.config import MAX_STEPS, PretrainSpec, TrainConfig


class FieldsMapping(Mapping):
    """A dataclass that also reads as the dict of its fields: the seed's examples index results
    (``plan["planned_steps"]``, ``report["final_loss"]``) where the code base uses attributes."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())


@dataclass(eq=True)
class Plan(FieldsMapping):
    """What a run will do, computed without torch."""

    kind: str
    examples: int  # training rows (SFT with packing: packed rows)
    planned_steps: int
    effective_batch: int  # examples per optimizer step (batch_size × grad_accum × processes)
    tokens_per_step: int  # mean tokens per example × effective batch (sequences × 2 for DPO pairs)
    n_params: int | None
    trainable_params: int | None
    est_memory_mb: float | None  # weights + grads + AdamW state (+ activations estimate)
    world_size: int = 1  # processes the plan was made for
    train_flops: float | None = None  # forward + backward over every planned step (``train_flops``)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        return cls(**data)


def tokenizer_vocab_size(config: TrainConfig) -> int | None:
    """``len(tokenizer)`` (vocabulary + added tokens) from ``tokenizer.json`` of the configured tokenizer, if any."""
    source = config.tokenizer or config.base_model
    path = Path(source) / "tokenizer.json" if source else None
    if path is None or not path.is_file():
        return None
    from tokenizers import Tokenizer  # the train extra: a plan without a tokenizer.json needs none

    return Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=True)


def _hf_config(config: TrainConfig) -> dict[str, Any] | None:
    path = Path(config.base_model) / "config.json" if config.base_model else None
    return json.loads(path.read_text()) if path is not None and path.is_file() else None


def model_param_count(config: TrainConfig, vocab_size: int | None) -> tuple[int | None, str]:
    """Parameter count from the PretrainSpec or the base model's config.json (no torch)."""
    if config.base_model is None:
        if vocab_size is None and config.pretrain.vocab_size is None:
            return None, "vocab size unknown (no tokenizer given): parameter count not estimated"
        return config.pretrain.n_params(vocab_size or 0), "from PretrainSpec"
    hf = _hf_config(config)
    if hf is None:
        return None, f"{config.base_model}/config.json not found: parameter count not estimated"
    spec = PretrainSpec(
        model_type=hf.get("model_type", "llama"), hidden_size=hf["hidden_size"], num_hidden_layers=hf["num_hidden_layers"],
        num_attention_heads=hf["num_attention_heads"],
        num_key_value_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"], vocab_size=hf["vocab_size"],
        tie_word_embeddings=hf.get("tie_word_embeddings", False))
    return spec.n_params(hf["vocab_size"]), f"from {config.base_model}/config.json"


def lora_param_count(config: TrainConfig) -> int | None:
    """Trainable parameters of the LoRA adapter: r·(in+out) per targeted Linear."""
    if config.lora is None:
        return None
    hf = _hf_config(config)
    if config.base_model is None:
        p = config.pretrain
        h, i, layers = p.hidden_size, p.intermediate_size, p.num_hidden_layers
        kv = p.num_key_value_heads * (h // p.num_attention_heads)
    elif hf is None:
        return None
    else:
        h, i, layers = hf["hidden_size"], hf["intermediate_size"], hf["num_hidden_layers"]
        kv = (hf.get("num_key_value_heads") or hf["num_attention_heads"]) * (h // hf["num_attention_heads"])
    shapes = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
              "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    r = config.lora.r
    return layers * sum(r * (a + b) for m, (a, b) in shapes.items() if m in config.lora.target_modules)


def train_flops(n_params: int | None, trainable: int | None, tokens: float) -> float | None:
    """FLOPs of training on ``tokens`` tokens: 2·N forward, 2·N backward to the activations, 2·T to the
    weights that train (N parameters, T trainable; full training: 6·N per token, Kaplan et al. 2020,
    arXiv:2001.08361). Attention scores and sampling are left out: a floor, not a promise."""
    if n_params is None or trainable is None:
        return None
    return float((4 * n_params + 2 * trainable) * tokens)


def make_plan(kind: str, config: TrainConfig, n_examples: int, mean_tokens: float, vocab_size: int | None,
              world_size: int = 1, sequences_per_example: int = 1) -> Plan:
    """Steps, effective batch, tokens per step and a memory estimate for a run.

    Memory (fp32 master weights): weights 4 B/param, grads and AdamW moments 12 B per *trainable*
    param, plus activations ≈ 34·h·T·B·layers bytes (Korthikanti et al. 2022, no recompute);
    the estimate is an order of magnitude, not a promise.
    """
    notes: list[str] = []
    if n_examples <= 0:
        raise ValueError(f"{kind}: no training examples; build the dataset first (training-assets build-dataset)")
    effective = config.batch_size * config.grad_accum * world_size
    steps_per_epoch = max(1, math.ceil(n_examples / effective))
    steps = config.max_steps if config.max_steps > 0 else steps_per_epoch * config.epochs
    if config.max_steps > 0:
        notes.append(f"max_steps={config.max_steps} overrides epochs ({steps_per_epoch} steps per epoch)")
    elif steps > MAX_STEPS:
        raise ValueError(f"{kind}: epochs={config.epochs} x {steps_per_epoch} steps per epoch plans {steps:,} steps, above "
                         f"the {MAX_STEPS:,} a run may take (TrainConfig.max_steps); lower epochs")
    n_params, why = model_param_count(config, vocab_size)
    trainable = lora_param_count(config) if config.lora else n_params
    est = None
    if n_params is not None and trainable is not None:
        weight_bytes = 2 if config.precision != "fp32" and config.lora else 4
        if config.lora and config.lora.quant_4bit:
            weight_bytes = 0.5
        hf = _hf_config(config)
        h, layers = (hf["hidden_size"], hf["num_hidden_layers"]) if hf else (config.pretrain.hidden_size,
                                                                             config.pretrain.num_hidden_layers)
        tokens = min(mean_tokens, config.max_seq_len) * config.batch_size * sequences_per_example
        act_factor = 0.15 if config.gradient_checkpointing else 1.0
        activations = 34 * h * tokens * layers * act_factor
        est = (n_params * weight_bytes + trainable * 12 + activations) / 2**20
    else:
        notes.append(why)
    tokens_per_step = int(round(min(mean_tokens, config.max_seq_len) * effective * sequences_per_example))
    return Plan(kind=kind, examples=n_examples, planned_steps=int(steps), effective_batch=effective,
                tokens_per_step=tokens_per_step, n_params=n_params, trainable_params=trainable,
                est_memory_mb=None if est is None else round(est, 1), world_size=world_size,
                train_flops=train_flops(n_params, trainable, float(steps) * tokens_per_step), notes=notes)
