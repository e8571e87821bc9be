"""GRPO groups: several completions of one prompt, their rewards and group-relative advantages.

Advantage of completion i in a group of G (Shao et al. 2024, DeepSeekMath, eq. 3):

    A_i = (r_i - mean(r)) / (std(r) + eps)      scale_rewards="group" (std Bessel-corrected, eps 1e-4)
    A_i =  r_i - mean(r)                        scale_rewards="none"  (Dr. GRPO, Liu et al. 2025:
                                                 dividing by std over-weights near-uniform groups)
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from training_assets.training_data.common import (
    BuildResult, as_trace, has_completion, messages_json, prompt_length, trace_messages,
)
from training_assets.training_data.rewards import RewardFn, compose_reward
from training_assets.traces import Trace

ADVANTAGE_EPS = 1e-4
ScaleRewards = Literal["group", "none"]


def group_advantages(rewards: Sequence[float], scale_rewards: ScaleRewards = "group", eps: float = ADVANTAGE_EPS) -> list[float]:
    """Group-normalised advantages of one group's rewards (see the module docstring).

    >>> [round(a, 4) for a in group_advantages([1.0, 0.0, 0.0, 1.0])]  # std = sqrt(1/3)
    [0.8659, -0.8659, -0.8659, 0.8659]
    >>> group_advantages([1.0, 0.0, 0.0, 1.0], scale_rewards="none")
    [0.5, -0.5, -0.5, 0.5]
    """
    if scale_rewards not in ("group", "none"):
        raise ValueError(f"scale_rewards={scale_rewards!r}: use 'group' (divide by the group std) or 'none' (Dr. GRPO)")
    n = len(rewards)
    if n == 0:
        return []
    mean = math.fsum(rewards) / n
    centred = [r - mean for r in rewards]
    if scale_rewards == "none":
        return centred
    std = math.sqrt(math.fsum(a * a for a in centred) / (n - 1)) if n > 1 else 0.0
    return [a / (std + eps) for a in centred]


def _rollout_from_trace(trace: Trace) -> dict[str, Any]:
    messages = trace_messages(trace)
    split = prompt_length(messages)
    extra = trace.metadata.model_extra or {}
    expected = extra.get("expected_answer")
    return {"task_id": trace.task_id, "id": trace.trace_id, "prompt": messages[:split], "completion": messages[split:],
            "success": trace.outcome.success, "expected_answer": None if expected is None else str(expected)}


def _as_messages(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) and value.lstrip().startswith("[") else value


def build_grpo_groups(
    traces_or_rollouts: Iterable[Trace | Mapping[str, Any]],
    reward_fn: RewardFn | None = None,
    scale_rewards: ScaleRewards = "group",
    min_group_size: int = 2,
) -> BuildResult:
    """Groups ``{group_id, task_id, prompt, completions, rewards, advantages, expected_answer, pass_rate}``.

    Input items are traces (``Trace`` or plain trace dicts; prompt = messages before the first
    assistant turn, completion = the rest) or rollout dicts ``{task_id?, prompt, completion, success?, expected_answer?}`` whose
    prompt/completion are message lists, JSON text of one, or (completion) plain text. Items
    with the same task and prompt form a group; ``reward_fn`` (default: ``compose_reward()``)
    scores each group's completions, getting ``success`` and ``expected_answer`` as keyword
    lists. Completions with no assistant content or tool call are skipped, and so are groups
    smaller than ``min_group_size`` (no baseline to compare against);
    ``pass_rate`` is the share of successful completions (null when success is unknown).
    """
    reward_fn = reward_fn or compose_reward()
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    result = BuildResult()
    for item in traces_or_rollouts:
        is_trace = isinstance(item, Trace) or "messages" in item  # a trace dict; rollout dicts have a completion
        rollout = _rollout_from_trace(as_trace(item)) if is_trace else dict(item)
        prompt = _as_messages(rollout["prompt"])
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        rollout["prompt_json"] = messages_json(prompt)
        completion = _as_messages(rollout["completion"])
        if not (completion.strip() if isinstance(completion, str) else has_completion(completion)):
            result.skipped.append((str(rollout.get("id") or rollout.get("task_id") or ""), "empty completion"))
            continue
        rollout["completion_json"] = completion if isinstance(completion, str) else messages_json(completion)
        groups[(str(rollout.get("task_id") or ""), rollout["prompt_json"])].append(rollout)
    for (task_id, prompt_json), members in sorted(groups.items()):
        digest = hashlib.sha256(prompt_json.encode()).hexdigest()[:8]
        group_id = f"{task_id}:{digest}" if task_id else digest
        members.sort(key=lambda r: (str(r.get("id", "")), r["completion_json"]))
        if len(members) < min_group_size:
            result.skipped.append((group_id, f"{len(members)} completion(s) < min_group_size={min_group_size}"))
            continue
        completions = [r["completion_json"] for r in members]
        success = [r.get("success") for r in members]
        expected = next((r.get("expected_answer") for r in members if r.get("expected_answer") is not None), None)
        rewards = [float(x) for x in reward_fn(completions, success=success, expected_answer=[expected] * len(members))]
        known = [s for s in success if s is not None]
        result.rows.append({
            "group_id": group_id,
            "task_id": task_id or None,
            "prompt": prompt_json,
            "completions": completions,
            "rewards": rewards,
            "advantages": group_advantages(rewards, scale_rewards),
            "expected_answer": expected,
            "pass_rate": sum(map(bool, known)) / len(known) if known else None,
        })
    return result


def filter_by_difficulty(
    groups: Iterable[Mapping[str, Any]], min_pass_rate: float = 0.0, max_pass_rate: float = 1.0,
    drop_zero_variance: bool = True,
) -> BuildResult:
    """Keep groups that can teach something: non-zero reward variance and a pass rate in the band.

    A group whose rewards are all equal has all-zero advantages, so it adds no gradient (DAPO's
    dynamic sampling drops them for the same reason). Pass-rate bands are inclusive; a group
    with unknown pass rate is judged on variance alone.

    >>> groups = [{"group_id": "a", "rewards": [1.0, 1.0], "pass_rate": 1.0},
    ...           {"group_id": "b", "rewards": [1.0, 0.0], "pass_rate": 0.5},
    ...           {"group_id": "c", "rewards": [0.9, 0.1], "pass_rate": 0.0}]
    >>> r = filter_by_difficulty(groups, min_pass_rate=0.1)
    >>> [g["group_id"] for g in r], r.skipped
    (['b'], [('a', 'zero reward variance'), ('c', 'pass rate 0.00 below 0.1')])
    """
    result = BuildResult()
    for group in groups:
        rewards = list(group["rewards"])
        rate = group.get("pass_rate")
        if drop_zero_variance and (len(rewards) < 2 or max(rewards) - min(rewards) == 0):
            result.skipped.append((group["group_id"], "zero reward variance"))
        elif rate is not None and rate < min_pass_rate:
            result.skipped.append((group["group_id"], f"pass rate {rate:.2f} below {min_pass_rate}"))
        elif rate is not None and rate > max_pass_rate:
            result.skipped.append((group["group_id"], f"pass rate {rate:.2f} above {max_pass_rate}"))
        else:
            result.rows.append(dict(group))
    return result
