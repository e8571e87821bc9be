"""Attempts: a served model on a task, multi-turn with real tools, scored and kept as a trace.

    client = chat_client("http://127.0.0.1:8000/v1")
    report = run_tasks(client, "smollm2-v3", tasks, generation=2, concurrency=4)
    report.overall        # Rate(n, successes, rate, low, high): 95% bootstrap interval
    write_batch(report.traces, inbox, "harness-g2")

One attempt: system prompt + the task's prompt; the model's turn is sent with the task's tools
(chat-completions ``tools``). Tool calls come back parsed (``message.tool_calls``) or as Hermes
text in the content (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``): both are read.
Each call runs through ``tools.execute`` and its result goes back as a ``tool`` message; the first
turn without a tool call is the final answer, scored strictly (``scoring.score``). Every way an
attempt can go wrong is a scored failed trace whose ``outcome.error`` says what happened (the
messages so far kept): the turn cap, a call block whose JSON does not parse (recorded, the attempt
ends), an API error or a garbage answer mid-attempt. Only a server that refuses the connection
at an attempt's first request stops the run: one ``HarnessError`` naming the URL, not one failed
trace per task.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import openai
from pydantic import BaseModel, Field

from training_assets.base_model.template import parse_tool_calls
from training_assets.harness.client import ChatError, chat_message, chat_url
from training_assets.harness.errors import HarnessError
from training_assets.harness.scoring import score
from training_assets.harness.stats import bootstrap_ci
from training_assets.harness.tasks import Task
from training_assets.harness.tools import execute, tool_schemas
from training_assets.storage import canonical_json
from training_assets.trace_schema import Trace
from training_assets.traces import BATCH_SUFFIXES, unsafe_name_reason

SYSTEM_PROMPT = ("You are a careful assistant with tools. Call a tool to compute the answer, then reply "
                 "with just the final answer: no words around it.")
START_SERVER_HINT = ("start the model server first (e.g. `transformers serve --host 127.0.0.1 --port 8000`, "
                     "or the loop's serving step) or pass its base URL (…/v1)")


# --------------------------------------------------------------------------- one attempt


def _message_calls(message: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]], list[str]]:
    """(content text, calls as {id?, name, arguments}, bad calls) of an assistant message, either format."""
    content = message.get("content")
    content = content if isinstance(content, str) else None
    calls, bad = [], []
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            bad.append(f"tool_calls entry without a function name: {str(call)[:120]!r}")
            continue
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError as exc:
                bad.append(f"arguments of {name} are not JSON: {exc}: {arguments[:120]!r}")
                continue
        calls.append({"id": call.get("id"), "name": name, "arguments": arguments if arguments is not None else {}})
    if not calls and not bad and content and "<tool_call>" in content:
        text, calls, bad = parse_tool_calls(content)
        if bad:  # a malformed block ends the attempt: keep what the model wrote, run nothing
            calls = []
        else:
            content = text
    return content or None, calls, bad


def _trace_id(model: str, generation: int, task_id: str, attempt: int, seed: int | None, temperature: float) -> str:
    key = "\x1f".join(map(str, (model, generation, task_id, attempt, seed, temperature)))
    return f"harness-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def run_attempt(client: openai.OpenAI, model: str, task: Task, *, max_turns: int = 4, max_tokens: int = 96,
                temperature: float = 0.0, seed: int | None = None, generation: int = 0, attempt: int = 0,
                system_prompt: str = SYSTEM_PROMPT, served_as: str | None = None) -> Trace:
    """One attempt at ``task`` as a scored trace; a refused connection at the first request is a HarnessError.

    ``model`` is the name requests use; ``served_as`` (default ``model``) the version the trace names
    in ``metadata.model``: the served model's lineage (a registered version, "base")."""
    if max_turns < 1:
        raise HarnessError(f"max_turns must be at least 1, not {max_turns}")
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt},
                                      {"role": "user", "content": task.prompt}]
    params: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature}
    if seed is not None:
        params["seed"] = seed
    schemas = tool_schemas(task.tools)
    final: str | None = None
    error: str | None = None
    bad_calls: list[str] = []
    turns = 0
    while final is None and error is None:
        if turns == max_turns:
            error = f"turn cap {max_turns} reached"
            break
        turns += 1
        try:
            reply = chat_message(client, model=model, messages=messages, tools=schemas, **params)
        except ChatError as exc:
            if exc.kind == "down" and turns == 1:
                raise HarnessError(f"model server {chat_url(client)} refused the connection; {START_SERVER_HINT}") \
                    from None
            error = f"turn {turns}: {exc}"
            break
        content, calls, bad = _message_calls(reply)
        assistant: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            assistant["tool_calls"] = [
                {"id": f"call_{turns}_{i}", "type": "function",
                 "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
                for i, c in enumerate(calls)]
        messages.append(assistant)
        bad_calls += [f"turn {turns}: {why}" for why in bad]
        if bad and not calls:  # nothing to run: the attempt ends on the failed call, kept in the trace
            error = f"turn {turns}: {bad[0]}"
            break
        if not calls:
            final = (content or "").strip()
            break
        for entry, call in zip(assistant["tool_calls"], calls, strict=True):
            result = execute(call["name"], call["arguments"])
            messages.append({"role": "tool", "tool_call_id": entry["id"], "name": call["name"],
                             "content": result.content})
    success = error is None and score(final, task.expected_answer, units=task.answer_units)
    last_assistant = max(i for i, m in enumerate(messages) if m["role"] in ("assistant", "user"))
    trace = {
        "trace_id": _trace_id(served_as or model, generation, task.task_id, attempt, seed, temperature),
        "task_id": task.task_id, "messages": messages, "final_answer": final,
        "outcome": {"success": success, "score": 1.0 if success else 0.0, "error": error,
                    "failure_point": None if success else last_assistant},
        "metadata": {"source": "harness", "model": served_as or model, "family": task.family, "task_id": task.task_id,
                     "score": 1.0 if success else 0.0, "generation": generation, "turns": turns,
                     "attempt": attempt, "expected_answer": task.expected_answer, "tools": schemas,
                     **({"failed_calls": bad_calls} if bad_calls else {})},
    }
    return Trace.model_validate(trace)


# --------------------------------------------------------------------------- many attempts


class Rate(BaseModel):
    n: int
    successes: int
    rate: float
    low: float = Field(description="95% percentile-bootstrap interval of the success rate.")
    high: float


class HarnessReport(BaseModel):
    model: str
    generation: int
    traces: list[Trace]
    overall: Rate
    by_family: dict[str, Rate]

    def success_by_task(self) -> dict[str, float]:
        """task_id -> mean success over its attempts (for ``stats.paired_gain_ci``)."""
        scores: dict[str, list[float]] = defaultdict(list)
        for trace in self.traces:
            scores[trace.task_id].append(1.0 if trace.outcome.success else 0.0)
        return {task: sum(s) / len(s) for task, s in sorted(scores.items())}


def success_rate(traces: Sequence[Trace], *, level: float = 0.95, seed: int = 0) -> Rate:
    values = [1.0 if t.outcome.success else 0.0 for t in traces]
    interval = bootstrap_ci(values, level=level, seed=seed)
    return Rate(n=len(values), successes=int(sum(values)), rate=interval.estimate, low=interval.low, high=interval.high)


def run_tasks(client: openai.OpenAI, model: str, tasks: Sequence[Task], *, concurrency: int = 1, generation: int = 0,
              attempts: int = 1, max_turns: int = 4, max_tokens: int = 96, temperature: float = 0.0,
              seed: int | None = None, system_prompt: str = SYSTEM_PROMPT, served_as: str | None = None) -> HarnessReport:
    """Every task ``attempts`` times (traces in task order); success per family and overall with 95% intervals."""
    if not tasks:
        raise HarnessError("no tasks to run; load a task file with load_tasks(path)")
    if concurrency < 1 or attempts < 1:
        raise HarnessError(f"concurrency and attempts must be at least 1, got {concurrency} and {attempts}")
    jobs = [(task, a) for task in tasks for a in range(attempts)]
    stop = threading.Event()

    def one(job: tuple[Task, int]) -> Trace | None:
        if stop.is_set():  # the server went down: do not knock on it once per remaining task
            return None
        task, attempt = job
        return run_attempt(client, model, task, max_turns=max_turns, max_tokens=max_tokens, temperature=temperature,
                           seed=None if seed is None else seed + attempt, generation=generation, attempt=attempt,
                           system_prompt=system_prompt, served_as=served_as)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [pool.submit(one, job) for job in jobs]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
        except BaseException:  # ^C or SIGTERM's SystemExit: leaving the pool would otherwise run every queued attempt
            stop.set()
            for future in futures:
                future.cancel()
            raise
        failure = next((f.exception() for f in futures if f.done() and f.exception() is not None), None)
        if failure is not None:
            stop.set()
            for future in futures:
                future.cancel()
            finished = sum(1 for f in futures if f.done() and not f.cancelled() and f.exception() is None)
            if isinstance(failure, HarnessError):
                raise HarnessError(f"{failure} ({finished} of {len(jobs)} attempts finished before it)") from None
            raise failure
    traces = [f.result() for f in futures]
    by_family: dict[str, list[Trace]] = defaultdict(list)
    for trace in traces:
        by_family[trace.metadata.family].append(trace)
    return HarnessReport(model=served_as or model, generation=generation, traces=traces, overall=success_rate(traces),
                         by_family={family: success_rate(ts) for family, ts in sorted(by_family.items())})


# --------------------------------------------------------------------------- the inbox


def write_batch(traces: Sequence[Trace], inbox_dir: str | os.PathLike[str], name: str) -> Path:
    """``traces`` as one JSONL batch ``inbox_dir/<name>.jsonl``, appearing whole (temp file + link in the folder).

    The temporary file is hidden and ends in ``.tmp``, which the inbox scan ignores; it is hard-linked
    to its name only when complete, so the sensor never sees half a batch, and an existing batch of
    that name is never replaced (a HarnessError asks for a new name).
    """
    if not traces:
        raise HarnessError(f"no traces to write as batch {name!r}; run some tasks first")
    file_name = name if name.endswith(BATCH_SUFFIXES) else f"{name}.jsonl"
    if file_name.endswith(".gz"):
        raise HarnessError(f"batch name {name!r}: the harness writes plain .jsonl; drop the .gz")
    why = unsafe_name_reason(file_name)
    if why:
        raise HarnessError(f"batch name {name!r}: {why}")
    inbox = Path(inbox_dir)
    inbox.mkdir(parents=True, exist_ok=True)
    target = inbox / file_name
    tmp = inbox / f".{file_name}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "x", encoding="utf-8") as handle:
            for trace in traces:
                handle.write(canonical_json(trace.model_dump(mode="json", exclude_none=True)) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, target)
        except FileExistsError:
            raise HarnessError(f"batch {target} already exists; batches are never replaced: choose a new name") \
                from None
    finally:
        tmp.unlink(missing_ok=True)
    return target
