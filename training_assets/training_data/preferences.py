"""Preference pairs for DPO: a better and a worse attempt at the same task, split where they diverge."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import polars as pl

from training_assets.trace_schema import Trace
from training_assets.training_data.common import (
    BuildResult, TraceRecord, as_trace_records, has_completion, messages_json, source_batches,
)


def attempts_by_task(traces: list[TraceRecord]) -> pl.DataFrame:
    """One row per task (sorted): ``best`` and ``worst`` list the indices of its attempts into
    ``traces``, best first (success, then score desc) and worst first (failure, then score asc);
    a missing score ranks as unknown (-inf), the trace id breaks ties."""
    frame = pl.DataFrame({
        "i": list(range(len(traces))), "task_id": [t.task_id for t in traces], "trace_id": [t.trace_id for t in traces],
        "success": [t.success for t in traces],
        "score": [-math.inf if t.score is None else float(t.score) for t in traces],
    }, schema={"i": pl.Int64, "task_id": pl.String, "trace_id": pl.String, "success": pl.Boolean, "score": pl.Float64})
    best = (frame.sort(["task_id", "success", "score", "trace_id", "i"], descending=[False, True, True, False, False])
            .group_by("task_id", maintain_order=True).agg(pl.col("i").alias("best")))
    worst = (frame.sort(["task_id", "success", "score", "trace_id", "i"])
             .group_by("task_id", maintain_order=True).agg(pl.col("i").alias("worst")))
    return best.join(worst, on="task_id", how="inner", maintain_order="left")


def prefers(a: TraceRecord, b: TraceRecord, require_success: bool = True) -> tuple[bool, str]:
    """Whether attempt ``a`` is preferred to ``b``, with the reason.

    ``a`` wins when it succeeded and ``b`` failed, or when both have a score and ``a``'s is
    higher (among failures only if ``require_success`` is off). Equal outcomes are a tie: no pair.
    """
    if require_success and not a.success:
        return False, "chosen attempt did not succeed"
    if a.success and not b.success:
        return True, "success over failure"
    if a.success != b.success:
        return False, "rejected attempt is the successful one"
    if a.score is None or b.score is None:
        return False, "tie: same success and no scores to order them"
    if a.score > b.score:
        return True, "higher score"
    return False, "tie: equal scores" if a.score == b.score else "lower score"


def _without_call_ids(message: dict[str, Any]) -> dict[str, Any]:
    """The message with tool-call ids blanked: ids are per-attempt bookkeeping, not what the agent chose."""
    out = {k: v for k, v in message.items() if k != "tool_call_id"}
    if out.get("tool_calls"):
        out["tool_calls"] = [{k: v for k, v in call.items() if k != "id"} for call in out["tool_calls"]]
    return out


def split_point(chosen: list[dict[str, Any]], rejected: list[dict[str, Any]]) -> tuple[int, int]:
    """(prompt length, first divergence) of two conversations.

    The first divergence is the first message index where they differ (tool-call ids aside).
    The prompt is the shared prefix cut back to the start of an assistant turn, so both
    continuations begin with what the policy itself said (a tool result is the environment's,
    not a choice to prefer).
    """
    diverge = next((i for i, (c, r) in enumerate(zip(chosen, rejected, strict=False))
                    if _without_call_ids(c) != _without_call_ids(r)), min(len(chosen), len(rejected)))
    split = diverge
    while split > 0 and not (split < len(chosen) and split < len(rejected)
                             and chosen[split].get("role") == "assistant" and rejected[split].get("role") == "assistant"):
        split -= 1
    return split, diverge


def _rename_calls(prefix_chosen: list[dict[str, Any]], prefix_rejected: list[dict[str, Any]],
                  continuation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Point the rejected continuation's tool results at the call ids of the shared (chosen) prompt."""
    ids = {r_call["id"]: c_call["id"] for c, r in zip(prefix_chosen, prefix_rejected, strict=True)
           for c_call, r_call in zip(c.get("tool_calls") or (), r.get("tool_calls") or (), strict=True)}
    return [{**m, "tool_call_id": ids[m["tool_call_id"]]} if m.get("tool_call_id") in ids else m for m in continuation]


def build_preference_pairs(
    traces: Iterable[Trace | Mapping[str, Any]], max_pairs_per_task: int = 4, require_success: bool = True
) -> BuildResult:
    """Pairs ``{id, task_id, prompt, chosen, rejected, failure_point, source_batches}`` from attempts
    at the same task (``traces``: trace dicts, ``raw_traces``/``selected_traces`` rows or ``Trace``s).

    ``prompt`` is the shared conversation prefix (JSON messages), ``chosen`` / ``rejected`` the
    two continuations from the first assistant turn where they part. ``failure_point`` indexes
    the rejected attempt's whole conversation (``prompt + rejected``): the step where it failed
    as its trace recorded (``outcome.failure_point``), else the first message where it
    diverges from the chosen attempt.

    Candidates are enumerated best chosen first (score desc) and worst rejected first (score
    asc), trace id breaking ties, and at most ``max_pairs_per_task`` pairs are kept per task.
    Tasks with a single attempt, with no success (when ``require_success``) or with only tied
    attempts give no pair, and ``skipped`` says which.
    """
    records = as_trace_records(traces)
    result = BuildResult()
    for task_id, best, worst in attempts_by_task(records).iter_rows():
        if len(best) < 2:
            result.skipped.append((task_id, "single attempt"))
            continue
        best_first, worst_first = [records[i] for i in best], [records[i] for i in worst]
        kept = 0
        reasons: set[str] = set()
        for chosen in best_first:
            for rejected in worst_first:
                if kept >= max_pairs_per_task or chosen is rejected:
                    continue
                ok, reason = prefers(chosen, rejected, require_success)
                if not ok:
                    reasons.add(reason)
                    continue
                c_msgs, r_msgs = chosen.messages, rejected.messages
                split, diverge = split_point(c_msgs, r_msgs)
                if not any(m.get("role") == "user" for m in c_msgs[:split]):
                    reasons.add("no shared user prompt")
                    continue
                if diverge == len(c_msgs) == len(r_msgs):
                    reasons.add("identical conversations with different outcomes")
                    continue
                if split >= len(c_msgs) or split >= len(r_msgs):
                    reasons.add("one attempt is a prefix of the other: empty continuation")
                    continue
                if not (has_completion(c_msgs[split:]) and has_completion(r_msgs[split:])):
                    reasons.add("a continuation has no assistant content or tool call")
                    continue
                fp = rejected.failure_point
                result.rows.append({
                    "id": f"{chosen.trace_id}>{rejected.trace_id}",
                    "task_id": task_id,
                    "prompt": messages_json(c_msgs[:split]),
                    "chosen": messages_json(c_msgs[split:]),
                    "rejected": messages_json(_rename_calls(c_msgs[:split], r_msgs[:split], r_msgs[split:])),
                    "failure_point": diverge if fp is None else fp,
                    "source_batches": source_batches(chosen.batch_id, rejected.batch_id),
                })
                kept += 1
        if kept == 0:
            no_success = not any(t.success for t in best_first)
            why = "no successful attempt" if require_success and no_success else "; ".join(sorted(reasons))
            result.skipped.append((task_id, why or "no preferred attempt"))
    return result
