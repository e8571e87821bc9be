"""Numba's thread pool, started once, with OpenMP nesting turned back off.

When Numba's ``omp`` threading layer starts its pool it turns on nested OpenMP parallelism for
the whole process (``omp_set_max_active_levels(255)``; the GNU default is 1). In a process that
also runs torch (a Dagster run curates, then trains and evaluates in the same process), every
MKL GEMM inside one of torch's own parallel regions then opens a nested team, i.e. starts and
joins new threads on each call, once ``torch.set_num_threads`` has fixed MKL's thread count
(the trainers set it per run): a tiny model's forward went from 0.01 s to 0.8 s per batch, and
``make demo`` from 17 s to 45 s (``benchmarks/omp_nesting.py`` measures both sides). Our kernels
never nest a ``prange`` in another, so nothing of ours needs the nesting: ``launch()`` starts the
pool and sets the level back to 1, unless ``OMP_NESTED`` / ``OMP_MAX_ACTIVE_LEVELS`` ask for
nesting explicitly. Every module with a parallel kernel calls it at import, before any kernel
can start the pool on its own (not a package ``__init__``: ``kernels/`` stays a namespace folder
so that, from the repo root, it cannot shadow Hugging Face's ``kernels`` package).
"""

from __future__ import annotations

import ctypes
import functools
import os
import warnings

import numba

# Numba's OpenMP vendor name -> the runtime's soname. dlopen of a soname that is already loaded
# returns that very library, so this reaches the runtime Numba and torch share.
_RUNTIMES = {"GNU": "libgomp.so.1", "Intel": "libiomp5.so", "LLVM": "libomp.so"}


def nesting_requested() -> bool:
    """True when the environment asks OpenMP for nested parallelism (then it is left on)."""
    nested = os.environ.get("OMP_NESTED", "").strip().lower() in {"1", "true", "yes"}
    levels = os.environ.get("OMP_MAX_ACTIVE_LEVELS", "").strip()
    return nested or (levels.isdigit() and int(levels) > 1)


def openmp_runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime Numba's ``omp`` layer runs on, or None when that layer is not in use."""
    if numba.threading_layer() != "omp":
        return None
    from numba.np.ufunc import omppool

    name = _RUNTIMES.get(getattr(omppool, "openmp_vendor", ""), "libgomp.so.1")
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def max_active_levels() -> int | None:
    """OpenMP's max-active-levels for this process (None: Numba does not run on OpenMP)."""
    runtime = openmp_runtime()
    return None if runtime is None else int(runtime.omp_get_max_active_levels())


@functools.cache
def launch() -> str:
    """Start Numba's thread pool once (what its first parallel kernel would do) and undo the
    ``omp`` layer's process-wide nesting; returns the threading layer in use."""
    from numba.np.ufunc.parallel import _launch_threads

    _launch_threads()  # idempotent, and locked by Numba itself
    layer = numba.threading_layer()
    runtime = openmp_runtime()
    if layer == "omp" and runtime is None:
        warnings.warn("Numba runs on OpenMP but its runtime could not be loaded by soname, so OpenMP nesting "
                      "stays on: torch's CPU matmuls in this process may run many times slower; set "
                      "NUMBA_THREADING_LAYER=workqueue to avoid it", RuntimeWarning, stacklevel=2)
    elif runtime is not None and not nesting_requested():
        runtime.omp_set_max_active_levels(1)
    return layer
