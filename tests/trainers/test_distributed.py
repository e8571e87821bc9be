"""Checkpoints written by several processes load in plain transformers / PEFT and resume bit for bit.

DDP: two real torchrun processes over gloo (127.0.0.1, a free port) run the project's job entry.
FSDP2: two torchrun processes shard the model with torch's ``fully_shard`` (what Accelerate's
FSDP2 ``prepare`` calls) and run the checkpoint code on it — Accelerate itself sets up FSDP only
on GPUs (``Accelerator(cpu=True)`` with ``ACCELERATE_USE_FSDP=true`` gives ``MULTI_CPU``: plain
DDP). The end-to-end ``accelerate launch`` FSDP / DeepSpeed ZeRO-3 run needs CUDA and is skipped here.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from training_assets import launch
from training_assets.trainers import TrainConfig, get_trainer
from training_assets.trainers.accelerate_launch import write_job
from training_assets.trainers.checkpoints import checkpoint_dirs

HERE = Path(__file__).parent


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env():
    # gloo binds the interface it resolves for the host name unless told: keep it on loopback
    return {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}


def _run(module_and_args, nproc=2, distributed="ddp", config_file=None, timeout=240):
    cmd = launch.build_launch_command(*module_and_args, distributed=distributed, num_processes=nproc,
                                      cpu=not torch.cuda.is_available(), python=sys.executable, config_file=config_file,
                                      main_process_ip="127.0.0.1", main_process_port=_free_port())
    done = subprocess.run(cmd, capture_output=True, timeout=timeout, env=_env())
    assert done.returncode == 0, done.stderr.decode()[-3000:]


def _config(tokenizer_dir, out, **kw):
    return TrainConfig(tokenizer=str(tokenizer_dir), output_dir=str(out), max_steps=4, batch_size=2, lr=3e-3, seed=1,
                       save_steps=2, save_total_limit=0, resume_from="auto", torch_threads=1, **kw)


def _same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_ddp_checkpoint_loads_in_transformers_and_resumes_bit_for_bit(tmp_path, tokenizer_dir, tokenizer, windows):
    from transformers import AutoModelForCausalLM

    examples = tmp_path / "windows.jsonl"
    examples.write_text("".join(json.dumps(w) + "\n" for w in windows))

    def train(out):
        job = write_job(tmp_path / f"{out.name}.json", "pretrain", _config(tokenizer_dir, out, distributed="ddp").to_dict(),
                        {"jsonl": str(examples)}, str(tmp_path / f"{out.name}.result.json"))
        _run([launch.JOB_MODULE, job])
        return json.loads((tmp_path / f"{out.name}.result.json").read_text())

    first = train(tmp_path / "a")  # uninterrupted: 4 steps, checkpoints at 2 and 4
    assert first["world_size"] == 2 and len(first["losses"]) == 4
    a = tmp_path / "a"
    assert [p.name for p in checkpoint_dirs(a)] == ["checkpoint-000002", "checkpoint-000004"]
    ckpt = a / "checkpoint-000002"
    info = json.loads((ckpt / "trainer_state.json").read_text())
    assert (info["world_size"], info["layout"], info["data_position"]) == (2, "replicated", 2)
    assert len(torch.load(ckpt / "trainer_state.pt", weights_only=True)["rng"]) == 2  # each rank's RNG
    plain = AutoModelForCausalLM.from_pretrained(str(ckpt)).state_dict()
    saved = load_file(str(ckpt / "model.safetensors"))
    assert all(torch.equal(plain[k], v) for k, v in saved.items())
    AutoModelForCausalLM.from_pretrained(str(a / "final"))

    b = tmp_path / "b"  # the same run stopped after step 2
    shutil.copytree(ckpt, b / ckpt.name)
    second = train(b)
    assert second["resumed_from"].endswith("checkpoint-000002")
    assert second["losses"] == first["losses"]
    assert _same_weights(load_file(str(b / "final" / "model.safetensors")), load_file(str(a / "final" / "model.safetensors")))

    # a single process does not resume a two-process checkpoint (the data position counts 2-rank batches)
    with pytest.raises(ValueError, match=r"written by 2 process\(es\), this run has 1"):
        get_trainer("pretrain", _config(tokenizer_dir, b), tokenizer=tokenizer).train(windows)


def test_fsdp2_sharded_checkpoints_gather_to_plain_files_and_resume_bit_for_bit(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--nnodes", "1",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(HERE / "_fsdp_worker.py"), str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, timeout=240, env=_env())
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    for kind in ("full", "lora"):
        assert result[kind]["resumed_from"].endswith("checkpoint-000002")
        assert result[kind]["resumed"] == result[kind]["uninterrupted"], kind

    full = tmp_path / "full" / "checkpoint-000002"
    assert json.loads((full / "trainer_state.json").read_text())["layout"] == "fsdp"
    plain = AutoModelForCausalLM.from_pretrained(str(full))
    saved = load_file(str(full / "model.safetensors"))
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in saved.items())
    assert plain.model.layers[0].mlp.up_proj.weight.shape == (64, 32)  # gathered whole, not one rank's shard

    adapter = tmp_path / "lora" / "checkpoint-000002"
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(plain.config)  # the worker's seed-0 base
    peft = PeftModel.from_pretrained(base, str(adapter))
    trained = load_file(str(adapter / "trainable.safetensors"))
    params = dict(peft.named_parameters())
    assert trained and all(torch.equal(params[k], v) for k, v in trained.items())

    # the finished models, gathered from the shards: the resumed run's equals the uninterrupted one's
    for kind, name in (("full", "model.safetensors"), ("lora", "adapter_model.safetensors")):
        done, reference = (load_file(str(tmp_path / kind / d / name)) for d in ("final", "final_uninterrupted"))
        assert _same_weights(done, reference), kind
    AutoModelForCausalLM.from_pretrained(str(tmp_path / "full" / "final"))
    PeftModel.from_pretrained(AutoModelForCausalLM.from_config(plain.config), str(tmp_path / "lora" / "final"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FSDP and DeepSpeed ZeRO-3 through `accelerate launch` need "
                    "CUDA GPUs: Accelerate 1.15 sets them up only on accelerators (on CPU it builds MULTI_CPU, plain DDP)")
@pytest.mark.parametrize("distributed", ["fsdp", "deepspeed"])
def test_sharded_accelerate_run_saves_loadable_checkpoints_and_resumes(tmp_path, tokenizer_dir, windows, distributed):
    if distributed == "deepspeed":
        pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install deepspeed on the GPU host)")
    from transformers import AutoModelForCausalLM

    n = torch.cuda.device_count()
    make = launch.fsdp_accelerate_config if distributed == "fsdp" else launch.deepspeed_zero3_config
    config_file = launch.write_config(make(num_processes=n, mixed_precision="no"), tmp_path / "accelerate.yaml")
    examples = tmp_path / "windows.jsonl"
    examples.write_text("".join(json.dumps(w) + "\n" for w in windows))

    def train(out):
        config = _config(tokenizer_dir, out, distributed=distributed, batch_size=max(1, 4 // n))
        job = write_job(tmp_path / f"{out.name}.json", "pretrain", config.to_dict(), {"jsonl": str(examples)},
                        str(tmp_path / f"{out.name}.result.json"))
        _run([launch.JOB_MODULE, job], nproc=n, distributed=distributed, config_file=config_file, timeout=600)
        return json.loads((tmp_path / f"{out.name}.result.json").read_text())

    first = train(tmp_path / "a")
    ckpt = tmp_path / "a" / "checkpoint-000002"
    AutoModelForCausalLM.from_pretrained(str(ckpt))
    AutoModelForCausalLM.from_pretrained(str(tmp_path / "a" / "final"))
    shutil.copytree(ckpt, tmp_path / "b" / ckpt.name)
    second = train(tmp_path / "b")
    assert second["resumed_from"].endswith("checkpoint-000002")
    assert second["losses"] == pytest.approx(first["losses"], rel=1e-6)
