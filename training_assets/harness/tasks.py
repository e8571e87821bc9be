"""The task file anyone can bring: one JSON object per line, each a task the harness runs.

    {"task_id": "calc-0001", "family": "calculator", "prompt": "What is 12 * 7?",
     "tools": ["calculator"], "expected_answer": "84"}

``expected_answer`` is text, read by ``scoring.score`` (a number, a comma-separated list, or
text). Optional ``metadata``: ``answer_units`` (unit spellings an answer may end with) and
``calls`` (the ideal tool calls, ``[{"name", "arguments"}]``, which ``teacher`` replays).
``load_tasks`` reads a file whole or not at all: the first bad line is a ``TaskFileError`` whose
message is one line, ``<path>:<line>: <what is wrong>; <the fix>``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from training_assets.harness.tools import TOOLS


class TaskFileError(ValueError):
    """A task file the harness will not run; the message is ``<path>:<line>: <problem>; <fix>``."""


class Task(BaseModel):
    """One task: the prompt the model gets, the tools it may call and the answer that scores."""

    model_config = ConfigDict(extra="forbid")

    task_id: str = Field(min_length=1, max_length=200, description="Unique in its file; attempts share it.")
    family: str = Field(min_length=1, description="Group reported apart (calculator, units, lists...).")
    prompt: str = Field(min_length=1, description="The user message.")
    tools: list[str] = Field(description="Names in the tool registry (harness.tools) offered to the model.")
    expected_answer: str = Field(description="The answer that scores (see harness.scoring).")
    metadata: dict[str, Any] = Field(default_factory=dict, description="answer_units, calls, template, ...")

    @property
    def answer_units(self) -> list[str]:
        return [str(u) for u in self.metadata.get("answer_units") or ()]


def _validation_problem(exc: ValidationError) -> str:
    err = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in err["loc"])
    if err["type"] == "missing":
        return f"field {where} is missing; every task needs task_id, family, prompt, tools and expected_answer"
    if err["type"] == "extra_forbidden":
        return (f"unknown field {where}; the fields are task_id, family, prompt, tools, expected_answer, "
                "metadata (put anything else in metadata)")
    return f"field {where}: {err['msg']}; fix the value (expected_answer and prompt are strings, tools a list of names)"


def parse_task_line(text: str) -> Task:
    """One line as a Task; a ValueError whose message is ``<problem>; <fix>``."""
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc}); write one JSON object per line") from None
    if not isinstance(obj, dict):
        raise ValueError(f"a JSON {type(obj).__name__}, not an object; write one JSON object per line")
    try:
        task = Task.model_validate(obj)
    except ValidationError as exc:
        raise ValueError(_validation_problem(exc)) from None
    unknown = [name for name in task.tools if name not in TOOLS]
    if unknown:
        raise ValueError(f"unknown tool {unknown[0]!r} in task {task.task_id!r}; "
                         f"use tools from the registry: {', '.join(sorted(TOOLS))}")
    return task


def load_tasks(path: str | os.PathLike[str]) -> list[Task]:
    """Every task of a JSONL file, in order (blank lines skipped); the first bad line is a TaskFileError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskFileError(f"{path}:0: cannot read the task file ({type(exc).__name__}: "
                            f"{getattr(exc, 'strerror', None) or exc}); pass a UTF-8 JSONL file of tasks") from None
    tasks: list[Task] = []
    first_line: dict[str, int] = {}
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            task = parse_task_line(line)
        except ValueError as exc:
            raise TaskFileError(f"{path}:{line_no}: {' '.join(str(exc).split())}") from None
        if task.task_id in first_line:
            raise TaskFileError(f"{path}:{line_no}: task_id {task.task_id!r} is already used on line "
                                f"{first_line[task.task_id]}; give every task a unique task_id")
        first_line[task.task_id] = line_no
        tasks.append(task)
    if not tasks:
        raise TaskFileError(f"{path}:0: the file holds no tasks; write one JSON task object per line")
    return tasks
