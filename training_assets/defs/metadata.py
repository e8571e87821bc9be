"""Helpers that turn library results into Dagster metadata (tables, plots)."""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg


def md_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> dg.MetadataValue:
    """A Markdown table (renders in the UI's metadata panel)."""
    if not rows:
        return dg.MetadataValue.md("_(none)_")
    columns = list(columns or rows[0].keys())

    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")[:120]

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return dg.MetadataValue.md("\n".join(lines))


def counts_table(counts: Mapping[str, int], key: str = "reason", value: str = "count") -> dg.MetadataValue:
    return md_table([{key: k, value: v} for k, v in counts.items()], [key, value])


def png_markdown(png_bytes: bytes, alt: str = "plot") -> dg.MetadataValue:
    """Dagster has no image metadata type: a PNG goes in as Markdown with a base64 data URI."""
    return dg.MetadataValue.md(f"![{alt}](data:image/png;base64,{base64.b64encode(png_bytes).decode()})")


def figure_png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    return buffer.getvalue()
