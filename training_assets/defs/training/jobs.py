"""training_job: every checkpoint asset in one run."""

import dagster as dg

from training_assets.defs.training.assets import ACCELERATOR_TAG

training_job = dg.define_asset_job(
    "training_job", selection=["base_checkpoint", "sft_checkpoint", "dpo_checkpoint", "grpo_checkpoint", "merged_adapter"],
    tags=ACCELERATOR_TAG, description="Every checkpoint, one accelerator run at a time.")
