"""Before a run executes: launcher entries parse their arguments, bounds on length and time, a loadable
base model, one run per output folder. Each refusal is one line naming the input and the fix."""

import json
import os
import subprocess
import sys

import pytest

from training_assets import cli
from training_assets.trainers import TrainConfig, get_trainer
from training_assets.trainers.accelerate_launch import main as job_main
from training_assets.trainers.config import MAX_STEPS
from training_assets.trainers.jobs import in_memory_job, run_training
from training_assets.trainers.run_guards import LOCK_FILE, MAX_TRAIN_HOURS_ENV, RunDirBusy, hold_run_dir

ENTRIES = ("training_assets.trainers.pretrain_trainer", "training_assets.trainers.accelerate_launch")


def _one_line(text):
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


@pytest.fixture
def sft_cli(tmp_path, tokenizer_dir, base_model_dir, sft_examples):
    """``train sft`` argv on a JSONL file with the tiny base; extra args appended."""
    examples = tmp_path / "sft.jsonl"
    examples.write_text("".join(json.dumps(e) + "\n" for e in sft_examples))

    def argv(*extra, base=base_model_dir, out=tmp_path / "run"):
        return ["train", "sft", "--examples", str(examples), "--set", f"base_model={base}", "--set",
                f"tokenizer={tokenizer_dir}", "--set", "max_steps=1", "--output-dir", str(out), *extra]

    return argv


def test_the_seeds_launch_entry_prints_its_usage_on_help_and_a_missing_job_in_one_line(tmp_path):
    entry = ENTRIES[0]  # what examples/scale_out.py launches
    shown = subprocess.run([sys.executable, "-m", entry, "--help"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and shown.stdout.startswith(f"usage: python -m {entry} [-h] JOB.json"), shown.stderr
    missing = subprocess.run([sys.executable, "-m", entry, str(tmp_path / "job.json")], capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode == 2
    assert _one_line(missing.stderr) == (f"python -m {entry}: error: {tmp_path / 'job.json'}: no such job spec; "
                                         "write one with trainers.accelerate_launch.write_job")


@pytest.mark.parametrize("entry", ENTRIES)
def test_launch_entries_refuse_bad_arguments_and_specs_in_one_line(tmp_path, capsys, entry):
    kind = "pretrain" if entry.endswith("pretrain_trainer") else None
    prog = f"python -m {entry}"
    with pytest.raises(SystemExit) as done:
        job_main(["--help"], kind=kind, prog=prog)
    assert done.value.code == 0 and "JOB.json" in capsys.readouterr().out
    for argv in ([], ["a.json", "b.json"], ["--bogus", "a.json"]):
        with pytest.raises(SystemExit) as done:
            job_main(argv, kind=kind, prog=prog)
        assert done.value.code == 2
        assert _one_line(capsys.readouterr().err).startswith(f"{prog}: error: ")
    bad = tmp_path / "job.json"
    for text, says in (("not json", "not a readable JSON job spec"), ('{"kind": "pretrain"}', "not a job spec (no config, examples)"),
                       ('{"kind": "pretrain", "config": {"max_stepz": 1}, "examples": {}}', "unknown field 'max_stepz'")):
        bad.write_text(text)
        assert job_main([str(bad)], kind=kind, prog=prog) == 2
        assert says in _one_line(capsys.readouterr().err)


def test_max_steps_and_epochs_are_bounded_and_the_refusal_says_why(sft_cli, capsys):
    with pytest.raises(ValueError, match=r"TrainConfig.max_steps: Input should be less than or equal to 10000000 "
                                         r"\(.*typo that would hold the training slot"):
        TrainConfig.from_dict({"max_steps": 10**15})
    with pytest.raises(ValueError, match="TrainConfig.epochs: Input should be less than or equal to 10000"):
        TrainConfig.from_dict({"epochs": 10**9})
    assert cli.main(sft_cli("--set", f"max_steps={10**15}", "--execute")) == 2
    assert "TrainConfig.max_steps" in _one_line(capsys.readouterr().err)
    big = TrainConfig(epochs=10**4, batch_size=1)  # within each bound, over MAX_STEPS together
    with pytest.raises(ValueError, match=f"plans 10,010,000 steps, above the {MAX_STEPS:,}"):
        get_trainer("pretrain", big).plan([{"input_ids": [1, 2]}] * 1001)


def test_a_plan_whose_eta_exceeds_the_limit_is_refused_before_training(tmp_path, monkeypatch, capsys, sft_cli, tokenizer,
                                                                        base_model_dir, sft_examples):
    config = TrainConfig(base_model=str(base_model_dir), output_dir=str(tmp_path / "lib"), max_steps=2, batch_size=4)
    job = in_memory_job("sft_checkpoint", "sft", config, {})
    monkeypatch.setenv(MAX_TRAIN_HOURS_ENV, "1e-9")
    with pytest.raises(ValueError) as refused:
        run_training(job, rows=sft_examples, tokenizer=tokenizer)
    message = str(refused.value)
    assert "the plan's ETA is" in message and f"over the 1e-09 h limit of ${MAX_TRAIN_HOURS_ENV}" in message
    assert not (tmp_path / "lib").exists()  # nothing trained, nothing written
    assert run_training(job, rows=sft_examples, tokenizer=tokenizer, execute=False).plan.train_flops > 0  # plans still

    assert cli.main(sft_cli("--execute")) == 2  # the CLI's --execute goes through the same check
    assert f"${MAX_TRAIN_HOURS_ENV}" in _one_line(capsys.readouterr().err)

    monkeypatch.setenv(MAX_TRAIN_HOURS_ENV, "72")  # the limit raised: the same run trains
    assert run_training(job, rows=sft_examples, tokenizer=tokenizer).manifest.train.steps == 2


@pytest.mark.parametrize("base,says", [("/nonexistent/model", "base_model='/nonexistent/model': no such folder"),
                                       ("Qwen/not-cached-here", "the hub is offline (HF_HUB_OFFLINE)")])
def test_a_base_model_that_cannot_be_loaded_is_one_line_naming_it(tmp_path, capsys, sft_cli, base, says):
    assert cli.main(sft_cli("--execute", base=base)) == 2
    line = _one_line(capsys.readouterr().err)
    assert says in line and "a Hugging Face folder (with config.json or adapter_config.json)" in line and "hub id" in line
    assert not (tmp_path / "run").exists()


def test_a_second_run_on_a_held_output_folder_is_refused_naming_the_holder(tmp_path, capsys, sft_cli):
    folder = tmp_path / "run"
    holder = subprocess.Popen(  # another process holding the folder as a training run does
        [sys.executable, "-c", "import sys; from training_assets.trainers.run_guards import hold_run_dir\n"
                               f"with hold_run_dir({str(folder)!r}):\n    print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert cli.main(sft_cli("--execute", out=folder)) == 1
        assert _one_line(capsys.readouterr().err) == (
            f"training-assets: error: {folder} is in use by another training run (pid {holder.pid}); "
            "wait for it to finish or train into another output folder")
        assert sorted(p.name for p in folder.iterdir()) == [LOCK_FILE]  # the refused run wrote nothing
    finally:
        holder.communicate("", timeout=60)
    with hold_run_dir(folder):  # the holder exited: the kernel released its lock
        with pytest.raises(RunDirBusy, match=f"pid {os.getpid()}"):
            with hold_run_dir(folder):  # a second holder in this very process (another open file) is refused too
                pass
