"""The seed's pretraining entry: train a ``pretrain`` job spec, under any launcher.

    python -m training_assets.trainers.pretrain_trainer job.json
    accelerate launch --config_file fsdp.yaml --num_processes 8 -m training_assets.trainers.pretrain_trainer job.json

The command comes from ``launch.build_launch_command("training_assets.trainers.pretrain_trainer",
"job.json", distributed="fsdp", num_processes=8, config_file="fsdp.yaml")`` (plus ``num_machines``,
``machine_rank``, ``main_process_ip`` on several machines). The job spec is
``trainers.accelerate_launch.write_job(path, "pretrain", TrainConfig(...).to_dict(), {"jsonl": windows})``
(or a ``pretrain_windows`` dataset under a data root); this module is
``trainers.accelerate_launch`` restricted to pretraining jobs.
"""

from __future__ import annotations

import sys

from training_assets.trainers.accelerate_launch import main

if __name__ == "__main__":
    sys.exit(main(kind="pretrain", prog="python -m training_assets.trainers.pretrain_trainer"))
