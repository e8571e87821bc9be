"""Trainers: pretrain, SFT, DPO and GRPO over one resumable loop."""
