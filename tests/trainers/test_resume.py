"""Resume after SIGKILL — also one during a checkpoint write — or from behind a damaged checkpoint continues the identical run."""

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from training_assets.trainers import TrainConfig, get_trainer
from training_assets.trainers.accelerate_launch import write_job
from training_assets.trainers.checkpoints import CheckpointError, checkpoint_dirs, verify_checkpoint

HERE = Path(__file__).parent


def _config(tokenizer_dir, out):
    return TrainConfig(tokenizer=str(tokenizer_dir), output_dir=str(out), max_steps=8, batch_size=4, lr=3e-3,
                       warmup_steps=2, lr_scheduler="cosine", save_steps=2, save_total_limit=2, resume_from="auto", seed=3)


def _start(job, env_extra):
    env = {**os.environ, **env_extra}
    return subprocess.Popen([sys.executable, str(HERE / "_killable_job.py"), str(job)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait_for(predicate, proc, timeout=90):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"job exited early ({proc.returncode}): {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("timed out waiting for the job")


def test_sigkill_during_checkpoint_write_and_during_training_resumes_identically(tmp_path, tokenizer_dir, tokenizer, windows):
    reference = get_trainer("pretrain", _config(tokenizer_dir, tmp_path / "ref"), tokenizer=tokenizer).train(windows)

    examples = tmp_path / "windows.jsonl"
    examples.write_text("".join(json.dumps(w) + "\n" for w in windows))
    out, result_path = tmp_path / "run", tmp_path / "result.json"
    job = write_job(tmp_path / "job.json", "pretrain", _config(tokenizer_dir, out).to_dict(),
                    {"jsonl": str(examples)}, str(result_path))

    # 1) killed while writing checkpoint-000004: only its hidden temp dir exists
    marker = tmp_path / "in_write"
    proc = _start(job, {"PAUSE_IN_CHECKPOINT": "checkpoint-000004", "PAUSE_MARKER": str(marker)})
    _wait_for(marker.exists, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert [p.name for p in checkpoint_dirs(out)] == ["checkpoint-000002"]
    assert any(p.name.startswith(".checkpoint-000004") for p in out.iterdir())

    # 2) resumed from step 2, killed mid-training after checkpoint-000006 (steps 7+ are slowed down)
    proc = _start(job, {"SLOW_FROM_CALL": "4"})
    _wait_for(lambda: (out / "checkpoint-000006").is_dir(), proc)
    time.sleep(1.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not result_path.exists()
    assert [p.name for p in checkpoint_dirs(out)] == ["checkpoint-000004", "checkpoint-000006"]  # pruned to 2
    assert not any(p.name.startswith(".checkpoint-") for p in out.iterdir())  # partial write cleaned up

    # 3) resumed from step 6 to the end: the same trajectory as the uninterrupted run, bit for bit
    done = subprocess.run([sys.executable, str(HERE / "_killable_job.py"), str(job)], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    result = json.loads(result_path.read_text())
    assert result["resumed_from"].endswith("checkpoint-000006")
    assert result["losses"] == reference.loop.losses
    assert len(result["losses"]) == 8


def test_resume_from_names_a_missing_checkpoint(tmp_path, tokenizer, windows):
    config = TrainConfig(output_dir=str(tmp_path), max_steps=1, resume_from=str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="not a checkpoint dir"):
        get_trainer("pretrain", config, tokenizer=tokenizer).train(windows)


def _damage(ckpt, how):
    weights = ckpt / "model.safetensors"
    if how == "truncate":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
    elif how == "flip":  # same size, one byte of a tensor changed: only the recorded SHA-256 catches it
        data = bytearray(weights.read_bytes())
        data[-5] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif how == "missing":
        (ckpt / "trainer_state.pt").unlink()
    elif how == "bad_json":
        (ckpt / "trainer_state.json").write_text('{"format": 2, "step": ')


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tokenizer_dir, tokenizer, windows):
    """8 steps with a checkpoint every 2 (all kept), and the final weights."""
    from safetensors.torch import load_file

    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    result = get_trainer("pretrain", _durable_config(tokenizer_dir, out), tokenizer=tokenizer).train(windows)
    assert [p.name for p in checkpoint_dirs(out)] == [f"checkpoint-{s:06d}" for s in (2, 4, 6, 8)]
    return out, result.loop.losses, load_file(str(out / "final" / "model.safetensors"))


def _durable_config(tokenizer_dir, out, resume_from="auto"):
    return TrainConfig(tokenizer=str(tokenizer_dir), output_dir=str(out), max_steps=8, batch_size=4, lr=3e-3,
                       warmup_steps=2, lr_scheduler="cosine", save_steps=2, save_total_limit=0,
                       resume_from=resume_from, seed=3, torch_threads=1)


@pytest.mark.parametrize("how", ["truncate", "flip", "missing", "bad_json"])
def test_a_damaged_newest_checkpoint_is_skipped_and_resume_takes_the_one_before(uninterrupted, tmp_path, tokenizer_dir,
                                                                                tokenizer, windows, how, caplog):
    from safetensors.torch import load_file

    source, losses, final = uninterrupted
    out = tmp_path / "run"  # the run as it stood after step 6: checkpoints 2, 4, 6, the newest damaged
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("checkpoint-000008", "final"))
    _damage(out / "checkpoint-000006", how)

    with pytest.raises(CheckpointError, match="checkpoint-000006"):  # named explicitly: an error, no fallback
        get_trainer("pretrain", _durable_config(tokenizer_dir, out, str(out / "checkpoint-000006")),
                    tokenizer=tokenizer).train(windows)
    with caplog.at_level(logging.WARNING, logger="training_assets.trainers"):
        resumed = get_trainer("pretrain", _durable_config(tokenizer_dir, out), tokenizer=tokenizer).train(windows)
    assert resumed.loop.resumed_from.endswith("checkpoint-000004")
    assert any("skipping checkpoint" in r.message and "checkpoint-000006" in r.message for r in caplog.records)
    assert resumed.loop.losses == losses  # steps 5–8 retrained: the same trajectory, bit for bit
    resumed_final = load_file(str(out / "final" / "model.safetensors"))
    assert resumed_final.keys() == final.keys()
    assert all(torch.equal(resumed_final[k], final[k]) for k in final)
    verify_checkpoint(out / "checkpoint-000006")  # rewritten whole by the resumed run


def test_checkpoints_load_in_plain_transformers(uninterrupted):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    source, _, _ = uninterrupted
    ckpt = source / "checkpoint-000004"
    model = AutoModelForCausalLM.from_pretrained(str(ckpt))
    saved = load_file(str(ckpt / "model.safetensors"))
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in saved.items())
    info = json.loads((ckpt / "trainer_state.json").read_text())
    assert (info["step"], info["world_size"], info["layout"]) == (4, 1, "replicated")
    assert set(info["files"]) == {"config.json", "model.safetensors", "trainer_state.pt"}


def test_a_lora_checkpoint_loads_in_peft_and_resumes_identically(tmp_path, base_model_dir, tokenizer, sft_examples):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from training_assets.peft_manager import LoraSpec

    def config(out):
        return TrainConfig(base_model=str(base_model_dir), output_dir=str(out), max_steps=4, batch_size=4, lr=3e-3,
                           save_steps=2, save_total_limit=0, resume_from="auto", seed=3, torch_threads=1,
                           lora=LoraSpec(r=4, alpha=8))

    first = get_trainer("sft", config(tmp_path / "a"), tokenizer=tokenizer).train(sft_examples)
    ckpt = tmp_path / "a" / "checkpoint-000002"
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base_model_dir)), str(ckpt))
    params = dict(peft.named_parameters())
    trained = load_file(str(ckpt / "trainable.safetensors"))
    assert trained and all(torch.equal(params[k], v) for k, v in trained.items())
    shutil.copytree(ckpt, tmp_path / "b" / ckpt.name)
    second = get_trainer("sft", config(tmp_path / "b"), tokenizer=tokenizer).train(sft_examples)
    assert second.loop.resumed_from.endswith("checkpoint-000002")
    assert second.loop.losses == first.loop.losses
