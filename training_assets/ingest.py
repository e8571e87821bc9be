"""The trace partition store: one staged batch -> ``raw_traces/<batch_id>/``, and its readers.

Pure library (no Dagster). ``ingest_batch`` is what the ``raw_traces`` asset runs: stage the
inbox file (``inbox.stage_batch``: hash + immutable copy) and write the partition whole,
atomically (``write_raw_traces``):

- ``traces.parquet``: one row per valid trace, every field later stages need as a column
  (``TRACE_SCHEMA``): the messages as canonical JSON text, the outcome and metadata fields, and
  the conversation rendered as text (``trace_schema.render_messages``). Traces are validated
  once, here; curation, selection and the dataset builders read these columns and never
  re-validate;
- ``quarantine.jsonl``: one record per quarantined line (line number, reason, detail, raw copy);
- ``partition.json``: counts, the staged content hash and the partition's **version**, the one
  notion of a partition's version: ``raw_traces``'s DataVersion, and what the signatures, the
  curated corpus and the trace selection record as their input.

A partition whose content was already staged under another batch (the same file dropped twice)
is written empty with ``duplicate_of`` set; ``materialized_batches`` leaves it out.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from training_assets import inbox, paths
from training_assets.base_model.template import fold_tools
from training_assets.storage import atomic_dir, canonical_json, fingerprint, sha256_tree, write_json_atomic
from training_assets.trace_schema import render_messages
from training_assets.traces import BatchCaps, BatchError, QuarantinedLine, Trace, check_batch_id, iter_batch

# Bump when the Parquet layout or validation rules change: it is the asset's code version.
INGEST_VERSION = "2"
TRACES_FILE = "traces.parquet"
QUARANTINE_FILE = "quarantine.jsonl"
PARTITION_FILE = "partition.json"
WRITE_CHUNK_ROWS = 1024  # rows buffered before a Parquet row batch is flushed

TRACE_SCHEMA = pa.schema([
    ("batch_id", pa.string()),
    ("line_no", pa.int64()),
    ("trace_id", pa.string()),
    ("task_id", pa.string()),
    ("system", pa.string()),
    ("prompt", pa.string()),
    ("messages", pa.string()),  # canonical JSON of the OpenAI message list (None fields dropped)
    ("final_answer", pa.string()),
    ("success", pa.bool_()),
    ("score", pa.float64()),
    ("failure_point", pa.int64()),
    ("error", pa.string()),
    ("n_messages", pa.int64()),
    ("n_tool_calls", pa.int64()),
    ("agent", pa.string()),
    ("model", pa.string()),
    ("created_at", pa.string()),
    ("source", pa.string()),
    ("expected_answer", pa.string()),  # metadata.expected_answer, when the producer recorded one
    ("metadata", pa.string()),  # canonical JSON of the whole metadata object (free-form keys kept)
    ("text", pa.string()),  # render_messages(messages): what curation normalises and deduplicates
])


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
    duplicate_of: str | None = None

    @property
    def quarantine_rate(self) -> float:
        return self.quarantined / self.lines if self.lines else 0.0


def trace_row(batch_id: str, line_no: int, trace: Trace) -> dict[str, Any]:
    """The ``TRACE_SCHEMA`` row of a validated trace."""
    meta = trace.metadata.model_dump(mode="json", exclude_none=True)
    # the tools the agent was offered go into its system turn, as the server rendered them (base_model.template);
    # the curation text leaves them out: the same schemas in every trace would make them all near-duplicates
    plain = [m.model_dump(mode="json", exclude_none=True) for m in trace.messages]
    messages = fold_tools(plain, meta.get("tools"))
    expected = meta.get("expected_answer")
    return {
        "batch_id": batch_id, "line_no": line_no, "trace_id": trace.trace_id, "task_id": trace.task_id,
        "system": trace.system, "prompt": trace.prompt, "messages": canonical_json(messages),
        "final_answer": trace.final_answer, "success": trace.outcome.success, "score": trace.outcome.score,
        "failure_point": trace.outcome.failure_point, "error": trace.outcome.error,
        "n_messages": len(messages), "n_tool_calls": trace.tool_call_count,
        "agent": meta.get("agent"), "model": meta.get("model"), "created_at": meta.get("created_at"),
        "source": meta.get("source"), "expected_answer": None if expected is None else str(expected),
        "metadata": canonical_json(meta), "text": render_messages(plain),
    }


def write_raw_traces(batch_id: str, source: Path, output_dir: Path, caps: BatchCaps | None = None,
                     preview_rows: int = 5, staged: inbox.StagedBatch | None = None) -> IngestReport:
    """Validate ``source`` and write the partition folder ``output_dir`` whole, atomically.

    Streams: at most ``WRITE_CHUNK_ROWS`` rows are held at once. On any error (a bad file, a cap)
    nothing is left and a previous version of the partition stays as it was. ``staged`` (from
    ``inbox.stage_batch``) is recorded in ``partition.json``; a duplicate is written empty.
    """
    caps = caps or BatchCaps()
    duplicate_of = staged.duplicate_of if staged else None
    lines = valid = 0
    reasons: Counter[str] = Counter()
    preview: list[dict[str, Any]] = []
    with atomic_dir(output_dir) as tmp:
        buffer: list[dict[str, Any]] = []
        with pq.ParquetWriter(tmp / TRACES_FILE, TRACE_SCHEMA, compression="zstd", compression_level=3) as writer, \
                open(tmp / QUARANTINE_FILE, "w", encoding="utf-8") as quarantine:
            for line_no, item in ([] if duplicate_of else iter_batch(source, caps=caps)):
                lines += 1
                if isinstance(item, QuarantinedLine):
                    reasons[item.reason] += 1
                    quarantine.write(canonical_json({"batch_id": batch_id, **item.to_dict()}) + "\n")
                    continue
                valid += 1
                row = trace_row(batch_id, line_no, item)
                if len(preview) < preview_rows:
                    preview.append({k: row[k] for k in ("line_no", "trace_id", "task_id", "success", "n_messages")})
                buffer.append(row)
                if len(buffer) >= WRITE_CHUNK_ROWS:
                    writer.write_table(pa.Table.from_pylist(buffer, schema=TRACE_SCHEMA))
                    buffer.clear()
            if buffer or valid == 0:
                writer.write_table(pa.Table.from_pylist(buffer, schema=TRACE_SCHEMA))
        version = fingerprint(sha256_tree(tmp), duplicate_of)
        manifest = {"batch_id": batch_id, "version": version, "ingest_version": INGEST_VERSION, "lines": lines,
                    "valid": valid, "quarantined": lines - valid, "reasons": dict(sorted(reasons.items())),
                    "caps": {"max_line_bytes": caps.max_line_bytes, "max_batch_bytes": caps.max_batch_bytes,
                             "max_batch_lines": caps.max_batch_lines},
                    "duplicate_of": duplicate_of, "staged": staged.to_json() if staged else None}
        write_json_atomic(tmp / PARTITION_FILE, manifest)
    return IngestReport(batch_id, output_dir, lines, valid, lines - valid, dict(sorted(reasons.items())), version,
                        preview, duplicate_of)


def ingest_batch(batch_id: str, root: str | os.PathLike[str] | None = None, caps: BatchCaps | None = None,
                 preview_rows: int = 5) -> IngestReport:
    """Stage the batch (hash + immutable copy, inside the run) and write its partition."""
    staged = inbox.stage_batch(batch_id, root)
    return write_raw_traces(batch_id, staged.path, raw_traces_dir(batch_id, root), caps, preview_rows, staged)


# --------------------------------------------------------------------------- readers


def raw_traces_dir(batch_id: str, root: str | os.PathLike[str] | None = None) -> Path:
    return paths.asset_dir("raw_traces", root) / check_batch_id(batch_id)


def partition_manifest(batch_id: str, root: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    path = raw_traces_dir(batch_id, root) / PARTITION_FILE
    if not path.is_file():
        raise BatchError(f"raw_traces[{batch_id}] is not materialised (no {path}); materialise that partition")
    return json.loads(path.read_text(encoding="utf-8"))


def partition_version(batch_id: str, root: str | os.PathLike[str] | None = None) -> str:
    """The version of one ``raw_traces`` partition (its DataVersion), from its ``partition.json``."""
    return str(partition_manifest(batch_id, root)["version"])


def materialized_batches(root: str | os.PathLike[str] | None = None) -> list[str]:
    """Batch ids of the materialised partitions that hold traces (duplicates of another batch left out)."""
    base = paths.asset_dir("raw_traces", root)
    if not base.is_dir():
        return []
    ids = []
    for folder in sorted(base.iterdir()):
        manifest = folder / PARTITION_FILE
        if folder.name.startswith(".") or not folder.is_dir() or not manifest.is_file():
            continue
        if json.loads(manifest.read_text(encoding="utf-8")).get("duplicate_of") is None:
            ids.append(folder.name)
    return ids


def read_traces_table(batch_ids: Iterable[str] | None = None, root: str | os.PathLike[str] | None = None,
                      columns: list[str] | None = None) -> pa.Table:
    """Trace rows of the given partitions (default: every materialised one), in batch/line order."""
    ids = sorted(batch_ids) if batch_ids is not None else materialized_batches(root)
    tables = [pq.read_table(raw_traces_dir(b, root) / TRACES_FILE, columns=columns) for b in ids]
    if not tables:
        schema = TRACE_SCHEMA if columns is None else pa.schema([TRACE_SCHEMA.field(c) for c in columns])
        return schema.empty_table()
    return pa.concat_tables(tables)


def trace_dict(row: dict[str, Any]) -> dict[str, Any]:
    """A ``TRACE_SCHEMA`` row in the shape of the trace schema (README "Trace schema"), as plain dicts."""
    out = {"trace_id": row["trace_id"], "task_id": row["task_id"], "prompt": row["prompt"],
           "messages": json.loads(row["messages"]),
           "outcome": {k: row[k] for k in ("success", "score", "failure_point", "error") if row[k] is not None},
           "metadata": json.loads(row["metadata"])}
    for key in ("system", "final_answer"):
        if row.get(key) is not None:
            out[key] = row[key]
    return out


def load_traces(batch_ids: Iterable[str] | None = None, root: str | os.PathLike[str] | None = None
                ) -> Iterator[dict[str, Any]]:
    """Traces of the given partitions as plain trace dicts, in batch then line order (no re-validation)."""
    for row in read_traces_table(batch_ids, root).to_pylist():
        yield trace_dict(row)
