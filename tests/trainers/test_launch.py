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
    assert launch.build_launch_command("job.json") == ["python", "-m", launch.JOB_MODULE, "job.json"]
    cpu = launch.build_launch_command("job.json", num_processes=2, cpu=True)
    assert cpu[:5] == ["python", "-m", "torch.distributed.run", "--nproc_per_node", "2"] and "--standalone" in cpu
    gpu = launch.build_launch_command("job.json", num_processes=16, num_machines=2, machine_rank=1,
                                      main_process_ip="10.0.0.1", config_file="fsdp.yaml")
    assert gpu[:5] == ["python", "-m", "accelerate.commands.launch", "--config_file", "fsdp.yaml"]
    assert gpu[gpu.index("--main_process_ip") + 1] == "10.0.0.1" and gpu[-1] == "job.json"
    with pytest.raises(ValueError, match="main_process_ip"):
        launch.build_launch_command("job.json", num_processes=16, num_machines=2)


def test_two_process_cpu_run_matches_one_process(tmp_path, tokenizer_dir, tokenizer, windows):
    common = dict(tokenizer=str(tokenizer_dir), max_steps=3, lr=3e-3, seed=1)
    single = get_trainer("pretrain", TrainConfig(output_dir=str(tmp_path / "one"), batch_size=4, **common),
                         tokenizer=tokenizer).train(windows)

    examples = tmp_path / "windows.jsonl"
    examples.write_text("".join(json.dumps(w) + "\n" for w in windows))
    config = TrainConfig(output_dir=str(tmp_path / "two"), batch_size=2, distributed="ddp", **common)  # 2 × 2 = 4
    job = write_job(tmp_path / "job.json", "pretrain", config.to_dict(), {"jsonl": str(examples)}, str(tmp_path / "r.json"))
    cmd = launch.build_launch_command(job, num_processes=2, cpu=True, python=sys.executable)
    done = subprocess.run(cmd, capture_output=True, timeout=240)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["world_size"] == 2
    assert result["train"]["losses"] == pytest.approx(single.loop.losses, rel=1e-5)
