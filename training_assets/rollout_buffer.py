"""Rollout staging for GRPO: prompt → generations (token ids + log-probs) → rewards → training rows.

``RolloutBuffer`` collects completions per prompt from any sampler (``trainers.rollouts``: the
policy's own decoders or ``VllmRolloutClient``), scores them with a reward function of the reward engine's shape
``(completions, **columns) -> list[float]``, computes group-relative advantages, and hands the
loop one row per generation (``rows``). A group may also hold logged attempts next to the
policy's samples (GRPO ``rollout="mixed"``): they arrive with their stored reward and
assistant-token mask, and the advantages cover the whole group.

``VllmRolloutClient`` talks to a running vLLM OpenAI-compatible server (through
``vllm_client.VllmClient``: API key, allow-list, retries): ``POST /v1/completions``
with ``n`` samples, ``logprobs=0`` and ``return_tokens_as_token_ids`` so each sampled token comes
back as ``token_id:<id>`` with its log-prob; ``model`` may name a LoRA adapter loaded at runtime.
Start vLLM with ``--logprobs-mode processed_logprobs`` so the log-probs are those of the
distribution actually sampled from (after temperature), which is what the importance ratio needs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from training_assets.vllm_client import VllmClient


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    logprobs: list[float] | None = None  # sampler log-probs per token (None: recompute with the policy)
    reward: float | None = None  # preset for a logged attempt (its stored reward); None = score with the reward fn
    completion_mask: list[int] | None = None  # 1 = token trained on (None: all; a logged attempt masks tool results)
    prompt_ids: list[int] | None = None  # own prompt encoding (a logged attempt's template prefix); None = the group's
    advantage: float | None = None


@dataclass
class StagedPrompt:
    group_id: str
    prompt: list[dict[str, Any]]
    prompt_ids: list[int]
    expected_answer: str | None = None
    generations: list[Generation] = field(default_factory=list)


class RolloutBuffer:
    """Prompts staged for one rollout round, their generations, rewards and advantages."""

    def __init__(self) -> None:
        self.prompts: list[StagedPrompt] = []

    def stage(self, group_id: str, prompt: list[dict[str, Any]], prompt_ids: list[int], expected_answer: str | None = None) -> StagedPrompt:
        staged = StagedPrompt(group_id, prompt, list(prompt_ids), expected_answer)
        self.prompts.append(staged)
        return staged

    def score(self, reward_fn: Callable[..., list[float]], scale_rewards: str = "group") -> None:
        """Reward the unscored generations, then set group-relative advantages over the WHOLE group.

        A generation with a preset ``reward`` (a logged attempt replayed next to the policy's own
        samples, ``rollout="mixed"``) keeps it; the advantages (``training_data.group_advantages``)
        are normalised over logged and sampled members together.
        """
        from training_assets.training_data.grpo import group_advantages  # polars: ~0.3 s, only when a group is scored

        for staged in self.prompts:
            if not staged.generations:
                raise ValueError(f"prompt {staged.group_id} has no generations to score")
            pending = [g for g in staged.generations if g.reward is None]
            if pending:
                texts = [json.dumps([{"role": "assistant", "content": g.text}]) for g in pending]
                for g, r in zip(pending, reward_fn(texts, expected_answer=[staged.expected_answer] * len(texts))):
                    g.reward = float(r)
            rewards = [float(g.reward) for g in staged.generations]  # type: ignore[arg-type]
            for g, a in zip(staged.generations, group_advantages(rewards, scale_rewards)):
                g.advantage = float(a)

    def rows(self) -> list[dict[str, Any]]:
        """One training row per generation: prompt ids, completion ids and mask, sampler log-probs, advantage."""
        return [{"group_id": s.group_id, "prompt_ids": g.prompt_ids or s.prompt_ids, "completion_ids": g.token_ids,
                 "completion_mask": g.completion_mask if g.completion_mask is not None else [1] * len(g.token_ids),
                 "old_logps": g.logprobs, "advantage": g.advantage, "reward": g.reward}
                for s in self.prompts for g in s.generations]

    def mean_reward(self) -> float:
        rewards = [g.reward for s in self.prompts for g in s.generations if g.reward is not None]
        return sum(rewards) / len(rewards) if rewards else float("nan")


class VllmRolloutClient:
    """Sample completions with log-probs of ``model`` (the base model or a loaded LoRA) from a vLLM server.

    The HTTP side (API key, allow-list, retries) is ``vllm_client.VllmClient``; pass one as ``client``
    to share it with the policy sync, or let ``base_url`` and ``retry`` build one.
    """

    def __init__(self, base_url: str, model: str, timeout_s: float = 120.0, retry: Any = None,
                 api_key_env: str = "VLLM_API_KEY", client: Any = None) -> None:
        self.client = client or VllmClient(base_url, api_key_env=api_key_env, retry=retry, timeout_s=timeout_s)
        self.base_url, self.model = self.client.base_url, model

    def generate(self, prompt_ids: Sequence[int], n: int, max_tokens: int, temperature: float) -> list[Generation]:
        return [Generation(text=text, token_ids=ids, logprobs=logps)
                for text, ids, logps in self.client.complete(self.model, prompt_ids, n, max_tokens, temperature)]
