"""Shared pieces of the dataset builders: the trace forms they accept, and build results with reasons.

Builders take traces in any of three forms (``as_trace_records``):

- plain dicts of the trace schema (README "Trace schema"; ShareGPT and prompt/completion too),
  as the seed's examples pass them: validated here with the schema, a bad one is a
  ``ValueError`` naming it and the reason;
- rows of ``raw_traces`` / ``selected_traces`` (``messages`` as JSON text, flat outcome columns),
  as the pipeline passes them: validated at ingest, so read as they are;
- ``Trace`` objects.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from training_assets.base_model.template import fold_tools
from training_assets.storage import canonical_json
from training_assets.trace_schema import Trace, parse_trace, validation_reason


@dataclass(frozen=True)
class TraceRecord:
    """What the builders read from a trace, whatever form it came in."""

    trace_id: str
    task_id: str
    messages: list[dict[str, Any]]  # OpenAI chat dicts, None fields dropped, tool arguments as JSON text
    success: bool
    score: float | None = None
    failure_point: int | None = None
    expected_answer: str | None = None
    batch_id: str | None = None  # the trace batch it came from (None for traces passed in by hand)


def _from_trace(trace: Trace, batch_id: str | None = None) -> TraceRecord:
    expected = (trace.metadata.model_extra or {}).get("expected_answer")
    messages = fold_tools([m.model_dump(mode="json", exclude_none=True) for m in trace.messages], trace.metadata.tools)
    return TraceRecord(trace.trace_id, trace.task_id, messages,
                       trace.outcome.success, trace.outcome.score, trace.outcome.failure_point,
                       None if expected is None else str(expected), batch_id)


def _is_row(item: Mapping[str, Any]) -> bool:
    return isinstance(item.get("messages"), str) and "success" in item and "outcome" not in item


def as_trace_record(item: Trace | Mapping[str, Any], index: int = 0) -> TraceRecord:
    """One trace in any accepted form (see the module docstring) as a ``TraceRecord``."""
    if isinstance(item, Trace):
        return _from_trace(item)
    if not isinstance(item, Mapping):
        raise ValueError(f"trace {index}: expected a trace dict, a raw_traces row or a Trace, got {type(item).__name__}")
    if _is_row(item):
        return TraceRecord(item["trace_id"], item["task_id"], json.loads(item["messages"]), bool(item["success"]),
                           item.get("score"), item.get("failure_point"), item.get("expected_answer"), item.get("batch_id"))
    try:
        return _from_trace(parse_trace(dict(item)), item.get("batch_id"))
    except ValidationError as exc:
        reason, detail = validation_reason(exc)
    except PydanticCustomError as exc:
        reason, detail = exc.type, exc.message()
    raise ValueError(f"trace {index} ({item.get('trace_id', 'no trace_id')}) does not fit the trace schema: "
                     f"{reason}: {detail}")


def as_trace_records(traces: Iterable[Trace | Mapping[str, Any]]) -> list[TraceRecord]:
    return [as_trace_record(item, i) for i, item in enumerate(traces)]


def source_batches(*batch_ids: str | None) -> list[str]:
    """The sorted distinct trace batches a dataset row came from (hand-passed traces have none)."""
    return sorted({b for b in batch_ids if b})


def messages_json(messages: Sequence[Mapping[str, Any]]) -> str:
    """Canonical JSON text of a message list: equal conversations give equal text."""
    return canonical_json(list(messages))


def prompt_length(messages: Sequence[Mapping[str, Any]]) -> int:
    """Number of leading messages before the first assistant turn (system, user, ...)."""
    return next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))


def has_completion(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether some assistant message says something (non-blank content) or calls a tool."""
    return any(m.get("role") == "assistant" and (str(m.get("content") or "").strip() or m.get("tool_calls"))
               for m in messages)


@dataclass
class BuildResult:
    """Rows a builder produced plus what it left out and why (``skipped``: (id, reason) pairs).

    Iterates, indexes and measures like its ``rows`` list.
    """

    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.rows[index]

    def skipped_by_reason(self) -> dict[str, int]:
        return dict(sorted(Counter(reason for _, reason in self.skipped).items()))
