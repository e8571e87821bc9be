"""Helpers that turn library results into Dagster metadata (tables, plots), safely.

Strings in metadata are often untrusted: trace ids, task ids, file names and model output come
from outside. ``table`` gives ``MetadataValue.table`` with a ``TableSchema`` (the UI renders
each cell as text); where Markdown is still the right shape, ``md_escape`` turns every ASCII
punctuation character into its backslash escape (CommonMark), so a value like
``x](javascript:alert(1))`` or ``<img onerror=...>`` shows as the text it is, never as a link
or HTML.
"""

from __future__ import annotations

import base64
import io
import json
import string
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

CELL_CHARS = 120  # longer cell text is cut (before escaping, so no escape is split)
_ESCAPES = str.maketrans({c: "\\" + c for c in string.punctuation} | {"\n": " ", "\r": " ", "\t": " "})


def md_escape(value: Any, limit: int | None = CELL_CHARS) -> str:
    """``value`` as Markdown text that renders literally (no links, emphasis, HTML or table breaks).

    >>> md_escape("evil](javascript:alert(1))")
    'evil\\\\]\\\\(javascript\\\\:alert\\\\(1\\\\)\\\\)'
    """
    text = str(value)
    if limit is not None and len(text) > limit:
        text = text[: limit - 3] + "..."
    return text.translate(_ESCAPES)


def md_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> dg.MetadataValue:
    """A Markdown table with every header and cell escaped (see ``md_escape``)."""
    if not rows:
        return dg.MetadataValue.md("_(none)_")
    columns = list(columns or rows[0].keys())
    lines = ["| " + " | ".join(md_escape(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(md_escape(r.get(c, "")) for c in columns) + " |" for r in rows]
    return dg.MetadataValue.md("\n".join(lines))


def _cell(value: Any) -> str | int | float | bool | None:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _column_type(values: Sequence[Any]) -> str:
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return "bool"
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return "int"
    if present and all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return "float"
    return "string"


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
          descriptions: Mapping[str, str] | None = None) -> dg.TableMetadataValue:
    """``MetadataValue.table`` with a ``TableSchema`` inferred from the values (lists and dicts as JSON text)."""
    columns = list(columns or (rows[0].keys() if rows else ()))
    cells = [{c: _cell(r.get(c)) for c in columns} for r in rows]
    types = {c: _column_type([row[c] for row in cells]) for c in columns}
    for row in cells:  # an int column may hold floats only when typed float; keep each column one type
        for c in columns:
            if types[c] == "float" and isinstance(row[c], int):
                row[c] = float(row[c])
    schema = dg.TableSchema([dg.TableColumn(c, types[c], description=(descriptions or {}).get(c)) for c in columns])
    return dg.MetadataValue.table([dg.TableRecord(row) for row in cells], schema=schema)


def counts_table(counts: Mapping[str, int], key: str = "reason", value: str = "count") -> dg.TableMetadataValue:
    return table([{key: str(k), value: int(v)} for k, v in counts.items()], [key, value])


def png_markdown(png_bytes: bytes, alt: str = "plot") -> dg.MetadataValue:
    """Dagster has no image metadata type: a PNG goes in as Markdown with a base64 data URI."""
    return dg.MetadataValue.md(f"![{md_escape(alt)}](data:image/png;base64,{base64.b64encode(png_bytes).decode()})")


def figure_png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    return buffer.getvalue()
