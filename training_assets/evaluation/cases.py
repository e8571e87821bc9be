"""Eval cases: the schema, JSONL loading with validation, and held-out agent tasks as cases.

Eval cases are JSONL, one case a line::

    {"id": "arith-0000", "category": "answer", "prompt": "What is 2 * 3?",
     "checks": [{"type": "contains", "value": "6"}]}

``prompt`` is a string (one user turn) or a list of OpenAI chat messages; ``tools`` (optional) are
the tool schemas offered to the chat template. A case passes when every check passes; check types
are the keys of ``scorers.SCORERS``.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training_assets.evaluation.scorers import SCORERS

EVAL_TASKS_DIR = Path(__file__).resolve().parent.parent / "eval_tasks"
DEFAULT_CASES = EVAL_TASKS_DIR / "reliability_cases.jsonl"


@dataclass(frozen=True)
class EvalCase:
    id: str
    category: str
    prompt: str | tuple[dict[str, Any], ...]
    checks: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] = ()

    def messages(self) -> list[dict[str, Any]]:
        if isinstance(self.prompt, str):
            return [{"role": "user", "content": self.prompt}]
        return [dict(m) for m in self.prompt]


def parse_case(raw: Mapping[str, Any], where: str = "case") -> EvalCase:
    """Validate one case dict; errors name the case and the fix."""
    for key in ("id", "category", "prompt", "checks"):
        if key not in raw:
            raise ValueError(f"{where}: missing {key!r} (a case needs id, category, prompt, checks)")
    checks = raw["checks"]
    if not isinstance(checks, list) or not checks:
        raise ValueError(f"{where}: 'checks' must be a non-empty list")
    for check in checks:
        kind = check.get("type") if isinstance(check, dict) else None
        if kind not in SCORERS:
            raise ValueError(f"{where}: check {check!r} has unknown type; use one of {sorted(SCORERS)}")
        try:  # bind the spec now so a typo in a field fails at load, not mid-evaluation
            inspect.signature(SCORERS[kind]).bind("", **{k: v for k, v in check.items() if k != "type"})
        except TypeError as exc:
            raise ValueError(f"{where}: check {check!r}: {exc}") from None
    prompt = raw["prompt"]
    if not isinstance(prompt, str):
        if not (isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt)):
            raise ValueError(f"{where}: 'prompt' must be a string or a list of chat messages")
        prompt = tuple(prompt)
    return EvalCase(str(raw["id"]), str(raw["category"]), prompt, tuple(checks), tuple(raw.get("tools") or ()))


def load_cases(path: str | os.PathLike[str] = DEFAULT_CASES) -> list[EvalCase]:
    """Read eval cases from JSONL (default: the shipped reliability suite)."""
    cases = []
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    raw = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path} line {line_no}: not JSON ({exc.msg})") from None
                cases.append(parse_case(raw, f"{path} line {line_no}"))
    ids = [c.id for c in cases]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate case ids {sorted({i for i in ids if ids.count(i) > 1})}")
    return cases


def cases_from_held_out(rows: Iterable[Mapping[str, Any]]) -> list[EvalCase]:
    """Held-out agent tasks (``{id, prompt, answer, category}``) as cases: the answer must appear."""
    return [EvalCase(f"held_out/{r['id']}", f"held_out/{r.get('category', 'task')}", str(r["prompt"]),
                     ({"type": "contains", "value": str(r["answer"]).split()[0]},)) for r in rows]
