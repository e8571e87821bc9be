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

import importlib
from typing import Any

from training_assets import kinds, peft_manager
from training_assets.kinds import KIND_NAMES
from training_assets.peft_manager import LoraSpec
from training_assets.trainers.base import TrainerBase, TrainResult
from training_assets.trainers.config import DpoSpec, GrpoSpec, PretrainSpec, TrainConfig, VllmSpec
from training_assets.trainers.plan import Plan

TRAINER_KINDS = KIND_NAMES


def get_trainer(kind: str, config: TrainConfig, **kwargs: Any) -> TrainerBase:
    """The trainer for ``kind`` (a row of ``training_assets.kinds``); kwargs: model=, tokenizer=, accelerator=, callbacks=."""
    module, cls = kinds.kind(kind).trainer.split(":")
    # the trainer modules import torch and transformers: only the one asked for, only when asked
    return getattr(importlib.import_module(f"training_assets.trainers.{module}"), cls)(config, **kwargs)


__all__ = ["TRAINER_KINDS", "DpoSpec", "GrpoSpec", "LoraSpec", "Plan", "PretrainSpec", "TrainConfig", "TrainResult",
           "TrainerBase", "VllmSpec", "get_trainer", "peft_manager"]
