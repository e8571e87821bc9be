"""Run a CUDA benchmark script of ``benchmarks/`` as a subprocess that sees no GPU, even on a GPU host."""

import os
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run_without_gpu(script: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True, env=env,
                          timeout=timeout)
