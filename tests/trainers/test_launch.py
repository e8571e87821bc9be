"""Launcher configs load in Accelerate's own classes; a real two-process CPU run matches one process."""

import json
import subprocess
import sys

import pytest

from training_assets import launch
from training_assets.trainers import TrainConfig, get_trainer
from training_assets.trainers.accelerate_launch import write_job


@pytest.mark.parametrize("make, kind", [(launch.fsdp_accelerate_config, "FSDP"),
                                        (launch.deepspeed_zero3_config, "DEEPSPEED")])
def test_configs_load_in_accelerate(tmp_path, make, kind):
    from accelerate.commands.config.config_args import ClusterConfig

    path = launch.write_config(make(num_processes=16, num_machines=2, machine_rank=1, main_process_ip="10.0.0.1"),
                               tmp_path / "cfg.yaml")
    loaded = ClusterConfig.from_yaml_file(str(path))
    assert (loaded.distributed_type.value, loaded.num_processes, loaded.num_machines, loaded.machine_rank,
            loaded.main_process_ip) == (kind, 16, 2, 1, "10.0.0.1")
    if kind == "FSDP":
        assert loaded.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "Qwen2DecoderLayer"
    else:
        assert loaded.deepspeed_config["zero_stage"] == 3


def test_launch_commands():
    job = launch.JOB_MODULE
    assert launch.build_launch_command(job, "job.json") == ["python", "-m", job, "job.json"]
    cpu = launch.build_launch_command(job, "job.json", num_processes=2, cpu=True)
    assert cpu[:5] == ["python", "-m", "torch.distributed.run", "--nproc_per_node", "2"] and "--standalone" in cpu
    gpu = launch.build_launch_command(job, "job.json", num_processes=16, num_machines=2, machine_rank=1,
                                      main_process_ip="10.0.0.1", config_file="fsdp.yaml")
    assert gpu[:5] == ["python", "-m", "accelerate.commands.launch", "--config_file", "fsdp.yaml"]
    assert gpu[gpu.index("--main_process_ip") + 1] == "10.0.0.1" and gpu[-3:] == ["-m", job, "job.json"]
    with pytest.raises(ValueError, match="main_process_ip"):
        launch.build_launch_command(job, "job.json", num_processes=16, num_machines=2)
    with pytest.raises(ValueError, match="on CPU use distributed='ddp'"):
        launch.build_launch_command(job, "job.json", distributed="fsdp", num_processes=2, cpu=True)
    assert "--use_deepspeed" in launch.build_launch_command(job, "job.json", distributed="deepspeed", num_processes=8)
    loopback = launch.build_launch_command(job, "job.json", num_processes=2, cpu=True, main_process_ip="127.0.0.1",
                                           main_process_port=29123)
    assert "--standalone" not in loopback and loopback[loopback.index("--master_addr") + 1:][:3] == [
        "127.0.0.1", "--master_port", "29123"]


@pytest.mark.parametrize("distributed", ["fsdp", "deepspeed"])
def test_sharded_training_on_cpu_is_refused_not_run_as_ddp(monkeypatch, distributed):
    """Accelerate 1.15 builds MULTI_CPU (plain DDP) on CPU even under ACCELERATE_USE_FSDP=true: refuse instead."""
    import torch

    from training_assets.trainers.accelerate_launch import make_accelerator

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv({"fsdp": "ACCELERATE_USE_FSDP", "deepspeed": "ACCELERATE_USE_DEEPSPEED"}[distributed], "true")
    with pytest.raises(RuntimeError, match=rf"distributed='{distributed}' needs GPUs.*use distributed='ddp'"):
        make_accelerator(TrainConfig(distributed=distributed))


def test_the_seeds_launch_calls(tmp_path, monkeypatch):
    """As the seed writes them: an FSDP config file, and the launch command for the pretrain trainer module."""
    monkeypatch.chdir(tmp_path)
    launch.write_config(launch.fsdp_accelerate_config(num_processes=8, mixed_precision="bf16"), "fsdp.yaml")
    cmd = launch.build_launch_command("training_assets.trainers.pretrain_trainer",
                                      distributed="fsdp", num_processes=8, config_file="fsdp.yaml")
    assert cmd == ["python", "-m", "accelerate.commands.launch", "--config_file", "fsdp.yaml", "--num_processes", "8",
                   "--num_machines", "1", "--machine_rank", "0", "-m", "training_assets.trainers.pretrain_trainer"]
    node = launch.build_launch_command("training_assets.trainers.pretrain_trainer", distributed="fsdp",
                                       num_processes=16, config_file="fsdp.yaml", num_machines=2, machine_rank=1,
                                       main_process_ip="10.0.0.1")
    assert node[node.index("--machine_rank") + 1] == "1" and node[node.index("--main_process_ip") + 1] == "10.0.0.1"
    from accelerate.commands.config.config_args import ClusterConfig

    loaded = ClusterConfig.from_yaml_file("fsdp.yaml")
    assert (loaded.distributed_type.value, loaded.num_processes, loaded.mixed_precision) == ("FSDP", 8, "bf16")


def test_distributed_without_a_launcher_says_which_command_to_run(tmp_path, tokenizer, windows, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    config = TrainConfig(output_dir=str(tmp_path), max_steps=1, distributed="fsdp")
    with pytest.raises(RuntimeError, match=r"needs one process per device.*training-assets train pretrain --execute "
                                           r"--num-processes N.*accelerate\.commands\.launch --config_file fsdp\.yaml"):
        get_trainer("pretrain", config, tokenizer=tokenizer).train(windows)
    assert not (tmp_path / "final").exists()


def test_two_process_cpu_run_of_the_pretrain_trainer_module_matches_one_process(tmp_path, tokenizer_dir, tokenizer,
                                                                                 windows):
    common = dict(tokenizer=str(tokenizer_dir), max_steps=3, lr=3e-3, seed=1)
    single = get_trainer("pretrain", TrainConfig(output_dir=str(tmp_path / "one"), batch_size=4, **common),
                         tokenizer=tokenizer).train(windows)

    examples = tmp_path / "windows.jsonl"
    examples.write_text("".join(json.dumps(w) + "\n" for w in windows))
    config = TrainConfig(output_dir=str(tmp_path / "two"), batch_size=2, distributed="ddp", **common)  # 2 × 2 = 4
    job = write_job(tmp_path / "job.json", "pretrain", config.to_dict(), {"jsonl": str(examples)}, str(tmp_path / "r.json"))
    cmd = launch.build_launch_command("training_assets.trainers.pretrain_trainer", job, distributed="ddp",
                                      num_processes=2, cpu=True, python=sys.executable)
    done = subprocess.run(cmd, capture_output=True, timeout=240)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["world_size"] == 2
    assert result["losses"] == pytest.approx(single.loop.losses, rel=1e-5)
    # the seed-named entry refuses a job of another kind instead of training it as pretraining
    sft_job = write_job(tmp_path / "sft.json", "sft", config.to_dict(), {"jsonl": str(examples)})
    refused = subprocess.run([sys.executable, "-m", "training_assets.trainers.pretrain_trainer", str(sft_job)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "trains 'pretrain' jobs only" in refused.stderr
