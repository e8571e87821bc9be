"""Teacher traces: the ideal conversation for a task, its tool calls run for real.

    trace = teacher_trace(task, SYSTEM_PROMPT)   # system, user, assistant call, tool result, ..., answer

Each ideal call (``task.metadata["calls"]``) is its own assistant turn, since a later call may use an
earlier result; every result comes from ``tools.execute``, and the final answer is the expected
answer, which must score against itself and against the last tool result: a task whose calls do not
give its answer is refused, so no teacher trace teaches a wrong conversation.
"""

from __future__ import annotations

import json
from typing import Any

from training_assets.harness.errors import HarnessError
from training_assets.harness.scoring import score
from training_assets.harness.tasks import Task
from training_assets.harness.tools import execute, tool_schemas
from training_assets.trace_schema import Trace


def teacher_trace(task: Task, system_prompt: str) -> Trace:
    """The ideal attempt at ``task`` (metadata: source="teacher", family, task_id, score 1.0)."""
    calls = task.metadata.get("calls")
    if not isinstance(calls, list) or not calls:
        raise HarnessError(f"task {task.task_id!r} has no metadata.calls; a teacher trace replays the ideal tool "
                           "calls: add [{\"name\": ..., \"arguments\": {...}}] to the task")
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt},
                                      {"role": "user", "content": task.prompt}]
    result = None
    for index, call in enumerate(calls):
        name, arguments = call.get("name"), call.get("arguments", {})
        if name not in task.tools:
            raise HarnessError(f"task {task.task_id!r}: ideal call {index} names {name!r}, which the task does not "
                               f"offer ({', '.join(task.tools)}); fix metadata.calls or tools")
        result = execute(name, arguments)
        if result.error:
            raise HarnessError(f"task {task.task_id!r}: ideal call {index} ({name}) failed: {result.error}; "
                               "fix metadata.calls")
        call_id = f"call_{index}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": result.content})
    answer = task.expected_answer
    if result is None or not score(result.content, answer, units=task.answer_units):
        raise HarnessError(f"task {task.task_id!r}: the ideal calls give {result.content if result else None!r}, "
                           f"not the expected answer {answer!r}; fix expected_answer or metadata.calls")
    messages.append({"role": "assistant", "content": answer})
    return Trace.model_validate({
        "trace_id": f"teacher-{task.task_id}", "task_id": task.task_id, "messages": messages,
        "final_answer": answer, "outcome": {"success": True, "score": 1.0},
        "metadata": {"source": "teacher", "family": task.family, "task_id": task.task_id, "score": 1.0,
                     "expected_answer": task.expected_answer, "tools": tool_schemas(task.tools)},
    })
