"""Numba's pool starts with OpenMP nesting off (kernels/threads.py), unless the environment asks for it.

Each case runs in a new process: the pool, the OpenMP runtime and its settings are per process.
"""

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json
from training_assets_kernels import dedup, threads
import numba, numpy as np, torch
data = np.frombuffer(b"a b c d e f g h", dtype=np.uint8); offsets = np.array([0, 7, 15], dtype=np.int64)
dedup.shingle_hashes(data, offsets, 2)                      # a parallel kernel has run
torch.set_num_threads(1); torch.set_num_threads(2)          # what a trainer does around its loop
print(json.dumps({"layer": numba.threading_layer(), "levels": threads.max_active_levels()}))
"""


def _probe(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in {"OMP_NESTED", "OMP_MAX_ACTIVE_LEVELS"}}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True,
                         check=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_kernels_leave_openmp_nesting_off_after_numba_starts_its_pool():
    found = _probe()
    if found["layer"] != "omp":
        pytest.skip(f"Numba runs on the {found['layer']!r} threading layer here, not OpenMP: nothing to undo")
    assert found["levels"] == 1, found  # Numba's omp layer alone leaves 255: nested MKL teams in torch


def test_nesting_asked_for_in_the_environment_is_left_as_asked():
    found = _probe(OMP_MAX_ACTIVE_LEVELS="4")
    if found["layer"] != "omp":
        pytest.skip(f"Numba runs on the {found['layer']!r} threading layer here, not OpenMP")
    assert found["levels"] > 1, found
