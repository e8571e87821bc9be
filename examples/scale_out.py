"""The seed's scale-out example: an FSDP launch config and the command that runs the pretrain trainer with it.

    python examples/scale_out.py        # writes fsdp.yaml, prints the command (run it on the GPU host)

As the seed writes it, with the module renamed to ``training_assets``. The command runs
``python -m training_assets.trainers.pretrain_trainer JOB.json`` under ``accelerate launch``; the job
spec (``trainers.accelerate_launch.write_job``) is appended as the module's argument.
"""

from training_assets.launch import (
    fsdp_accelerate_config, deepspeed_zero3_config, write_config, build_launch_command)

write_config(fsdp_accelerate_config(num_processes=8, mixed_precision="bf16"), "fsdp.yaml")
cmd = build_launch_command("training_assets.trainers.pretrain_trainer",
                           distributed="fsdp", num_processes=8, config_file="fsdp.yaml")
# multi-node: same call + num_machines/machine_rank/main_process_ip (homelab OR cloud)
node_cmd = build_launch_command("training_assets.trainers.pretrain_trainer",
                                distributed="fsdp", num_processes=16, config_file="fsdp.yaml",
                                num_machines=2, machine_rank=1, main_process_ip="10.0.0.1")
write_config(deepspeed_zero3_config(num_processes=8, mixed_precision="bf16"), "zero3.yaml")

print(" ".join(cmd), "job.json")
print(" ".join(node_cmd), "job.json")
