"""``stream_corpus``: records ``{id, text, source, trace_id, task_id, batch_id}`` from many inputs.

Accepted inputs: an in-memory list (strings or dicts with ``text``), ``.jsonl`` (one JSON object
with a text field per line), ``.txt`` (one document per blank-line separated block), ``.parquet``
(a text column), or a Hugging Face ``datasets`` loader spec over LOCAL files, read with
``streaming=True`` so nothing is materialised in memory: ``{"hf": "json", "data_files": [...]}``.
Ids are kept when a record has one, else ``<source>:<n>``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

Record = dict[str, Any]
PARQUET_BATCH_ROWS = 4096


def _record(obj: Any, source: str, n: int, text_field: str) -> Record:
    if isinstance(obj, str):
        obj = {"text": obj}
    if not isinstance(obj, dict) or not isinstance(obj.get(text_field), str):
        raise ValueError(f"corpus source {source} item {n}: expected a string or an object with a string "
                         f"{text_field!r} field, got {type(obj).__name__}")
    return {"id": str(obj.get("id", f"{source}:{n}")), "text": obj[text_field], "source": str(obj.get("source", source)),
            "trace_id": obj.get("trace_id"), "task_id": obj.get("task_id"), "batch_id": obj.get("batch_id")}


def _iter_file(path: Path, text_field: str) -> Iterator[Any]:
    name = path.name
    if name.endswith(".jsonl"):
        with open(path, encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, start=1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except ValueError as exc:
                        raise ValueError(f"corpus source {path} line {line_no}: not JSON ({exc})") from None
    elif name.endswith(".txt"):
        block: list[str] = []
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    block.append(line.rstrip("\n"))
                elif block:
                    yield "\n".join(block)
                    block = []
        if block:
            yield "\n".join(block)
    elif name.endswith(".parquet"):
        parquet = pq.ParquetFile(path)
        if text_field not in parquet.schema_arrow.names:
            raise ValueError(f"corpus source {path}: no {text_field!r} column (has {parquet.schema_arrow.names})")
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            yield from batch.to_pylist()
    else:
        raise ValueError(f"corpus source {path}: unsupported file type; use .jsonl, .txt or .parquet")


def _iter_hf(spec: dict[str, Any]) -> Iterator[Any]:
    import datasets  # imported lazily: only this input kind needs it

    kwargs = {k: v for k, v in spec.items() if k not in {"hf", "name", "text_field"}}
    files = kwargs.get("data_files")
    for f in [files] if isinstance(files, str) else list(files or []):
        if not Path(f).is_file():
            raise ValueError(f"corpus source {spec.get('name', spec['hf'])}: data file {f} not found; "
                             "only local files are read (offline)")
    yield from datasets.load_dataset(spec["hf"], split=spec.get("split", "train"), streaming=True,
                                     **{k: v for k, v in kwargs.items() if k != "split"})


def stream_corpus(source: Iterable[Any] | str | os.PathLike[str] | dict[str, Any], name: str | None = None,
                  text_field: str = "text") -> Iterator[Record]:
    """Yield corpus records from ``source`` lazily (see the module docstring for the kinds)."""
    if isinstance(source, dict) and "hf" in source:
        label = name or str(source.get("name", source["hf"]))
        items: Iterable[Any] = _iter_hf(source)
    elif isinstance(source, str | os.PathLike):
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"corpus source {path}: no such file")
        label = name or path.stem
        items = _iter_file(path, text_field)
    else:
        label = name or "memory"
        items = source
    for n, obj in enumerate(items):
        yield _record(obj, label, n, text_field)
