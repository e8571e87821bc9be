"""Traces rendered to plain text for curation (and for the tokenizer's training text).

The text form is ``trace_schema.render_messages``: ``raw_traces`` stores it per trace (column
``text``), so curation reads it instead of re-parsing traces. ``render_trace`` renders a trace
given as a ``Trace``, a trace dict or a ``raw_traces`` row the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from training_assets.trace_schema import Trace, render_messages


def render_trace(trace: Trace | Mapping[str, Any]) -> str:
    if isinstance(trace, Trace):
        return render_messages([m.model_dump(mode="json", exclude_none=True) for m in trace.messages])
    if isinstance(trace.get("text"), str):
        return trace["text"]
    messages = trace["messages"]
    return render_messages(json.loads(messages) if isinstance(messages, str) else messages)


def trace_record(row: Mapping[str, Any], batch_id: str | None = None) -> dict[str, Any]:
    """A corpus record for a ``raw_traces`` row: ``id`` is the trace id (``text`` not yet normalised)."""
    return {"id": row["trace_id"], "text": render_trace(row), "source": row.get("source") or "traces",
            "trace_id": row["trace_id"], "task_id": row["task_id"], "batch_id": batch_id or row.get("batch_id")}
