"""Resume after SIGKILL — also one during a checkpoint write — continues the identical run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from training_assets.trainers import TrainConfig, get_trainer
from training_assets.trainers.accelerate_launch import write_job
from training_assets.trainers.checkpoints import checkpoint_dirs

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
    import pytest

    config = TrainConfig(output_dir=str(tmp_path), max_steps=1, resume_from=str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="not a checkpoint dir"):
        get_trainer("pretrain", config, tokenizer=tokenizer).train(windows)
