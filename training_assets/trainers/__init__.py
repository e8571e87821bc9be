"""Trainers: pretrain, SFT, DPO and GRPO over one resumable loop.

    from training_assets.trainers import TrainConfig, get_trainer, peft_manager
    trainer = get_trainer("sft", TrainConfig(base_model="data/base_checkpoint/model", max_steps=20))
    trainer.plan(examples)      # pure: {planned_steps, effective_batch, tokens_per_step, est_memory_mb, ...}
    result = trainer.train(examples)   # {steps, losses, final_loss, tokens_per_s, checkpoint_dir, ...}

A whole run (inputs resolved once, plan once, train in-process or under a launcher, the checkpoint
manifest written last) is ``trainers.jobs.run_training``. Importing this package does not import
torch; the trainers load it when they train. ``peft_manager`` is re-exported as the seed imports it.
"""

from __future__ import annotations

from typing import Any

from training_assets import peft_manager
from training_assets.peft_manager import LoraSpec
from training_assets.trainers.base import TrainerBase, TrainResult
from training_assets.trainers.config import DpoSpec, GrpoSpec, PretrainSpec, TrainConfig
from training_assets.trainers.plan import Plan

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


__all__ = ["TRAINER_KINDS", "DpoSpec", "GrpoSpec", "LoraSpec", "Plan", "PretrainSpec", "TrainConfig", "TrainResult",
           "TrainerBase", "get_trainer", "peft_manager"]
