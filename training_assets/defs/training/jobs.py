"""training_job: every checkpoint asset in one run (its steps take the ``training`` pool one at a time)."""

import dagster as dg

training_job = dg.define_asset_job(
    "training_job", selection=["base_checkpoint", "sft_checkpoint", "dpo_checkpoint", "grpo_checkpoint", "merged_adapter"],
    description="Every checkpoint; each training step holds the `training` pool's slot while it runs.")
