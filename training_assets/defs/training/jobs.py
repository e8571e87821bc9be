"""training_job: every checkpoint asset in one run (its steps take the ``training`` pool one at a time)."""

import dagster as dg

from training_assets.kinds import CHECKPOINTS

training_job = dg.define_asset_job(
    "training_job", selection=[*CHECKPOINTS, "merged_adapter"],
    description="Every checkpoint; each training step holds the `training` pool's slot while it runs.")
