"""Trainers: pretrain, SFT, DPO and GRPO over one resumable loop.

    from training_assets.trainers import TrainConfig, get_trainer
    trainer = get_trainer("sft", TrainConfig(base_model="data/base_checkpoint/model", max_steps=20))
    trainer.plan(examples)      # pure: steps, effective batch, tokens/step, memory estimate
    result = trainer.train(examples)

Importing this package does not import torch; the trainers load it when they train.
"""

from __future__ import annotations

from typing import Any

from training_assets.peft_manager import LoraSpec
from training_assets.trainers.base import Plan, PretrainSpec, TrainConfig, TrainerBase, TrainResult

TRAINER_KINDS = ("pretrain", "sft", "dpo", "grpo")


def get_trainer(kind: str, config: TrainConfig, **kwargs: Any) -> TrainerBase:
    """The trainer for ``kind`` (pretrain | sft | dpo | grpo); kwargs: model=, tokenizer=, accelerator=, callbacks=."""
    if kind == "pretrain":
        from training_assets.trainers.pretrain import PretrainTrainer as cls
    elif kind == "sft":
        from training_assets.trainers.sft import SFTTrainer as cls
    elif kind == "dpo":
        from training_assets.trainers.dpo import DPOTrainer as cls
    elif kind == "grpo":
        from training_assets.trainers.grpo import GRPOTrainer as cls
    else:
        raise ValueError(f"unknown trainer kind {kind!r}; choose one of {TRAINER_KINDS}")
    return cls(config, **kwargs)


__all__ = ["TRAINER_KINDS", "LoraSpec", "Plan", "PretrainSpec", "TrainConfig", "TrainResult", "TrainerBase", "get_trainer"]
