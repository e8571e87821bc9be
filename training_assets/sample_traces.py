"""Deterministic generator of realistic agent traces for demos and tests.

Three task families with checkable answers, each solved through a tool:

- ``arithmetic``: a ``calculator`` tool evaluates an expression;
- ``units``: a ``convert_units`` tool converts a quantity;
- ``lists``: a ``python`` tool sorts, reverses, deduplicates or counts items.

Each task gets several attempts by different agents: some succeed, some fail at different steps
(bad tool arguments, a wrong reading of the tool result, giving up, a tool error), so preference
pairs and GRPO groups have real signal. Near-duplicate attempts, a few junk lines of every
quarantine kind, and two planted copies of held-out tasks give curation real work.

    python -m training_assets.sample_traces --out data   # what `make demo` runs
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from training_assets.storage import atomic_path, canonical_json

SYSTEM_PROMPT = (
    "You are a careful assistant that solves tasks step by step. Use the tools provided when a "
    "calculation or transformation is needed, check tool results, and give a short final answer."
)
AGENTS = ("planner-v1", "planner-v2", "react-mini")
MODELS = ("tiny-agent-0.1", "tiny-agent-0.2")
UNITS = {  # (from, to): factor
    ("mi", "km"): 1.609344, ("km", "mi"): 1 / 1.609344, ("kg", "lb"): 2.2046226218,
    ("lb", "kg"): 0.45359237, ("l", "gal"): 0.2641720524, ("ft", "m"): 0.3048, ("m", "ft"): 1 / 0.3048,
}
UNIT_NAMES = {"mi": "miles", "km": "kilometers", "kg": "kilograms", "lb": "pounds", "l": "liters",
              "gal": "US gallons", "ft": "feet", "m": "meters"}
WORDS = ("apple pear fig kiwi mango plum peach lemon lime cherry grape melon date guava papaya "
         "quince apricot banana olive walnut").split()
THOUGHTS = (
    "Let me work through this carefully.", "I will use a tool rather than guess.",
    "The tool result should be checked before answering.", "This needs one tool call.",
    "I should double-check the units before replying.", "A quick computation settles it.",
)


@dataclass(frozen=True)
class Task:
    task_id: str
    family: str
    prompt: str
    tool: str
    arguments: dict[str, Any]
    tool_result: str
    answer: str


def _arithmetic(rng: random.Random, i: int) -> Task:
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(1, 50)
    op = rng.choice(["+", "-", "*"])
    expr = f"{a} * {b} {op} {c}"
    value = eval(expr)  # noqa: S307 - our own integer expression, never user input
    phr = rng.choice(["What is {e}?", "Compute {e}.", "Please evaluate {e} exactly.",
                      "I need the value of {e} for an invoice."])
    return Task(f"arith-{i:04d}", "arithmetic", phr.format(e=expr), "calculator",
                {"expression": expr}, str(value), str(value))


def _units(rng: random.Random, i: int) -> Task:
    (src, dst), factor = rng.choice(sorted(UNITS.items()))
    qty = round(rng.uniform(1, 500), 1)
    value = round(qty * factor, 2)
    phr = rng.choice(["Convert {q} {s} to {d}.", "How many {d} is {q} {s}?",
                      "Express {q} {s} in {d}, rounded to two decimals."])
    return Task(f"units-{i:04d}", "units", phr.format(q=qty, s=UNIT_NAMES[src], d=UNIT_NAMES[dst]),
                "convert_units", {"value": qty, "from": src, "to": dst}, f"{value:.2f}", f"{value:.2f} {dst}")


def _lists(rng: random.Random, i: int) -> Task:
    items = rng.sample(WORDS, rng.randint(4, 7))
    kind = rng.choice(["sort", "reverse", "count", "longest"])
    listed = ", ".join(items)
    if kind == "sort":
        prompt, code, out = f"Sort these words alphabetically: {listed}.", f"sorted({items!r})", ", ".join(sorted(items))
    elif kind == "reverse":
        prompt, code, out = f"Reverse the order of this list: {listed}.", f"list(reversed({items!r}))", ", ".join(reversed(items))
    elif kind == "count":
        prompt, code, out = f"How many letters are there in total in: {listed}?", f"sum(len(w) for w in {items!r})", str(sum(map(len, items)))
    else:
        prompt, code, out = f"Which is the longest word in: {listed}?", f"max({items!r}, key=len)", max(items, key=len)
    return Task(f"lists-{i:04d}", "lists", prompt, "python", {"code": code}, out, out)


FAMILIES = (_arithmetic, _units, _lists)


def make_tasks(n_tasks: int, seed: int = 0) -> list[Task]:
    rng = random.Random(seed)
    return [FAMILIES[i % len(FAMILIES)](rng, i) for i in range(n_tasks)]


def _wrong(answer: str, rng: random.Random) -> str:
    try:
        return str(round(float(answer.split()[0]) + rng.choice([-10, -1, 1, 7]), 2))
    except ValueError:
        return answer[::-1]


def make_trace(task: Task, attempt: int, rng: random.Random, created_at: datetime) -> dict[str, Any]:
    """One attempt: success, or a failure at a chosen step (recorded as outcome.failure_point)."""
    mode = rng.choices(["success", "bad_args", "misread", "gave_up", "tool_error"],
                       weights=[5, 1, 2, 1, 1])[0]
    call_id = f"call_{task.task_id}_{attempt}"
    thought = rng.choice(THOUGHTS)
    args = dict(task.arguments)
    if mode == "bad_args":
        key = next(iter(args))
        args[key] = f"{args[key]}?"  # still JSON, but the tool cannot use it
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task.prompt},
    ]
    if mode == "gave_up":
        final = "I am not able to solve this task."
        messages.append({"role": "assistant", "content": final})
        outcome = {"success": False, "score": 0.0, "failure_point": 2, "error": "no tool call, no answer"}
    else:
        messages.append({
            "role": "assistant", "content": thought,
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": task.tool, "arguments": json.dumps(args, sort_keys=True)}}],
        })
        if mode in ("bad_args", "tool_error"):
            result = "error: could not parse arguments" if mode == "bad_args" else "error: tool timed out"
            messages.append({"role": "tool", "tool_call_id": call_id, "name": task.tool, "content": result})
            final = _wrong(task.answer, rng)
            messages.append({"role": "assistant", "content": f"The answer is {final}."})
            outcome = {"success": False, "score": 0.0, "failure_point": 2 if mode == "bad_args" else 4,
                       "error": result}
        else:
            messages.append({"role": "tool", "tool_call_id": call_id, "name": task.tool, "content": task.tool_result})
            final = task.answer if mode == "success" else _wrong(task.answer, rng)
            messages.append({"role": "assistant", "content": f"The tool returned {task.tool_result}. The answer is {final}."})
            outcome = ({"success": True, "score": 1.0} if mode == "success"
                       else {"success": False, "score": 0.2, "failure_point": 4, "error": "answer does not match tool result"})
    return {
        "trace_id": f"{task.task_id}-a{attempt}",
        "task_id": task.task_id,
        "messages": messages,
        "final_answer": final,
        "outcome": outcome,
        "metadata": {"agent": rng.choice(AGENTS), "model": rng.choice(MODELS),
                     "created_at": created_at.isoformat(), "source": "sample_traces",
                     "family": task.family, "expected_answer": task.answer},
    }


JUNK_LINES: tuple[bytes, ...] = (
    b'{"trace_id": "junk-1", "task_id": "t", "messages": [',  # malformed JSON
    b'{"trace_id": "junk-2", "task_id": "t", "messages": [{"role": "wizard", "content": "hi"}], "outcome": {"success": true}}',
    b'{"trace_id": "junk-3", "task_id": "t", "messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "nope", "content": "42"}], "outcome": {"success": true}}',
    b'{"trace_id": "junk-4", "task_id": "t", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{expression: 1+1"}}]}], "outcome": {"success": false}}',
    b'{"trace_id": "junk-5", "task_id": "t", "messages": [{"role": "user", "content": "x"}]}',  # no outcome
    b'{"trace_id": "junk-6", "task_id": 7, "messages": [{"role": "user", "content": "x"}], "outcome": {"success": "maybe"}}',
    b'\xff\xfe not utf-8',
)


def make_batches(n_batches: int = 2, tasks_per_batch: int = 24, attempts: int = 4, seed: int = 0,
                 held_out_tasks: int = 6) -> tuple[list[list[bytes]], list[dict[str, Any]]]:
    """Return (batches as lists of JSONL lines, held-out eval examples).

    The first ``held_out_tasks`` tasks are held out for evaluation; two of their prompts are
    planted in the first batch as contamination for decontamination to find.
    """
    rng = random.Random(seed)
    tasks = make_tasks(held_out_tasks + n_batches * tasks_per_batch, seed=seed)
    held_out, train = tasks[:held_out_tasks], tasks[held_out_tasks:]
    start = datetime(2026, 11, 1, tzinfo=UTC)
    batches: list[list[bytes]] = []
    for b in range(n_batches):
        rows: list[dict[str, Any]] = []
        for t_index, task in enumerate(train[b * tasks_per_batch:(b + 1) * tasks_per_batch]):
            for attempt in range(attempts):
                rows.append(make_trace(task, attempt, rng, start + timedelta(hours=b * 24 + t_index, minutes=attempt)))
        # near-duplicates: a re-logged attempt whose only change is a trailing space and a new id
        for row in rows[:: max(1, len(rows) // 6)][:6]:
            dup = json.loads(json.dumps(row))
            dup["trace_id"] += "-relog"
            dup["messages"][-1]["content"] += " "
            rows.append(dup)
        if b == 0:  # planted contamination: held-out prompts answered in training data
            for attempt, task in enumerate(held_out[:2]):
                rows.append(make_trace(task, 90 + attempt, rng, start))
        lines = [canonical_json(r).encode() for r in rows]
        lines.extend(JUNK_LINES[b::n_batches] if n_batches > 1 else JUNK_LINES)
        lines.append(lines[0])  # an exact repeat: duplicate trace_id, quarantined
        rng.shuffle(lines)
        batches.append(lines)
    eval_rows = [{"id": t.task_id, "prompt": t.prompt, "answer": t.answer, "category": t.family} for t in held_out]
    return batches, eval_rows


def write_samples(root: str | Path, seed: int = 0, n_batches: int = 2) -> dict[str, list[str]]:
    """Write the sample batches (two unless asked) into ``<root>/inbox`` and the held-out set into ``<root>/held_out``."""
    root = Path(root)
    batches, eval_rows = make_batches(n_batches=n_batches, seed=seed)
    written: dict[str, list[str]] = {"batches": [], "held_out": []}
    for index, lines in enumerate(batches, start=1):
        gz = index % 2 == 0  # ship one plain and one gzipped batch
        target = root / "inbox" / f"traces-{index:04d}.jsonl{'.gz' if gz else ''}"
        payload = b"\n".join(lines) + b"\n"
        data = gzip.compress(payload, mtime=0) if gz else payload  # mtime=0: identical bytes on every run
        # A batch id comes from (name, size, mtime): rewriting identical bytes would make the file
        # look new (a duplicate batch); leave an identical file as it is, like a careful producer.
        if not (target.is_file() and target.read_bytes() == data):
            with atomic_path(target) as tmp:
                tmp.write_bytes(data)
        written["batches"].append(str(target))
    held = root / "held_out" / "agent_tasks.jsonl"
    with atomic_path(held) as tmp:
        tmp.write_text("".join(canonical_json(r) + "\n" for r in eval_rows), encoding="utf-8")
    written["held_out"].append(str(held))
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data", help="data root to write inbox/ and held_out/ under")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(write_samples(args.out, seed=args.seed), indent=2))


if __name__ == "__main__":
    main()
