"""Verb: ``compose-reward`` (score traces or completions with the composite GRPO reward).

    training-assets compose-reward data/inbox/traces-0001.jsonl                 # default weights
    training-assets compose-reward rollouts.jsonl --weights success=1 answer=0.5 --json

Input: a JSONL file (``.jsonl`` or ``.jsonl.gz``) whose rows are traces (the trace schema: the
completion is everything after the prompt, ``success`` and ``expected_answer`` come from the
outcome and metadata) or completions ``{"completion": ..., "success"?: ..., "expected_answer"?: ...,
"id"?: ...}``. Prints each row's total and every weighted component (``training_data.score_reward``),
then the mean of each. A line that is neither (not JSON, a trace that fails the schema) is
skipped with its line number and reason, and counted.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from pathlib import Path
from typing import Any

from training_assets.commands import emit, fail
from training_assets.training_data import score_reward
from training_assets.training_data.common import as_trace_record, prompt_length


def _parse_weights(pairs: list[str] | None) -> dict[str, float] | None:
    if not pairs:
        return None
    weights = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        try:
            weights[name] = float(value if sep else "not a number")
        except ValueError:
            raise ValueError(f"--weights {pair!r}: expected NAME=NUMBER, e.g. success=1.0") from None
    return weights


def _completion(row: Any, line_no: int) -> dict[str, Any]:
    """(id, completion, success, expected_answer) of a completion row or a trace; ValueError if neither."""
    if not isinstance(row, dict):
        raise ValueError("expected a JSON object")
    if "completion" in row and "messages" not in row and "trace_id" not in row:
        return {"id": str(row.get("id", f"line-{line_no}")), "completion": row["completion"],
                "success": row.get("success"), "expected_answer": row.get("expected_answer")}
    trace = as_trace_record(row, line_no)
    return {"id": trace.trace_id, "completion": trace.messages[prompt_length(trace.messages):],
            "success": trace.success, "expected_answer": trace.expected_answer}


def _read(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(items to score, skipped lines with their reason)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    items, skipped = [], []
    with opener(path, "rt", encoding="utf-8", errors="replace") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                items.append(_completion(json.loads(line), line_no))
            except ValueError as exc:
                skipped.append({"line_no": line_no, "reason": str(exc)})
    return items, skipped


def _compose_reward(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        return fail(f"compose-reward: {path}: no such file")
    try:
        items, skipped = _read(path)
        weights = _parse_weights(args.weights)
        scores = score_reward([i["completion"] for i in items], weights, success=[i["success"] for i in items],
                              expected_answer=[i["expected_answer"] for i in items])
    except ValueError as exc:
        return fail(f"compose-reward: {exc}")
    names = list(scores.weights)
    rows = [{"id": item["id"], "total": scores.total[n], **{c: scores.components[c][n] for c in names}}
            for n, item in enumerate(items)]
    means = {c: round(statistics.fmean(scores.components[c]), 6) if items else None for c in names}
    payload = {"file": str(path), "weights": scores.weights, "rows": rows, "mean": means,
               "mean_total": round(statistics.fmean(scores.total), 6) if items else None, "skipped": skipped}
    header = f"{'id':<32} {'total':>8} " + " ".join(f"{c:>10}" for c in names)
    lines = [f"{path}: {len(items)} completions scored, {len(skipped)} lines skipped; weights {scores.weights}", header]
    lines += [f"{r['id'][:32]:<32} {r['total']:>8.3f} " + " ".join(f"{r[c]:>10.3f}" for c in names) for r in rows]
    if items:
        lines.append(f"{'mean':<32} {payload['mean_total']:>8.3f} " + " ".join(f"{means[c]:>10.3f}" for c in names))
    lines += [f"  skipped line {s['line_no']}: {s['reason']}" for s in skipped[:20]]
    emit(args, payload, "\n".join(lines))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("compose-reward", help="score traces or completions with the composite reward, per component")
    p.add_argument("file", help="JSONL (.jsonl / .jsonl.gz) of traces or {completion, success?, expected_answer?} rows")
    p.add_argument("--weights", nargs="+", metavar="NAME=W",
                   help="component weights (success, answer, tool_json, efficiency, length); default: the GRPO defaults")
    p.add_argument("--json", action="store_true", help="machine-readable scores")
    p.set_defaults(handler=_compose_reward)
