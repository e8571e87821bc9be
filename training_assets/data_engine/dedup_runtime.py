"""Run-time helpers of ``data_engine.dedup``: Numba thread count per stage, a paused cyclic
garbage collector for bulk assembly, and per-stage wall / CPU timings."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numba

# Work per extra Numba thread before a stage goes parallel: a parallel region costs ~0.01 ms on
# an idle machine but 1-40 ms on a loaded one (threads wait to be scheduled), so a stage smaller
# than this runs on one thread. Units: bytes for byte-bound stages, documents for LSH. 2 MB is
# ~4 ms of shingling per thread; at 4 MB the verification of a 22 MB corpus (5 MB of candidate
# documents) stayed on one thread: the 2-thread dedup of benchmarks/dedup.py went 0.060 -> 0.051 s.
BYTES_PER_THREAD = 2 << 20
DOCS_PER_THREAD = 50_000


@contextmanager
def threads_for(work: int, per_thread: int) -> Iterator[int]:
    """Run the block on ``min(configured threads, work // per_thread)`` (>= 1) Numba threads.

    Results never depend on the thread count (the kernels write disjoint slices), only the time.
    """
    configured = numba.get_num_threads()
    wanted = max(1, min(configured, work // per_thread))
    if wanted != configured:
        numba.set_num_threads(wanted)
    try:
        yield wanted
    finally:
        if wanted != configured:
            numba.set_num_threads(configured)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause CPython's cyclic garbage collector while the block allocates many containers: each
    collection it would trigger walks every tracked object, the caller's records included (at
    10^6 records, assembling spent most of its time there). Nothing built here forms a cycle."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def lap(timings: dict[str, float] | None, stage: str, since: tuple[float, float]) -> tuple[float, float]:
    """Add the wall seconds since ``since`` to ``timings[stage]`` and the process CPU seconds
    (all threads) to ``timings[stage + "_cpu"]``, when timings are asked for; -> now (``now``)."""
    current = now()
    if timings is not None:
        timings[stage] = timings.get(stage, 0.0) + current[0] - since[0]
        timings[stage + "_cpu"] = timings.get(stage + "_cpu", 0.0) + current[1] - since[1]
    return current


def now() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()
