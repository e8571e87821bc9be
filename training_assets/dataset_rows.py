"""Memory-mapped dataset rows: ``DatasetRows`` reads the rows a micro-batch needs, not the dataset.

    rows = open_dataset_rows("sft_dataset", root)   # maps <root>/sft_dataset/arrow/<sha256>.arrow
    len(rows), rows[0], rows.take([5, 2, 9])        # dicts, equal to load_sft_dataset()'s rows
    rows.column("n_tokens")                         # (N,) numpy, no Python objects
    rows.list_lengths("input_ids")                  # (N,) int64 per-row list lengths
    rows.token_ids("input_ids", [5, 2])             # one numpy view per row, no copy
    rows[:100]                                      # the first 100 rows, still mapped

Why an Arrow IPC file beside the Parquet: ``data.parquet`` is the contract (its bytes give the
data version), but its pages are zstd-compressed and dictionary-encoded, so reading it — even
through a memory map — decodes every column into anonymous memory: ``to_pylist`` of a 1M-row SFT
set is GBs of Python ints. An uncompressed Arrow IPC file is laid out as Arrow's own buffers, so
opening it through a memory map is zero-copy: opening it costs milliseconds, pages come
in from the page cache on first touch, and resident memory grows with the rows read (and stays
reclaimable file cache). ``datasets.Dataset.from_parquet`` does the same conversion into its own
cache, but costs the ``datasets`` import and its fingerprinting at every start-up;
``benchmarks/trainer_startup.py --with-hf`` measures both.

The cache is derived: written once from ``data.parquet`` one row group at a time (bounded memory),
atomically (temp + rename, so concurrent ranks or a crash never leave half a file) and named by
the Parquet's sha256, so a rewritten dataset never reads a stale cache. ``write_dataset`` replaces
the dataset folder whole, which drops the old caches with it.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from training_assets.storage import atomic_path, sha256_file

log = logging.getLogger(__name__)

CACHE_DIR = "arrow"
ITER_CHUNK_ROWS = 4096  # rows converted to dicts at a time when a DatasetRows is iterated
_NUMPY_TYPES = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64,
                pa.uint8(): np.uint8, pa.float32(): np.float32, pa.float64(): np.float64}


def as_numpy(array: pa.Array) -> np.ndarray:
    """A numeric Arrow array without nulls as a read-only numpy view of its buffer; anything else converted.

    pyarrow's own ``to_numpy`` imports pandas on first use (seconds of a trainer's start-up), so the
    common case reads the data buffer directly.
    """
    dtype = _NUMPY_TYPES.get(array.type)
    if dtype is None or array.null_count:
        return array.to_numpy(zero_copy_only=False)
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=array.offset + len(array))[array.offset:]


def arrow_cache_path(parquet: str | os.PathLike[str], sha256: str | None = None) -> Path:
    """``<dataset dir>/arrow/<sha256 of the Parquet>.arrow``."""
    parquet = Path(parquet)
    return parquet.parent / CACHE_DIR / f"{sha256 or sha256_file(parquet)}.arrow"


def ensure_arrow_cache(parquet: str | os.PathLike[str], sha256: str | None = None) -> Path:
    """The Arrow IPC twin of ``parquet``, written first if missing (row group by row group, atomically).

    ``sha256``: the Parquet's, already computed (and verified: ``training_data.verified_dataset_file``).
    """
    parquet = Path(parquet)
    target = arrow_cache_path(parquet, sha256)
    if target.is_file():
        return target
    source = pq.ParquetFile(parquet)
    with atomic_path(target) as tmp:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, source.schema_arrow) as writer:
            for i in range(source.num_row_groups):
                writer.write_table(source.read_row_group(i))
    _drop_page_cache(target)
    return target


def _drop_page_cache(path: Path) -> None:
    """Evict a just-written (and fsynced) file from the page cache. Written pages sit there as large
    folios (2 MB on this kernel's ext4), and touching one byte of a mapped large folio maps all of
    it: a trainer reading 8 random rows had ~40 MB of the file resident, against ~1 MB when the
    pages come back through reads of the rows alone."""
    if not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    except OSError as exc:  # advice only: the cache itself is written and complete
        log.debug("could not evict %s from the page cache: %s", path, exc)


def _int64_array(values: np.ndarray) -> pa.Array:
    """Indices for ``take``, built on the numpy buffer (``pa.array`` would import pandas on first use)."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


class DatasetRows(Sequence):
    """Row access over an Arrow table (memory-mapped when opened from a dataset): rows as dicts on demand.

    ``take(indices)`` gives the dicts of one micro-batch in the order asked, as ``to_pylist`` would;
    column access returns numpy without building Python lists. Slicing gives another
    ``DatasetRows`` over the same buffers (``rows[:limit]``).
    """

    def __init__(self, table: pa.Table, source: str | None = None, mapping: _Mapping | None = None) -> None:
        self.table, self.source, self._mapping = table, source, mapping
        self._batches = table.to_batches()
        self._starts = np.cumsum([0] + [b.num_rows for b in self._batches], dtype=np.int64)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled by value (the table's buffers are copied; an mmap cannot be pickled)."""
        return {"table": self.table, "source": self.source}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["table"], state["source"])

    def _will_scan(self, name: str) -> None:
        """Ask the kernel to read column ``name``'s buffers ahead (``MADV_WILLNEED``): the map is
        ``MADV_RANDOM`` for the shuffled row reads of training, under which a whole-column scan of a
        cold file would fault in one page at a time."""
        if self._mapping is not None:
            for chunk in self.table.column(name).chunks:
                self._mapping.will_need(chunk)

    def __repr__(self) -> str:
        return f"DatasetRows({self.source or 'in memory'}, {len(self)} rows, columns={self.column_names})"

    @property
    def column_names(self) -> list[str]:
        return list(self.table.column_names)

    def __len__(self) -> int:
        return self.table.num_rows

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> DatasetRows: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | DatasetRows:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return DatasetRows(self.table.take(_int64_array(np.arange(start, stop, step))), self.source)
            return DatasetRows(self.table.slice(start, max(stop - start, 0)), self.source, self._mapping)
        return self.take([index])[0]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for name in self.column_names:
            self._will_scan(name)
        for batch in self._batches:
            for start in range(0, batch.num_rows, ITER_CHUNK_ROWS):
                yield from batch.slice(start, ITER_CHUNK_ROWS).to_pylist()

    def _locate(self, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(batch number, row within that batch) of each index; negative indices count from the end."""
        n = len(self)
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        idx = np.where(idx < 0, idx + n, idx)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = int(np.asarray(indices).reshape(-1)[(idx < 0) | (idx >= n)][0])
            raise IndexError(f"row {bad} is out of range for {self.source or 'the dataset'} ({n} rows)")
        batch = np.searchsorted(self._starts, idx, side="right") - 1
        return batch, idx - self._starts[batch]

    def take(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """The rows at ``indices`` (any order, repeats allowed) as dicts: O(len(indices)), not O(N)."""
        batch, local = self._locate(indices)
        out: list[dict[str, Any] | None] = [None] * len(batch)
        for b in np.unique(batch):
            where = np.flatnonzero(batch == b)
            picked = self._batches[int(b)].take(_int64_array(local[where])).to_pylist()
            for position, row in zip(where.tolist(), picked, strict=True):
                out[position] = row
        return out  # type: ignore[return-value]

    def column(self, name: str) -> np.ndarray:
        """A scalar column as numpy (zero-copy for a single chunk without nulls; several chunks are joined)."""
        self._check_column(name)
        array = self.table.column(name)
        if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
            raise TypeError(f"column {name!r} holds lists; use list_lengths / list_chunks / token_ids")
        self._will_scan(name)
        parts = [as_numpy(chunk) for chunk in array.chunks]
        return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, _NUMPY_TYPES.get(array.type))

    def list_lengths(self, name: str) -> np.ndarray:
        """(N,) int64: the length of each row's list in column ``name`` (from the offsets, no values read)."""
        self._check_column(name)
        self._will_scan(name)
        parts = [np.diff(as_numpy(chunk.offsets)).astype(np.int64) for chunk in self.table.column(name).chunks]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def column_sum(self, name: str) -> int:
        """The sum of a scalar integer column, chunk by chunk on the mapped buffers (nothing copied)."""
        self._check_column(name)
        if self.table.column(name).null_count:
            raise ValueError(f"{self.source or 'dataset'}: column {name!r} has nulls; it cannot be summed as token counts")
        self._will_scan(name)
        return sum(int(as_numpy(chunk).sum(dtype=np.int64)) for chunk in self.table.column(name).chunks)

    def list_total(self, name: str) -> int:
        """The total length of column ``name``'s lists: ``sum(list_lengths(name))`` from two offsets per chunk."""
        self._check_column(name)
        total = 0
        for chunk in self.table.column(name).chunks:
            if len(chunk):
                offsets = as_numpy(chunk.offsets)
                total += int(offsets[-1]) - int(offsets[0])
        return total

    def list_chunks(self, name: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(offsets, values)`` of a list column, one chunk at a time, zero-copy: the chunk's row i is
        ``values[offsets[i]:offsets[i+1]]`` (offsets index into ``values`` as given)."""
        self._check_column(name)
        self._will_scan(name)
        for chunk in self.table.column(name).chunks:
            yield as_numpy(chunk.offsets), as_numpy(chunk.values)

    def token_ids(self, name: str, indices: Sequence[int]) -> list[np.ndarray]:
        """Row ``i``'s list in column ``name`` as a numpy view of the mapped buffer, for each index."""
        self._check_column(name)
        batch, local = self._locate(indices)
        out = []
        for b, i in zip(batch.tolist(), local.tolist(), strict=True):
            array = self._batches[b].column(name)
            start, stop = array.offsets[i].as_py(), array.offsets[i + 1].as_py()
            out.append(as_numpy(array.values.slice(start, stop - start)))
        return out

    def _check_column(self, name: str) -> None:
        if name not in self.table.column_names:
            raise KeyError(f"{self.source or 'dataset'} has no column {name!r}; columns: {self.column_names}")


def open_rows_file(parquet: str | os.PathLike[str], sha256: str | None = None) -> DatasetRows:
    """``DatasetRows`` over a Parquet file through its memory-mapped Arrow IPC cache (built on first open).

    ``sha256``: the Parquet's, when the caller hashed it already (to verify it); else it is hashed here.
    """
    parquet = Path(parquet)
    if not parquet.is_file():
        raise FileNotFoundError(f"no Parquet file at {parquet}")
    cache = ensure_arrow_cache(parquet, sha256)
    mapping = _Mapping(cache)
    return DatasetRows(pa.ipc.open_file(pa.BufferReader(mapping.buffer)).read_all(), str(parquet), mapping)


class _Mapping:
    """A file memory-mapped read-only as one zero-copy Arrow buffer, advised ``MADV_RANDOM``: rows
    are read in shuffled order, so the kernel's read-around (pages near each fault, which no one
    reads) only inflates the resident set: 8 random rows of a 1M-row SFT set mapped 9.4 MB of the
    file with it, 0.7 MB without. Whole-column scans ask for their own ranges ahead (``will_need``).
    The buffer keeps the map alive as long as any table slice of it exists."""

    def __init__(self, path: Path) -> None:
        if path.stat().st_size == 0:
            raise ValueError(f"{path} is empty: a damaged Arrow cache; delete it and it is rebuilt from the Parquet")
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._advise = hasattr(self._map, "madvise") and hasattr(mmap, "MADV_RANDOM") and hasattr(mmap, "MADV_WILLNEED")
        if self._advise:
            self._map.madvise(mmap.MADV_RANDOM)
        self.buffer = pa.py_buffer(self._map)

    def will_need(self, array: pa.Array) -> None:
        """``MADV_WILLNEED`` over the mapped ranges of ``array``'s buffers (``buffers()`` lists the children's too)."""
        if not self._advise:
            return
        base, size = self.buffer.address, self.buffer.size
        for buf in (b for b in array.buffers() if b is not None):
            start = buf.address - base
            if buf.size and 0 <= start < size:
                aligned = start - start % mmap.PAGESIZE
                self._map.madvise(mmap.MADV_WILLNEED, aligned, min(buf.size + start - aligned, size - aligned))

