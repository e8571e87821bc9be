"""Files of the Ray engine's work folder: global record positions, partitioned writes, task runner.

Every intermediate of a run lives under ``<data root>/ray_work/<run id>/`` (Parquet and .npy),
never in Ray's object store: a task reads the files of the stage before and writes its own, so a
retried task (a killed worker, ``max_retries``) rewrites the same bytes, and nothing outlives the
run (the driver removes the folder). The folder must be on a file system every node sees.

A record's global position ``gpos = shard << 40 | row`` (int64) orders records exactly as the
local engine's input order: shards are numbered in input order and rows within a shard keep
theirs, so "the smallest index in a cluster" of ``dedup.py`` is "the smallest gpos" here.

    >>> int(gpos_of(3, np.arange(2))[1]), int(shard_of(np.int64(3 << 40 | 7)))
    (3298534883329, 3)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numba
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from training_assets.storage import write_parquet

ROW_BITS = 40  # rows per shard < 2^40; shards < 2^23


def gpos_of(shard: int, rows: np.ndarray) -> np.ndarray:
    return (np.int64(shard) << np.int64(ROW_BITS)) | np.asarray(rows, np.int64)


def shard_of(gpos: np.ndarray) -> np.ndarray:
    return np.asarray(gpos, np.int64) >> np.int64(ROW_BITS)


def row_of(gpos: np.ndarray) -> np.ndarray:
    return np.asarray(gpos, np.int64) & np.int64((1 << ROW_BITS) - 1)


def save_table(path: Path, table: pa.Table) -> None:
    """Write a Parquet file whole (temp + rename): a retried task replaces it, readers never see half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write_parquet(tmp, table)
    os.replace(tmp, path)


def save_npy(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as handle:
        np.save(handle, array, allow_pickle=False)
    os.replace(tmp, path)


def load_npy(path: Path, mmap: bool = False) -> np.ndarray:
    return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)


def read_tables(folder: Path, schema: pa.Schema) -> pa.Table:
    """Every Parquet file of ``folder`` (sorted by name), concatenated; empty when there are none."""
    files = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
    if not files:
        return schema.empty_table()
    return pa.concat_tables([pq.read_table(f, schema=schema) for f in files])


def read_arrays(folder: Path, width: int, dtype: Any = np.int64) -> np.ndarray:
    files = sorted(folder.glob("*.npy")) if folder.is_dir() else []
    arrays = [load_npy(f) for f in files]
    return np.concatenate(arrays) if arrays else np.zeros((0, width), dtype)


def write_partitioned(folder: Path, name: str, table: pa.Table, part: np.ndarray, n_parts: int,
                      prefix: str = "p") -> None:
    """Split ``table`` by ``part`` (int per row) into ``folder/<prefix><p>/<name>.parquet`` for every p
    (empty files too, so a reader knows its inputs are complete)."""
    order = np.argsort(part, kind="stable")
    bounds = np.searchsorted(part[order], np.arange(n_parts + 1))
    for p in range(n_parts):
        save_table(folder / f"{prefix}{p}" / f"{name}.parquet", table.take(order[bounds[p]:bounds[p + 1]]))


def write_partitioned_npy(folder: Path, name: str, array: np.ndarray, part: np.ndarray, n_parts: int,
                          prefix: str = "p") -> None:
    order = np.argsort(part, kind="stable")
    bounds = np.searchsorted(part[order], np.arange(n_parts + 1))
    for p in range(n_parts):
        save_npy(folder / f"{prefix}{p}" / f"{name}.npy", array[order[bounds[p]:bounds[p + 1]]])


def group_starts(*keys: np.ndarray) -> np.ndarray:
    """Start index of each run of equal consecutive rows over the key columns (rows already sorted)."""
    n = len(keys[0])
    if n == 0:
        return np.zeros(0, np.int64)
    change = np.zeros(n, bool)
    change[0] = True
    for key in keys:
        change[1:] |= key[1:] != key[:-1]
    return np.nonzero(change)[0]


def group_pairs(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """All pairs (values[i], values[j]), i < j, inside each group [starts[g], starts[g+1]): int64[M, 2].
    Cost: the sum over groups of size^2 / 2 (what LSH buckets cost in ``lsh_candidates`` too)."""
    ends = np.append(starts[1:], len(values))
    group_end = np.repeat(ends, ends - starts)
    pos = np.arange(len(values))
    out = []
    d = 1
    while True:
        pos = pos[pos + d < group_end[pos]]
        if not len(pos):
            break
        out.append(np.stack([values[pos], values[pos + d]], axis=1))
        d += 1
    return np.concatenate(out) if out else np.zeros((0, 2), np.int64)


def _peak_rss_reset() -> bool:
    """Reset this process's peak RSS (Linux ``clear_refs`` 5) so the task reports its own peak."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:  # not Linux, or not permitted: the peak is then the worker process's lifetime peak
        return False


def _peak_rss_bytes() -> int | None:
    status = Path("/proc/self/status")
    if not status.is_file():
        return None
    for line in status.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None


def run_task(function: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """What every Ray task runs: ``function(**kwargs)``, with its wall seconds and peak RSS.

    Numba runs single-threaded inside a task: parallelism comes from the tasks, one per CPU.
    """
    numba.set_num_threads(1)
    own_peak = _peak_rss_reset()
    start = time.perf_counter()
    result = function(**kwargs)
    return {"result": result, "seconds": time.perf_counter() - start, "peak_rss": _peak_rss_bytes(),
            "own_peak": own_peak}


def shards_with(gpos: np.ndarray) -> Sequence[int]:
    return np.unique(shard_of(gpos)).tolist() if len(gpos) else []
