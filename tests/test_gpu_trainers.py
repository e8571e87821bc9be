"""benchmarks/gpu_trainers.py on a host without a GPU: --help, the exit-2 message, and --dry-run's wiring."""

import json
import math

from tests.gpu_scripts import run_without_gpu


def run(*args, timeout=300):
    return run_without_gpu("gpu_trainers.py", *args, timeout=timeout)


def test_help_and_unknown_kinds_and_no_cuda_are_one_line_each():
    done = run("--help")
    assert done.returncode == 0 and "--dry-run" in done.stdout and "--trl-liger" in done.stdout
    bad = run("--kinds", "sft,ppo")
    assert bad.returncode == 2 and "unknown ['ppo']" in bad.stderr
    none = run("--kinds", "sft")
    assert none.returncode == 2 and "no CUDA device" in none.stderr and "RESULT" not in none.stdout


def test_dry_run_runs_every_kind_on_both_sides_from_the_same_model():
    done = run("--dry-run")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1].removeprefix("RESULT "))
    assert result["dry_run"] and result["ok"] and set(result["results"]) == {"sft", "dpo", "grpo"}
    for kind, metric in (("sft", "tokens_per_s"), ("dpo", "tokens_per_s"), ("grpo", "rollout_tokens_per_s")):
        res = result["results"][kind]
        assert res["ours"][metric] > 0 and res["trl"][metric] > 0 and res["ours_vs_trl"]["speed_median"] > 0
    # LoRA starts as the base model on both sides: DPO's first loss is ln 2 for each
    for side in ("ours", "trl"):
        assert math.isclose(result["results"]["dpo"][side]["first_losses"][0], math.log(2), abs_tol=1e-3)
    assert sum(line.startswith(("sft round", "dpo round", "grpo round")) for line in done.stdout.splitlines()) == 6
