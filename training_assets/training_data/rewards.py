"""Composite rewards for GRPO: named components, each a plain function, mixed by weights.

A component has the TRL reward-function shape ``(completions, **kwargs) -> list[float]``: one
float per completion, extra columns (``success``, ``expected_answer``, ...) arrive as keyword
lists aligned with ``completions``, and unknown keywords are ignored. A completion is either
the assistant's text or its messages (a list of OpenAI chat dicts, or that list as JSON text).

``compose_reward({"success": 1.0, "length": 0.1})`` returns one such function computing the
weighted sum; ``score_reward`` returns the total together with every component's scores, so a
reward can always be explained.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from training_assets.settings import DEFAULT_REWARD_WEIGHTS

RewardFn = Callable[..., list[float]]
Completion = str | Sequence[Mapping[str, Any]]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def completion_messages(completion: Completion) -> list[dict[str, Any]]:
    """The completion as a list of messages: JSON text of a list is parsed, other text is one assistant turn.

    >>> completion_messages("The answer is 4.")
    [{'role': 'assistant', 'content': 'The answer is 4.'}]
    >>> completion_messages('[{"role": "assistant", "content": "hi"}]')
    [{'role': 'assistant', 'content': 'hi'}]
    """
    if isinstance(completion, str):
        stripped = completion.lstrip()
        if stripped.startswith("["):
            try:
                parsed = json.loads(stripped)
            except ValueError:
                parsed = None
            if isinstance(parsed, list) and all(isinstance(m, dict) for m in parsed):
                return parsed
        return [{"role": "assistant", "content": completion}]
    return [dict(m) for m in completion]


def final_text(completion: Completion) -> str:
    """Content of the last assistant message ("" when there is none)."""
    for message in reversed(completion_messages(completion)):
        if message.get("role") == "assistant" and message.get("content"):
            return str(message["content"])
    return ""


def _aligned(name: str, values: Sequence[Any] | None, n: int) -> Sequence[Any]:
    if values is None:
        raise ValueError(f"reward component needs the `{name}` column (one value per completion)")
    if len(values) != n:
        raise ValueError(f"`{name}` has {len(values)} values for {n} completions; pass one per completion")
    return values


def success_reward(completions: Sequence[Completion], success: Sequence[bool | None] | None = None, **kwargs: Any) -> list[float]:
    """1.0 for a completion the environment marked successful, else 0.0.

    >>> success_reward(["a", "b", "c"], success=[True, False, None])
    [1.0, 0.0, 0.0]
    """
    return [1.0 if ok else 0.0 for ok in _aligned("success", success, len(completions))]


def _normalise_answer(text: str) -> str:
    return " ".join(text.lower().replace(",", " ").split()).rstrip(".")


def answer_correctness_reward(
    completions: Sequence[Completion], expected_answer: Sequence[str | None] | None = None, **kwargs: Any
) -> list[float]:
    """1.0 when the final assistant message states the expected answer, else 0.0.

    A numeric expected answer (its first word is a number) is compared numerically with the
    LAST number of the final message, so quoting a tool result and then answering something else
    does not count; other answers compare as case- and space-insensitive substrings. A row
    without an expected answer scores 0.0.

    >>> answer_correctness_reward(["The answer is 12.50 km.", "The tool returned 12. The answer is 13.",
    ...                            "Sorted: fig, kiwi"], expected_answer=["12.5 km", "12", "fig, kiwi"])
    [1.0, 0.0, 1.0]
    """
    scores = []
    for completion, expected in zip(completions, _aligned("expected_answer", expected_answer, len(completions)), strict=True):
        text = final_text(completion)
        if not expected:
            scores.append(0.0)
            continue
        target = _NUMBER.fullmatch(expected.split()[0]) if expected.split() else None
        if target:
            numbers = _NUMBER.findall(text.replace(",", ""))
            scores.append(1.0 if numbers and float(numbers[-1]) == float(target.group()) else 0.0)
        else:
            scores.append(1.0 if _normalise_answer(expected) in _normalise_answer(text) else 0.0)
    return scores


def tool_call_validity_reward(completions: Sequence[Completion], **kwargs: Any) -> list[float]:
    """Share of the completion's tool calls whose arguments are a JSON object (1.0 with no calls).

    >>> good = [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{"x": 1}'}}]}]
    >>> bad = [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{x: 1'}},
    ...                                             {"function": {"name": "f", "arguments": '{"x": 2}'}}]}]
    >>> tool_call_validity_reward([good, bad, "no calls"])
    [1.0, 0.5, 1.0]
    """
    scores = []
    for completion in completions:
        calls = [c for m in completion_messages(completion) for c in (m.get("tool_calls") or ())]
        valid = 0
        for call in calls:
            arguments = (call.get("function") or call).get("arguments")
            if isinstance(arguments, Mapping):
                valid += 1
                continue
            try:
                valid += isinstance(json.loads(arguments), dict)
            except (TypeError, ValueError):
                pass  # not JSON: counted as invalid, which is what this component measures
        scores.append(valid / len(calls) if calls else 1.0)
    return scores


def step_efficiency_reward(completions: Sequence[Completion], max_steps: int = 8, **kwargs: Any) -> list[float]:
    """``1 - (steps - 1) / max_steps`` clipped to [0, 1], where steps = assistant turns.

    One turn scores 1.0; each extra turn costs ``1 / max_steps``.

    >>> two_turns = [{"role": "assistant", "content": "call"}, {"role": "tool", "content": "4"},
    ...              {"role": "assistant", "content": "4"}]
    >>> step_efficiency_reward(["direct answer", two_turns], max_steps=4)
    [1.0, 0.75]
    """
    scores = []
    for completion in completions:
        steps = sum(1 for m in completion_messages(completion) if m.get("role") == "assistant")
        scores.append(min(1.0, max(0.0, 1.0 - (max(steps, 1) - 1) / max_steps)))
    return scores


def length_penalty(completions: Sequence[Completion], max_chars: int = 2000, buffer_chars: int = 500, **kwargs: Any) -> list[float]:
    """Soft overlong penalty (DAPO, Yu et al. 2025, eq. 13) on the assistant text length L in characters.

    0 for ``L <= max_chars - buffer_chars``; ``(max_chars - buffer_chars - L) / buffer_chars`` in the
    buffer; -1 beyond ``max_chars``.

    >>> length_penalty(["x" * 10, "x" * 1750, "x" * 5000], max_chars=2000, buffer_chars=500)
    [0.0, -0.5, -1.0]
    """
    scores = []
    for completion in completions:
        n = sum(len(str(m.get("content") or "")) for m in completion_messages(completion) if m.get("role") == "assistant")
        free = max_chars - buffer_chars
        scores.append(0.0 if n <= free else -1.0 if n > max_chars else (free - n) / buffer_chars)
    return scores


REWARD_COMPONENTS: dict[str, RewardFn] = {
    "success": success_reward,
    "answer": answer_correctness_reward,
    "tool_json": tool_call_validity_reward,
    "efficiency": step_efficiency_reward,
    "length": length_penalty,
}
# Success dominates; the small terms break ties between equally successful completions.


@dataclass(frozen=True)
class RewardScores:
    """A composite reward: ``total[i] = sum_k weights[k] * components[k][i]``."""

    total: list[float]
    components: dict[str, list[float]]
    weights: dict[str, float]


def _check_weights(weights: Mapping[str, float]) -> dict[str, float]:
    unknown = sorted(set(weights) - set(REWARD_COMPONENTS))
    if unknown:
        raise ValueError(f"unknown reward components {unknown}; choose from {sorted(REWARD_COMPONENTS)}")
    return {name: float(w) for name, w in sorted(weights.items()) if w}


def score_reward(completions: Sequence[Completion], weights: Mapping[str, float] | None = None, **kwargs: Any) -> RewardScores:
    """Every weighted component's scores and their weighted sum.

    >>> s = score_reward(["The answer is 4."], {"success": 1.0, "answer": 0.5}, success=[True], expected_answer=["4"])
    >>> s.total, s.components
    ([1.5], {'answer': [1.0], 'success': [1.0]})
    """
    weights = _check_weights(DEFAULT_REWARD_WEIGHTS if weights is None else weights)
    components = {name: [float(v) for v in REWARD_COMPONENTS[name](completions, **kwargs)] for name in weights}
    total = [round(sum(weights[name] * components[name][i] for name in weights), 10) for i in range(len(completions))]
    return RewardScores(total=total, components=components, weights=weights)


def compose_reward(weights: Mapping[str, float] | None = None) -> RewardFn:
    """One reward function ``(completions, **kwargs) -> list[float]``: the weighted sum of components.

    >>> reward = compose_reward({"tool_json": 1.0, "efficiency": 0.5})
    >>> reward(["plain answer"])
    [1.5]
    """
    checked = _check_weights(DEFAULT_REWARD_WEIGHTS if weights is None else weights)

    def composite_reward(completions: Sequence[Completion], **kwargs: Any) -> list[float]:
        return score_reward(completions, checked, **kwargs).total

    composite_reward.__name__ = "composite_reward_" + "_".join(checked)
    return composite_reward
