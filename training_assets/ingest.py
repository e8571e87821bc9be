"""The trace partition store: inbox scanning, batch staging, per-partition Parquet.

Pure library (no Dagster): the sensor and the ``raw_traces`` asset are thin wrappers around it.

- ``scan_inbox`` finds new batch files, refuses unsafe names (moved to ``inbox/_rejected`` with a
  ``.reason`` file) and stages each accepted file as an immutable snapshot
  ``batches/<batch_id><suffix>``, where ``batch_id`` is the name plus a content hash: new
  content under an old name is a new batch, never an overwrite.
- ``write_raw_traces`` turns one staged batch into ``raw_traces/<batch_id>/traces.parquet`` and
  ``quarantine.jsonl``, atomically, replacing the partition whole.
- ``load_traces`` reads traces back for downstream stages.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from training_assets import paths
from training_assets.storage import atomic_dir, atomic_path, canonical_json, sha256_file, sha256_tree
from training_assets.traces import (
    BATCH_SUFFIXES,
    DEFAULT_MAX_LINE_BYTES,
    BatchError,
    QuarantinedLine,
    Trace,
    batch_id_for,
    iter_batch,
    unsafe_name_reason,
)

# Bump when the Parquet layout or validation rules change: it is the asset's code version.
INGEST_VERSION = "1"
TRACES_FILE = "traces.parquet"
QUARANTINE_FILE = "quarantine.jsonl"
WRITE_CHUNK_ROWS = 1024  # rows buffered before a Parquet row batch is flushed

TRACE_SCHEMA = pa.schema([
    ("batch_id", pa.string()),
    ("line_no", pa.int64()),
    ("trace_id", pa.string()),
    ("task_id", pa.string()),
    ("success", pa.bool_()),
    ("score", pa.float64()),
    ("failure_point", pa.int64()),
    ("n_messages", pa.int64()),
    ("n_tool_calls", pa.int64()),
    ("agent", pa.string()),
    ("model", pa.string()),
    ("created_at", pa.string()),
    ("source", pa.string()),
    ("trace_json", pa.string()),  # the whole validated trace, canonical JSON
])


# --------------------------------------------------------------------------- inbox


@dataclass(frozen=True)
class StagedBatch:
    batch_id: str
    source_name: str
    path: Path  # the immutable snapshot under batches/


@dataclass
class InboxScan:
    new: list[StagedBatch] = field(default_factory=list)
    known: list[str] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (file name, reason)
    fingerprints: dict[str, list[Any]] = field(default_factory=dict)  # name -> [size, mtime_ns, batch_id]


def _suffix(name: str) -> str:
    return next(s for s in BATCH_SUFFIXES if name.endswith(s))


def _is_candidate(entry: os.DirEntry[str]) -> bool:
    # Writers drop files atomically (temp name + rename); hidden and temp files are not batches yet.
    return entry.is_file() and not entry.name.startswith((".", "_")) and not entry.name.endswith((".tmp", ".part"))


def reject_file(path: Path, reason: str, root: str | os.PathLike[str] | None = None) -> Path:
    """Move a refused inbox file aside (never delete it) with a note saying why."""
    rejected = paths.rejected_dir(root)
    rejected.mkdir(parents=True, exist_ok=True)
    target = rejected / (path.name.replace("/", "_") or "unnamed")
    n = 1
    while target.exists():
        target = rejected / f"{path.name}.{n}"
        n += 1
    shutil.move(str(path), target)
    (target.parent / f"{target.name}.reason").write_text(reason + "\n", encoding="utf-8")
    return target


def stage_batch(source: Path, content_sha256: str, root: str | os.PathLike[str] | None = None) -> StagedBatch:
    batch_id = batch_id_for(source, content_sha256)
    target = paths.batches_dir(root) / f"{batch_id}{_suffix(source.name)}"
    if not target.exists():
        with atomic_path(target) as tmp:
            shutil.copyfile(source, tmp)
        if sha256_file(target) != content_sha256:  # the file changed while we copied it
            target.unlink()
            raise BatchError(f"batch {source}: changed while being staged; it will be picked up next tick")
    return StagedBatch(batch_id, source.name, target)


def scan_inbox(
    fingerprints: dict[str, list[Any]] | None = None,
    known_batch_ids: Iterable[str] = (),
    root: str | os.PathLike[str] | None = None,
) -> InboxScan:
    """Find batches in the inbox that are not yet partitions.

    ``fingerprints`` (the sensor cursor) maps a file name to ``[size, mtime_ns, batch_id]`` so an
    unchanged file is not hashed again. A file whose batch id is in ``known_batch_ids`` is known.
    """
    fingerprints = dict(fingerprints or {})
    known = set(known_batch_ids)
    scan = InboxScan()
    inbox = paths.inbox_dir(root)
    if not inbox.is_dir():
        scan.fingerprints = {}
        return scan
    present: dict[str, list[Any]] = {}
    for entry in sorted(os.scandir(inbox), key=lambda e: e.name):
        if not _is_candidate(entry):
            continue
        reason = unsafe_name_reason(entry.name)
        if reason is not None:
            reject_file(Path(entry.path), f"refused {entry.name!r}: {reason}", root)
            scan.rejected.append((entry.name, reason))
            continue
        stat = entry.stat()
        previous = fingerprints.get(entry.name)
        if previous and previous[0] == stat.st_size and previous[1] == stat.st_mtime_ns and previous[2] in known:
            present[entry.name] = previous
            scan.known.append(previous[2])
            continue
        staged = stage_batch(Path(entry.path), sha256_file(entry.path), root)
        present[entry.name] = [stat.st_size, stat.st_mtime_ns, staged.batch_id]
        if staged.batch_id in known:
            scan.known.append(staged.batch_id)
        else:
            known.add(staged.batch_id)
            scan.new.append(staged)
    scan.fingerprints = present
    return scan


def staged_batch_path(batch_id: str, root: str | os.PathLike[str] | None = None) -> Path:
    for suffix in BATCH_SUFFIXES:
        candidate = paths.batches_dir(root) / f"{batch_id}{suffix}"
        if candidate.is_file():
            return candidate
    raise BatchError(
        f"batch {batch_id}: no staged file under {paths.batches_dir(root)}; drop the file into the "
        "inbox again so the sensor stages it"
    )


# --------------------------------------------------------------------------- partitions


@dataclass
class IngestReport:
    batch_id: str
    output_dir: Path
    lines: int
    valid: int
    quarantined: int
    reasons: dict[str, int]
    data_version: str
    preview: list[dict[str, Any]]

    @property
    def quarantine_rate(self) -> float:
        return self.quarantined / self.lines if self.lines else 0.0


def _trace_row(batch_id: str, line_no: int, trace: Trace) -> dict[str, Any]:
    meta = trace.metadata
    return {
        "batch_id": batch_id,
        "line_no": line_no,
        "trace_id": trace.trace_id,
        "task_id": trace.task_id,
        "success": trace.outcome.success,
        "score": trace.outcome.score,
        "failure_point": trace.outcome.failure_point,
        "n_messages": len(trace.messages),
        "n_tool_calls": trace.tool_call_count,
        "agent": meta.agent,
        "model": meta.model,
        "created_at": meta.created_at.isoformat() if meta.created_at else None,
        "source": meta.source,
        "trace_json": canonical_json(trace.model_dump(mode="json", exclude_none=True)),
    }


def write_raw_traces(
    batch_id: str,
    source: Path,
    output_dir: Path,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    preview_rows: int = 5,
) -> IngestReport:
    """Validate ``source`` and write the partition folder ``output_dir`` whole, atomically.

    Streams: at most ``WRITE_CHUNK_ROWS`` rows are held at once. On any error nothing is left.
    """
    lines = valid = 0
    reasons: Counter[str] = Counter()
    preview: list[dict[str, Any]] = []
    with atomic_dir(output_dir) as tmp:
        buffer: list[dict[str, Any]] = []
        with pq.ParquetWriter(tmp / TRACES_FILE, TRACE_SCHEMA, compression="zstd", compression_level=3) as writer, \
                open(tmp / QUARANTINE_FILE, "w", encoding="utf-8") as quarantine:
            for line_no, item in iter_batch(source, max_line_bytes=max_line_bytes):
                lines += 1
                if isinstance(item, QuarantinedLine):
                    reasons[item.reason] += 1
                    quarantine.write(canonical_json({"batch_id": batch_id, **item.to_dict()}) + "\n")
                    continue
                valid += 1
                row = _trace_row(batch_id, line_no, item)
                if len(preview) < preview_rows:
                    preview.append({k: row[k] for k in ("line_no", "trace_id", "task_id", "success", "n_messages")})
                buffer.append(row)
                if len(buffer) >= WRITE_CHUNK_ROWS:
                    writer.write_table(pa.Table.from_pylist(buffer, schema=TRACE_SCHEMA))
                    buffer.clear()
            if buffer or valid == 0:
                writer.write_table(pa.Table.from_pylist(buffer, schema=TRACE_SCHEMA))
        version = sha256_tree(tmp)[:16]
    return IngestReport(batch_id, output_dir, lines, valid, lines - valid, dict(sorted(reasons.items())), version, preview)


def raw_traces_dir(batch_id: str, root: str | os.PathLike[str] | None = None) -> Path:
    return paths.asset_dir("raw_traces", root) / batch_id


def materialized_batches(root: str | os.PathLike[str] | None = None) -> list[str]:
    base = paths.asset_dir("raw_traces", root)
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith(".") and (p / TRACES_FILE).is_file())


def read_traces_table(batch_ids: Iterable[str] | None = None, root: str | os.PathLike[str] | None = None) -> pa.Table:
    """All trace rows of the given partitions (default: every materialised one), in batch/line order."""
    ids = sorted(batch_ids) if batch_ids is not None else materialized_batches(root)
    tables = [pq.read_table(raw_traces_dir(b, root) / TRACES_FILE) for b in ids]
    if not tables:
        return TRACE_SCHEMA.empty_table()
    return pa.concat_tables(tables)


def load_traces(batch_ids: Iterable[str] | None = None, root: str | os.PathLike[str] | None = None) -> Iterator[Trace]:
    """Validated traces of the given partitions, in batch then line order."""
    table = read_traces_table(batch_ids, root)
    for text in table.column("trace_json").to_pylist():
        yield Trace.model_validate_json(text)

