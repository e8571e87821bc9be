"""Shared pieces of the dataset builders: trace messages as plain dicts, and build results with reasons."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from training_assets.storage import canonical_json
from training_assets.traces import Trace


def as_trace(item: Trace | Mapping[str, Any]) -> Trace:
    """A ``Trace`` from a ``Trace`` or a plain dict of the trace schema (validated: a bad dict fails here)."""
    return item if isinstance(item, Trace) else Trace.model_validate(item)


def trace_messages(trace: Trace) -> list[dict[str, Any]]:
    """The trace's conversation as OpenAI chat dicts (``None`` fields dropped, arguments as JSON text)."""
    return [m.model_dump(mode="json", exclude_none=True) for m in trace.messages]


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
