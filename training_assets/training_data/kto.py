"""Unpaired preferences for KTO: every kept trace once, labelled desirable when it succeeded.

KTO (Ethayarajh et al. 2024, arXiv:2402.01306) learns from single examples marked desirable or
undesirable, so unlike DPO's pairs it needs no second attempt at the same task: every success and
every failure is a row, tasks with a single attempt included. A row is the trace's prompt (the
messages before the first assistant turn), its completion (the rest) and ``label`` =
``outcome.success``. Rows come sorted by (task, trace id): the same traces give the same rows in
the same order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from training_assets.trace_schema import Trace
from training_assets.training_data.common import (
    BuildResult, as_trace_records, has_completion, messages_json, prompt_length, source_batches,
)


def build_binary_feedback(traces: Iterable[Trace | Mapping[str, Any]], max_per_task: int = 8) -> BuildResult:
    """Rows ``{id, task_id, prompt, completion, label, source_batches}``, one per usable trace.

    ``traces``: trace dicts, ``raw_traces``/``selected_traces`` rows or ``Trace``s. A trace with no
    user message before its first assistant turn, or whose completion neither says nor calls
    anything, is skipped with the reason; so are a task's attempts beyond ``max_per_task``
    (successes first, then by trace id, so a task's rows keep both labels where it has them).
    """
    if max_per_task < 1:
        raise ValueError(f"max_per_task={max_per_task} must be >= 1")
    records = sorted(as_trace_records(traces), key=lambda t: (t.task_id, not t.success, t.trace_id))
    result = BuildResult()
    per_task: dict[str, int] = {}
    for t in records:
        split = prompt_length(t.messages)
        if not any(m.get("role") == "user" for m in t.messages[:split]):
            result.skipped.append((t.trace_id, "no user prompt before the first assistant turn"))
        elif not has_completion(t.messages[split:]):
            result.skipped.append((t.trace_id, "completion has no assistant content or tool call"))
        elif per_task.get(t.task_id, 0) >= max_per_task:
            result.skipped.append((t.trace_id, "over max_per_task attempts of its task"))
        else:
            per_task[t.task_id] = per_task.get(t.task_id, 0) + 1
            result.rows.append({"id": t.trace_id, "task_id": t.task_id, "prompt": messages_json(t.messages[:split]),
                                "completion": messages_json(t.messages[split:]), "label": t.success,
                                "source_batches": source_batches(t.batch_id)})
    result.rows.sort(key=lambda r: (r["task_id"], r["id"]))
    return result
