"""Atomic, deterministic writes and content hashes.

Every write goes to a temporary sibling and is renamed into place, so a reader (or a crash)
never sees half a file. Parquet is written with fixed settings (no timestamps, no
statistics-dependent row-group splits) so the same table gives the same bytes, and the same
bytes give the same data version.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

HASH_CHUNK_BYTES = 1 << 20
_UMASK = os.umask(0)
os.umask(_UMASK)


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks (constant memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(HASH_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_tree(path: str | os.PathLike[str]) -> str:
    """Hash of a file or of every file under a folder (relative names and bytes, sorted)."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    digest = hashlib.sha256()
    for child in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(child.relative_to(path).as_posix().encode())
        digest.update(b"\0")
        digest.update(sha256_file(child).encode())
    return digest.hexdigest()


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace: the same object always gives the same text."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def fingerprint(*parts: Any) -> str:
    """A short stable hash of JSON-serialisable parts (configs, upstream versions, code versions)."""
    return hashlib.sha256(canonical_json(list(parts)).encode()).hexdigest()[:16]


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a folder be opened for fsync
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; on success rename it over ``target``.

    On an exception the temporary file is removed and ``target`` is untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file normal permissions
    try:
        yield tmp_path
        with open(tmp_path, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp_path, target)
        _fsync_dir(target.parent)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a fresh temporary folder; on success it replaces ``target`` whole.

    Used for partitions and checkpoints: re-materialising replaces the old folder, and a crash
    mid-write leaves the previous version (or nothing), never a mix.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
        old = None
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            if old.exists():
                shutil.rmtree(old)
            os.replace(target, old)
        os.replace(tmp, target)
        _fsync_dir(target.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_bytes_atomic(target: str | os.PathLike[str], data: bytes) -> Path:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)
    return Path(target)


def write_json_atomic(target: str | os.PathLike[str], obj: Any) -> Path:
    text = json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False, default=str) + "\n"
    return write_bytes_atomic(target, text.encode())


def write_jsonl(path: str | os.PathLike[str], rows: Iterable[dict[str, Any]]) -> int:
    """Write rows as canonical JSON lines into ``path`` (caller makes it atomic). Returns the count."""
    count = 0
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(canonical_json(row))
            handle.write("\n")
            count += 1
    return count


# Fixed Parquet settings: deterministic bytes for the same table.
PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 3,
    "use_dictionary": True,
    "write_statistics": True,
    "row_group_size": 64 * 1024,
    "store_schema": True,
}


def write_parquet(path: str | os.PathLike[str], table: pa.Table) -> None:
    """Write a pyarrow table to ``path`` with the project's fixed settings (caller makes it atomic)."""
    pq.write_table(table.replace_schema_metadata(None), path, **PARQUET_OPTIONS)
