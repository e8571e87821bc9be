"""Trace batches: reading, validation, caps and batch identity.

The schema itself (``Trace``, ``Message``, ``parse_trace``, ...) lives in ``trace_schema`` and is
re-exported here, so ``traces.Trace`` and ``traces.read_batch`` are one import.

``iter_batch(path)`` streams a ``.jsonl`` or ``.jsonl.gz`` batch line by line in constant memory;
``summarise_batch`` counts it as it goes (the ``ingest`` verb's report) and ``read_batch`` keeps
every trace in memory (for small batches: examples and tests). Every line ends valid or
quarantined with its line number, a bounded copy of its raw bytes and a reason, so
``lines == valid + quarantined`` always holds; a line nested deeper than
``trace_schema.MAX_JSON_DEPTH`` is quarantined (``too_deeply_nested``) before it is parsed, so no
line can make a reader recurse. A file that cannot be read as a batch at all (missing, empty,
truncated gzip) or that passes a cap (``max_batch_bytes`` decompressed bytes,
``max_batch_lines`` lines: a gzip bomb stops at the cap) raises ``BatchError`` naming the file
and the cap.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from training_assets.trace_schema import (  # noqa: F401 - re-exported: the schema is part of this module's API
    REASON_PRIORITY,
    Message,
    Outcome,
    Role,
    ToolCall,
    ToolFunction,
    Trace,
    TraceMetadata,
    nesting_reason,
    parse_trace,
    render_messages,
    validation_reason,
)

DEFAULT_MAX_LINE_BYTES = 1 << 20  # 1 MiB: a longer line is quarantined, never parsed
# Caps of one batch (a batch is a unit of arrival; split larger exports). They bound what one
# file can cost: decompressed bytes read, and lines (each quarantined line is one record of
# ~100 bytes, ~20 us): a bomb of newlines stops after 1M lines, ~100 MB of quarantine.
DEFAULT_MAX_BATCH_BYTES = 4 << 30  # 4 GiB decompressed
DEFAULT_MAX_BATCH_LINES = 1_000_000
RAW_COPY_BYTES = 2048  # how much of a quarantined line is kept for inspection
REPORT_EXAMPLES = 10  # quarantined lines a batch report shows
READ_CHUNK_BYTES = 1 << 16
BATCH_SUFFIXES = (".jsonl.gz", ".jsonl")
UTF8_BOM = b"\xef\xbb\xbf"
NUL = b"\x00"


class BatchError(Exception):
    """A batch file that cannot be read at all (as opposed to a bad line, which is quarantined)."""


@dataclass(frozen=True)
class BatchCaps:
    """Limits applied while reading one batch (the library form of the raw_traces config)."""

    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES  # longer lines are quarantined (line_too_long)
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES  # more decompressed bytes: BatchError
    max_batch_lines: int = DEFAULT_MAX_BATCH_LINES  # more lines: BatchError

    def __post_init__(self) -> None:
        for name in ("max_line_bytes", "max_batch_bytes", "max_batch_lines"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")


@dataclass(frozen=True)
class QuarantinedLine:
    line_no: int
    reason: str  # a short code: malformed_json, invalid_utf8, missing_field, ...
    detail: str  # what exactly is wrong, for a person
    raw: str  # the first RAW_COPY_BYTES bytes of the line, decoded with replacement

    def to_dict(self) -> dict[str, Any]:
        return {"line_no": self.line_no, "reason": self.reason, "detail": self.detail, "raw": self.raw}


@dataclass
class BatchResult:
    path: Path
    lines: int = 0
    valid: list[Trace] = field(default_factory=list)
    valid_line_nos: list[int] = field(default_factory=list)
    quarantined: list[QuarantinedLine] = field(default_factory=list)

    @property
    def reasons(self) -> dict[str, int]:
        return dict(sorted(Counter(q.reason for q in self.quarantined).items()))


@dataclass
class BatchSummary:
    """A batch's counts, taken as it streams: what ``training-assets ingest`` reports, in constant memory."""

    path: Path
    lines: int = 0
    valid: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    examples: list[QuarantinedLine] = field(default_factory=list)  # the first REPORT_EXAMPLES quarantined lines

    @property
    def quarantined(self) -> int:
        return self.lines - self.valid

    def report(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "lines": self.lines,
            "valid": self.valid,
            "quarantined": self.quarantined,
            "quarantine_rate": round(self.quarantined / self.lines if self.lines else 0.0, 6),
            "reasons": dict(sorted(self.reasons.items())),
            "examples": [q.to_dict() for q in self.examples],
        }


def _open_binary(path: Path):
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


class _Budget:
    """Counts decompressed bytes and lines of one batch and stops at the caps."""

    def __init__(self, path: Path, caps: BatchCaps) -> None:
        self.path, self.caps, self.bytes, self.lines = path, caps, 0, 0

    def spend(self, n_bytes: int) -> None:
        self.bytes += n_bytes
        if self.bytes > self.caps.max_batch_bytes:
            raise BatchError(f"batch {self.path}: more than max_batch_bytes={self.caps.max_batch_bytes} decompressed "
                             f"bytes (cap reached at line {self.lines + 1}); split the batch or raise the cap")

    def line(self) -> None:
        self.lines += 1
        if self.lines > self.caps.max_batch_lines:
            raise BatchError(f"batch {self.path}: more than max_batch_lines={self.caps.max_batch_lines} lines; "
                             "split the batch or raise the cap")


def _raw_lines(handle, caps: BatchCaps, budget: _Budget) -> Iterator[tuple[bytes, bool]]:
    """Yield (line, oversized) without ever holding more than max_line_bytes of one line."""
    while True:
        line = handle.readline(caps.max_line_bytes + 1)
        if not line:
            return
        budget.spend(len(line))
        budget.line()
        if len(line) > caps.max_line_bytes and not line.endswith(b"\n"):
            head = line[:RAW_COPY_BYTES]
            while line and not line.endswith(b"\n"):  # drain the rest of the long line
                line = handle.readline(READ_CHUNK_BYTES)
                budget.spend(len(line))
            yield head, True
            continue
        yield line.rstrip(b"\r\n") if line.endswith(b"\n") else line, False


def _classify(line: bytes, oversized: bool, max_line_bytes: int) -> Trace | tuple[str, str]:
    if oversized or len(line) > max_line_bytes:
        return "line_too_long", f"line is longer than max_line_bytes={max_line_bytes}"
    if line.startswith(UTF8_BOM):
        return "byte_order_mark", "line starts with a UTF-8 byte-order mark; save the file as UTF-8 without BOM"
    if NUL in line:
        return "nul_byte", f"NUL byte at offset {line.index(NUL)}"
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return "invalid_utf8", f"invalid UTF-8 at byte {exc.start}: {exc.reason}"
    if not text.strip():
        return "blank_line", "line is empty"
    too_deep = nesting_reason(line)
    if too_deep is not None:  # before json.loads, which recurses once per level
        return too_deep
    try:
        obj = json.loads(text)
    except ValueError as exc:
        return "malformed_json", str(exc)
    try:
        return parse_trace(obj)
    except ValidationError as exc:
        return validation_reason(exc)
    except PydanticCustomError as exc:
        return exc.type, exc.message()


def check_batch_path(path: str | os.PathLike[str], caps: BatchCaps | None = None) -> Path:
    path = Path(path)
    if not path.name.endswith(BATCH_SUFFIXES):
        raise BatchError(f"batch {path}: expected a .jsonl or .jsonl.gz file")
    if not path.is_file():
        raise BatchError(f"batch {path}: no such file")
    if not os.access(path, os.R_OK):
        raise BatchError(f"batch {path}: file is not readable (check its permissions)")
    size = path.stat().st_size
    if size == 0:
        raise BatchError(f"batch {path}: file is empty; remove it from the inbox or fill it")
    if caps is not None and not path.name.endswith(".gz") and size > caps.max_batch_bytes:
        raise BatchError(f"batch {path}: {size} bytes is more than max_batch_bytes={caps.max_batch_bytes}; "
                         "split the batch or raise the cap")
    return path


def iter_batch(
    path: str | os.PathLike[str], max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, caps: BatchCaps | None = None,
) -> Iterator[tuple[int, Trace | QuarantinedLine]]:
    """Stream ``(line_no, Trace | QuarantinedLine)`` over a batch, 1-based line numbers.

    Duplicate ``trace_id``s within the batch are quarantined after their first occurrence.
    ``caps`` (default: ``BatchCaps(max_line_bytes)``) bounds the decompressed bytes and lines.
    Raises ``BatchError`` for a file that cannot be read as a batch (empty, truncated gzip, past
    a cap, ...).
    """
    caps = caps or BatchCaps(max_line_bytes=max_line_bytes)
    path = check_batch_path(path, caps)
    budget = _Budget(path, caps)
    seen: set[str] = set()
    line_no = 0
    try:
        with _open_binary(path) as handle:
            for line_no, (line, oversized) in enumerate(_raw_lines(handle, caps, budget), start=1):
                verdict = _classify(line, oversized, caps.max_line_bytes)
                if isinstance(verdict, Trace):
                    if verdict.trace_id in seen:
                        verdict = ("duplicate_trace_id", f"trace_id {verdict.trace_id!r} already appeared in this batch")
                    else:
                        seen.add(verdict.trace_id)
                        yield line_no, verdict
                        continue
                reason, detail = verdict
                raw = line[:RAW_COPY_BYTES].decode("utf-8", errors="replace")
                yield line_no, QuarantinedLine(line_no, reason, detail, raw)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise BatchError(
            f"batch {path}: compressed stream is truncated or corrupt after line {line_no} ({exc}); "
            "re-export the batch"
        ) from exc
    except OSError as exc:
        raise BatchError(f"batch {path}: cannot be read: {exc}") from exc
    if line_no == 0:
        raise BatchError(f"batch {path}: holds no lines (empty after decompression)")


def summarise_batch(path: str | os.PathLike[str], caps: BatchCaps | None = None) -> BatchSummary:
    """Count a batch as it streams (lines, valid, reasons, the first quarantined lines); holds no trace."""
    summary = BatchSummary(path=Path(path))
    for _, item in iter_batch(path, caps=caps):
        summary.lines += 1
        if isinstance(item, Trace):
            summary.valid += 1
            continue
        summary.reasons[item.reason] += 1
        if len(summary.examples) < REPORT_EXAMPLES:
            summary.examples.append(item)
    return summary


def read_batch(path: str | os.PathLike[str], max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
               caps: BatchCaps | None = None) -> BatchResult:
    """Read a whole batch into memory: every line is in ``.valid`` or ``.quarantined``.

    Holds every trace: for small batches. ``iter_batch`` streams, ``summarise_batch`` only counts.
    """
    result = BatchResult(path=Path(path))
    for line_no, item in iter_batch(path, max_line_bytes=max_line_bytes, caps=caps):
        result.lines += 1
        if isinstance(item, Trace):
            result.valid.append(item)
            result.valid_line_nos.append(line_no)
        else:
            result.quarantined.append(item)
    return result


# --------------------------------------------------------------------------- batch identity

SAFE_BATCH_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
SAFE_BATCH_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
FINGERPRINT_CHARS = 12


def batch_stem(name: str) -> str:
    for suffix in BATCH_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def unsafe_name_reason(name: str) -> str | None:
    """Why a file name cannot become a partition key, or None when it is safe."""
    if not name.endswith(BATCH_SUFFIXES):
        return "not a .jsonl or .jsonl.gz file"
    stem = batch_stem(name)
    if ".." in name:
        return "name contains '..'"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "name contains control characters"
    if "/" in name or "\\" in name:
        return "name contains a path separator"
    if not SAFE_BATCH_NAME.match(stem):
        return "name must start with a letter or digit and use only letters, digits, '.', '_' and '-' (at most 96)"
    return None


def check_batch_id(batch_id: str) -> str:
    """``batch_id`` when it is a safe partition key (a plain folder name), else a ``BatchError``.

    Partition keys reach the assets from the instance (a sensor, a backfill, the UI, GraphQL);
    they become folder names under the data root, so they are checked where they are used.
    """
    if not isinstance(batch_id, str) or not SAFE_BATCH_ID.match(batch_id) or ".." in batch_id:
        raise BatchError(f"partition key {batch_id!r} is not a safe batch id: it must start with a letter or digit, "
                         "use only letters, digits, '.', '_' and '-', hold no '..' and be at most 128 characters")
    return batch_id


def batch_id_for(name: str, size: int, mtime_ns: int) -> str:
    """Partition key of an inbox file: its stem plus a fingerprint of (name, size, mtime).

    Computed from ``stat`` alone, so a sensor tick never reads a batch. The same file seen again
    (a daemon restart, a lost cursor) gives the same key, so its ``run_key`` stops a second run;
    new content under an old name changes the size or the mtime, so it is a new batch. The
    content hash is taken when the run stages the file (``inbox.stage_batch``), which also
    recognises a re-dropped identical file as a duplicate of its first batch.
    """
    digest = hashlib.sha256(f"{name}\x1f{size}\x1f{mtime_ns}".encode()).hexdigest()[:FINGERPRINT_CHARS]
    return f"{batch_stem(name)}-{digest}"
