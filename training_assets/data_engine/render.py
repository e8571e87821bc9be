"""Traces rendered to plain text for curation (and for the tokenizer's training text).

One block per message, a role header then its content; tool calls are written as
``call NAME(ARGUMENTS_JSON)`` and tool results as ``NAME returned: ...``. Deterministic, so the
same trace always gives the same text (and content hash).
"""

from __future__ import annotations

from typing import Any

from training_assets.traces import Trace


def render_trace(trace: Trace) -> str:
    blocks = []
    for message in trace.messages:
        lines = []
        if message.content:
            lines.append(message.content)
        for call in message.tool_calls or ():
            lines.append(f"call {call.function.name}({call.function.arguments})")
        if message.role == "tool":
            lines = [f"{message.name or 'tool'} returned: {message.content or ''}"]
        blocks.append(f"{message.role}:\n" + "\n".join(lines))
    return "\n\n".join(blocks)


def trace_record(trace: Trace, batch_id: str | None) -> dict[str, Any]:
    """A corpus record for a trace: ``id`` is the trace id (unique across batches by construction)."""
    return {"id": trace.trace_id, "text": render_trace(trace), "source": trace.metadata.source or "traces",
            "trace_id": trace.trace_id, "task_id": trace.task_id, "batch_id": batch_id}
