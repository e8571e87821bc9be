"""Scale-out: Accelerate configs (FSDP, DeepSpeed ZeRO-3), launch command lines, and the launcher check.

    write_config(fsdp_accelerate_config(num_processes=8, mixed_precision="bf16"), "fsdp.yaml")
    cmd = build_launch_command("training_assets.trainers.pretrain_trainer", "job.json", distributed="fsdp",
                               num_processes=8, config_file="fsdp.yaml")   # + num_machines/machine_rank/main_process_ip

The same job spec (``trainers.accelerate_launch``) runs on one CPU process, on ``torchrun``
processes over gloo, or under ``accelerate launch`` with these configs on GPU hosts (one or many
machines). The config dicts use Accelerate's own config-file keys, so
``accelerate.commands.config.config_args.ClusterConfig.from_yaml_file`` loads what
``write_config`` writes.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import yaml

from training_assets.storage import write_bytes_atomic

JOB_MODULE = "training_assets.trainers.accelerate_launch"


def _base(num_processes: int, num_machines: int, machine_rank: int, main_process_ip: str | None,
          main_process_port: int, mixed_precision: str) -> dict[str, Any]:
    if num_machines > 1 and not main_process_ip:
        raise ValueError("num_machines > 1 needs main_process_ip (the rank-0 machine's address)")
    cfg: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "machine_rank": machine_rank,
                           "num_machines": num_machines, "num_processes": num_processes,
                           "mixed_precision": mixed_precision, "rdzv_backend": "static", "same_network": True,
                           "use_cpu": False, "main_training_function": "main", "downcast_bf16": "no"}
    if num_machines > 1:
        cfg.update(main_process_ip=main_process_ip, main_process_port=main_process_port)
    return cfg


def fsdp_accelerate_config(num_processes: int = 8, num_machines: int = 1, machine_rank: int = 0,
                           main_process_ip: str | None = None, main_process_port: int = 29500,
                           mixed_precision: str = "bf16", transformer_layer_cls: str = "Qwen2DecoderLayer",
                           activation_checkpointing: bool = True, cpu_offload: bool = False) -> dict[str, Any]:
    """FSDP2 full-shard config: parameters, grads and optimizer state sharded over all processes.

    Wraps each decoder layer (``transformer_layer_cls``, e.g. ``LlamaDecoderLayer``) as a unit;
    state dicts are gathered in full on save so checkpoints stay plain HF safetensors.
    """
    cfg = _base(num_processes, num_machines, machine_rank, main_process_ip, main_process_port, mixed_precision)
    cfg["distributed_type"] = "FSDP"
    cfg["fsdp_config"] = {
        "fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": transformer_layer_cls, "fsdp_reshard_after_forward": True,
        "fsdp_state_dict_type": "FULL_STATE_DICT", "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_offload_params": cpu_offload, "fsdp_activation_checkpointing": activation_checkpointing,
    }
    return cfg


def deepspeed_zero3_config(num_processes: int = 8, num_machines: int = 1, machine_rank: int = 0,
                           main_process_ip: str | None = None, main_process_port: int = 29500,
                           mixed_precision: str = "bf16", offload_optimizer: bool = False,
                           offload_params: bool = False, grad_accum: int = 1, max_grad_norm: float = 1.0) -> dict[str, Any]:
    """DeepSpeed ZeRO stage 3 config (Rajbhandari et al. 2020): params, grads, optimizer partitioned.

    ``zero3_save_16bit_model`` gathers the weights on save so the output is a normal HF checkpoint.
    """
    cfg = _base(num_processes, num_machines, machine_rank, main_process_ip, main_process_port, mixed_precision)
    cfg["distributed_type"] = "DEEPSPEED"
    cfg["deepspeed_config"] = {
        "zero_stage": 3, "zero3_init_flag": True, "zero3_save_16bit_model": True,
        "offload_optimizer_device": "cpu" if offload_optimizer else "none",
        "offload_param_device": "cpu" if offload_params else "none",
        "gradient_accumulation_steps": grad_accum, "gradient_clipping": max_grad_norm,
        "deepspeed_multinode_launcher": "standard",
    }
    return cfg


def write_config(config: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write an Accelerate config file (YAML) atomically."""
    return write_bytes_atomic(path, yaml.safe_dump(config, sort_keys=True).encode())


def launched() -> bool:
    """Whether this process was started by a launcher (torchrun / accelerate launch set these)."""
    return "WORLD_SIZE" in os.environ or "LOCAL_RANK" in os.environ


def check_launched(config: Any, kind: str = "pretrain", accelerator: Any = None) -> None:
    """``distributed != "none"`` needs a launcher; in a plain process it is an error that names the command.

    Without a launcher the run would silently train on one device (FSDP/DeepSpeed/DDP need one
    process per device, started together).
    """
    if config.distributed == "none" or accelerator is not None or launched():
        return
    example = build_launch_command(JOB_MODULE, "JOB.json", distributed=config.distributed, num_processes=8,
                                   config_file=f"{config.distributed}.yaml" if config.distributed != "ddp" else None)
    raise RuntimeError(
        f"TrainConfig(distributed={config.distributed!r}) needs one process per device started by a launcher, and "
        f"this process was not (no WORLD_SIZE / LOCAL_RANK). Run it through one: `training-assets train {kind} "
        f"--execute --num-processes N`, or write a job spec (trainers.accelerate_launch.write_job) and run "
        f"`{format_command(example)}` (launch.build_launch_command); or set distributed='none' for one process.")


def build_launch_command(module: str = JOB_MODULE, *args: str | os.PathLike[str], distributed: str = "none",
                         num_processes: int = 1, num_machines: int = 1, machine_rank: int = 0,
                         main_process_ip: str | None = None, main_process_port: int = 29500,
                         config_file: str | os.PathLike[str] | None = None, cpu: bool = False,
                         python: str = "python") -> list[str]:
    """argv that runs ``python -m module *args`` under the right launcher.

    * one process, ``distributed="none"``: ``python -m module ARGS``;
    * CPU, ``ddp`` or several processes: ``torchrun --nproc_per_node N`` (gloo) —
      ``accelerate launch --cpu --num_processes N`` started a single process on this kind of host;
      ``--standalone`` on one machine, or the given ``main_process_ip`` / ``main_process_port``
      (e.g. ``127.0.0.1`` and a free port, to keep the rendezvous on loopback);
    * GPU: ``accelerate launch`` with the config file (``fsdp_accelerate_config`` /
      ``deepspeed_zero3_config`` → ``write_config``) or, without one, ``--use_fsdp`` /
      ``--use_deepspeed`` / ``--multi_gpu``, and the machine topology (``num_machines``,
      ``machine_rank``, ``main_process_ip``) for multi-node runs.

    The module is the job runner (``training_assets.trainers.accelerate_launch JOB.json``) or a
    trainer entry such as ``training_assets.trainers.pretrain_trainer JOB.json``.
    """
    script = ["-m", module, *map(str, args)]
    if num_processes < 1 or num_machines < 1:
        raise ValueError(f"num_processes and num_machines must be >= 1, got {num_processes}, {num_machines}")
    if num_machines > 1 and not main_process_ip:
        raise ValueError("num_machines > 1 needs main_process_ip (the rank-0 machine's address)")
    if distributed not in ("none", "ddp", "fsdp", "deepspeed"):
        raise ValueError(f"distributed must be none, ddp, fsdp or deepspeed, got {distributed!r}")
    sharded = distributed in ("fsdp", "deepspeed")
    if cpu and sharded:
        raise ValueError(f"distributed={distributed!r} shards over GPUs (accelerate launch); on CPU use "
                         "distributed='ddp' with num_processes > 1 (torchrun over gloo)")
    if distributed == "none" and num_processes == 1 and num_machines == 1 and config_file is None:
        return [python, *script]
    if cpu:
        cmd = [python, "-m", "torch.distributed.run", "--nproc_per_node", str(num_processes // num_machines or 1)]
        if num_machines > 1 or main_process_ip:
            cmd += ["--nnodes", str(num_machines), "--node_rank", str(machine_rank),
                    "--master_addr", main_process_ip, "--master_port", str(main_process_port)]
        else:
            cmd += ["--standalone"]  # single node: a free local rendezvous port, no fixed 29500 to collide on
        return cmd + script
    cmd = [python, "-m", "accelerate.commands.launch"]
    if config_file is not None:
        cmd += ["--config_file", str(config_file)]
    else:
        cmd += {"fsdp": ["--use_fsdp"], "deepspeed": ["--use_deepspeed"]}.get(distributed, ["--multi_gpu"])
    cmd += ["--num_processes", str(num_processes), "--num_machines", str(num_machines), "--machine_rank", str(machine_rank)]
    if num_machines > 1:
        cmd += ["--main_process_ip", main_process_ip, "--main_process_port", str(main_process_port)]
    return cmd + script


def format_command(argv: list[str]) -> str:
    return shlex.join(argv)
