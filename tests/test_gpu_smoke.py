"""benchmarks/gpu_smoke.py on a host without a GPU: --help, the exit-2 message, and --dry-run's wiring."""

import json

from tests.gpu_scripts import run_without_gpu


def run(*args, timeout=240):
    return run_without_gpu("gpu_smoke.py", *args, timeout=timeout)


def test_help_needs_no_torch_and_unknown_checks_are_refused():
    done = run("--help")
    assert done.returncode == 0 and "--dry-run" in done.stdout and "vllm_grpo" in done.stdout
    bad = run("--checks", "lora,warp_drive")
    assert bad.returncode == 2 and "unknown checks ['warp_drive']" in bad.stderr


def test_without_cuda_it_exits_2_saying_why():
    done = run("--checks", "lora")
    assert done.returncode == 2 and "no CUDA device" in done.stderr and "--dry-run" in done.stderr
    assert "RESULT" not in done.stdout


def test_dry_run_trains_the_tiny_model_round_trips_fsdp_and_skips_with_reasons():
    done = run("--dry-run", "--checks", "lora,qlora,liger,fsdp,vllm_grpo")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["dry_run"] is True and result["device"] == "cpu (dry run)"
    lora = result["lora"]
    assert lora["tokens_per_s"] > 0 and lora["ok"] and 0 < lora["trainable"] < lora["params"]
    assert result["fsdp"]["backend"] == "gloo" and result["fsdp"]["tensors_equal"] and result["fsdp"]["loss_gap"] == 0.0
    for name in ("qlora", "liger", "vllm_grpo"):
        assert "needs CUDA" in result[name]["skipped"]
        assert f"{name}: skipped: " in done.stdout  # one line per check, as printed
