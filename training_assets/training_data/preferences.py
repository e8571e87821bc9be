"""Preference pairs for DPO: a better and a worse attempt at the same task, split where they diverge."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from training_assets.training_data.common import BuildResult, as_trace, has_completion, messages_json, trace_messages
from training_assets.traces import Trace


def _rank(trace: Trace) -> tuple[bool, float]:
    """Sort key of an attempt: success first, then score (a missing score ranks as unknown: -inf)."""
    score = trace.outcome.score
    return trace.outcome.success, -math.inf if score is None else score


def prefers(a: Trace, b: Trace, require_success: bool = True) -> tuple[bool, str]:
    """Whether attempt ``a`` is preferred to ``b``, with the reason.

    ``a`` wins when it succeeded and ``b`` failed, or when both have a score and ``a``'s is
    higher (among failures only if ``require_success`` is off). Equal outcomes are a tie: no pair.
    """
    if require_success and not a.outcome.success:
        return False, "chosen attempt did not succeed"
    if a.outcome.success and not b.outcome.success:
        return True, "success over failure"
    if a.outcome.success != b.outcome.success:
        return False, "rejected attempt is the successful one"
    if a.outcome.score is None or b.outcome.score is None:
        return False, "tie: same success and no scores to order them"
    if a.outcome.score > b.outcome.score:
        return True, "higher score"
    return False, "tie: equal scores" if a.outcome.score == b.outcome.score else "lower score"


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
    """Pairs ``{id, task_id, prompt, chosen, rejected, failure_point}`` from attempts at the same task.

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
    by_task: dict[str, list[Trace]] = defaultdict(list)
    for trace in map(as_trace, traces):
        by_task[trace.task_id].append(trace)
    result = BuildResult()
    for task_id in sorted(by_task):
        attempts = by_task[task_id]
        if len(attempts) < 2:
            result.skipped.append((task_id, "single attempt"))
            continue
        best_first = sorted(attempts, key=lambda t: (tuple(-x for x in _rank(t)), t.trace_id))
        worst_first = sorted(attempts, key=lambda t: (_rank(t), t.trace_id))
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
                c_msgs, r_msgs = trace_messages(chosen), trace_messages(rejected)
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
                fp = rejected.outcome.failure_point
                result.rows.append({
                    "id": f"{chosen.trace_id}>{rejected.trace_id}",
                    "task_id": task_id,
                    "prompt": messages_json(c_msgs[:split]),
                    "chosen": messages_json(c_msgs[split:]),
                    "rejected": messages_json(_rename_calls(c_msgs[:split], r_msgs[:split], r_msgs[split:])),
                    "failure_point": diverge if fp is None else fp,
                })
                kept += 1
        if kept == 0:
            no_success = not any(t.outcome.success for t in attempts)
            why = "no successful attempt" if require_success and no_success else "; ".join(sorted(reasons))
            result.skipped.append((task_id, why or "no preferred attempt"))
    return result
