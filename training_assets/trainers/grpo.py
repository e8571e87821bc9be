"""Group Relative Policy Optimisation (Shao et al. 2024, DeepSeekMath, https://arxiv.org/abs/2402.03300).

One step, top to bottom (``collate`` then ``loss``, per micro-batch):

    groups = sampler.sample(prompt_ids, model)    # trainers.rollouts: lean | transformers | generate | vllm
    buffer.score(reward_fn)                       # rewards (training_data.compose_reward), then group advantages
    batch = self.collate(buffer.rows(), model)   # padded ids, masks, advantages (+ reference log-probs)
    loss = objectives.grpo_surrogate(...)         # the clipped importance ratio

Each example is a ``grpo_groups`` row: a prompt with the agents' logged attempts (``completions``,
``rewards``, ``advantages``). ``GrpoSpec.rollout`` chooses where each group's rollouts come from:

* ``"local"`` (library default) — the policy's own samples: ``num_generations`` completions per
  prompt, decoded by the local sampler ``GrpoSpec.sampler`` picks (``trainers/rollouts.py``),
  scored with the reward engine, advantages normalised within the sampled group.
* ``"vllm"`` — the same, sampled by a vLLM server (``GrpoSpec.vllm``, a ``VllmSpec``; the sampler's
  log-probs are the old policy); LoRA runs only: ``trainers.policy_sync`` loads the adapter into the
  server as ``<run>-v<step>`` after every ``vllm.sync_steps`` optimizer steps and the rollouts ask
  for the newest version.
* ``"dataset"`` — the logged attempts only, with their stored advantages (purely off-policy replay).
* ``"mixed"`` — the logged attempts (stored rewards: the environment's verdict, which a fresh sample
  cannot have) plus ``num_generations`` local samples in the SAME group; advantages are normalised
  over the whole group, so a logged success pulls the policy towards it even when all of the
  policy's own samples fail alike (off-policy guidance: LUFFY, Yan et al. 2025, "Learning to
  Reason under Off-Policy Guidance", https://arxiv.org/abs/2504.14945; without LUFFY's policy
  shaping of the off-policy ratio).

A tiny or early policy samples completions whose rewards are all equal within a group, so every
advantage — and the loss — is 0 with ``"local"``; ``"dataset"`` and ``"mixed"`` learn from the
logged successes and failures. The loss is ``objectives.grpo_surrogate`` — the clipped
importance-ratio surrogate with clip-higher and an optional k3 KL to the reference.

``GrpoSpec.loss_type="la_grpo"`` selects the token-masked Local-Advantage GRPO surrogate
(Franceschetti 2025): the members of a group share a prefix and branch at their first divergence;
only tokens from that branch point on carry the advantage (``branch_starts``; the mask itself is
``objectives.grpo_token_weights``).

One policy update per rollout batch (TRL's ``num_iterations=1``): the old log-probs are the
current policy's at rollout time (also for logged attempts, whose behaviour policy is unknown), so
the ratio starts at 1 and the clipping only matters after the first step; with vLLM they are the
sampler's log-probs.

torch, ``modeling`` and ``objectives`` (all import torch) are imported by the methods that run
tensors: building and planning the trainer imports no torch.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from training_assets.rollout_buffer import Generation, RolloutBuffer
from training_assets.trainers.base import TrainerBase
from training_assets.trainers.modeling_refs import reference_context
from training_assets.trainers.policy_sync import VllmPolicySync
from training_assets.trainers.rollouts import Sampler, pick_sampler
from training_assets.trainers.sft import as_messages, encode_completion, encode_prompt
from training_assets.training_data import compose_reward

# A generated completion has no environment verdict, so "success" cannot be scored online.
ONLINE_REWARD_WEIGHTS = {"answer": 1.0, "tool_json": 0.2, "efficiency": 0.1, "length": 0.1}


def first_divergence(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the sequences' longest common prefix: the first index at which any two differ."""
    shortest = min((len(s) for s in sequences), default=0)
    for i in range(shortest):
        if any(s[i] != sequences[0][i] for s in sequences[1:]):
            return i
    return shortest


def branch_starts(rows: Sequence[dict[str, Any]]) -> list[int]:
    """Per row, the completion index where its group first diverges (LA-GRPO's branch point).

    The prefix is taken over prompt + completion token ids, so members whose prompts are encoded
    differently (a logged attempt's template prefix next to a sampled completion) branch at the
    first differing token, clamped to the start of each completion. A group of one has nothing to
    branch from: its whole completion counts.
    """
    groups: dict[str, list[list[int]]] = defaultdict(list)
    for r in rows:
        groups[r["group_id"]].append(list(r["prompt_ids"]) + list(r["completion_ids"]))
    shared = {g: first_divergence(seqs) if len(seqs) > 1 else 0 for g, seqs in groups.items()}
    return [max(0, shared[r["group_id"]] - len(r["prompt_ids"])) for r in rows]


class GRPOTrainer(TrainerBase):
    kind = "grpo"

    def __init__(self, *args: Any, reward_fn: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reward_fn = reward_fn
        self.reference: Any = None
        self.rewards: list[float] = []  # mean reward per rollout batch
        self.skipped: list[dict[str, str]] = []
        self.policy_sync: VllmPolicySync | None = None  # rollout="vllm"
        self.sampler: Sampler | None = None  # picked at the first rollout (trainers.rollouts.pick_sampler)

    @property
    def sequences_per_example(self) -> int:  # type: ignore[override]
        # per group: the policy's samples (mixed adds the logged attempts, unknown before prepare)
        return self.config.grpo.num_generations if self.config.grpo.rollout != "dataset" else 1

    def result_extra(self) -> dict[str, Any]:
        extra = {"skipped": list(self.skipped), "mean_rewards": list(self.rewards)}
        if self.sampler is not None:
            extra["rollout_sampler"] = {"sampler": self.sampler.name, "reason": self.sampler.reason}
        if self.policy_sync is not None:  # the adapter versions vLLM sampled from, and how often a request was retried
            extra |= {"vllm_adapters": list(self.policy_sync.history), "vllm_retries": self.policy_sync.client.retries}
        return extra

    def reward_fn(self) -> Any:
        if self._reward_fn is None:
            self._reward_fn = compose_reward(self.config.grpo.reward_weights or ONLINE_REWARD_WEIGHTS)
        return self._reward_fn

    def example_tokens(self, example: dict[str, Any]) -> int:
        prompt_chars = sum(len(str(m.get("content") or "")) for m in as_messages(example["prompt"]))
        return prompt_chars // 4 + self.config.grpo.max_new_tokens

    def _logged(self, group_id: str, prompt: list[dict[str, Any]], example: dict[str, Any], tokenizer: Any,
                key: str) -> list[tuple[list[int], list[int], list[int], float]]:
        """The group's logged attempts that have assistant tokens: (prompt ids, completion ids, mask, ``key`` value)."""
        out = []
        prompt_ids = encode_prompt(tokenizer, prompt)  # once per group
        for j, (completion, value) in enumerate(zip(example["completions"], example[key])):
            enc = encode_completion(tokenizer, prompt, as_messages(completion), self.config.max_seq_len, prompt_ids)
            if enc is None:
                self.skipped.append({"id": f"{group_id}/{j}", "reason": "completion has no assistant tokens"})
                continue
            ids, mask, plen = enc
            out.append((ids[:plen], ids[plen:], mask[plen:], float(value)))
        return out

    def prepare(self, examples: list[dict[str, Any]], tokenizer: Any) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for i, e in enumerate(examples):
            group_id = str(e.get("group_id", i))
            prompt = as_messages(e["prompt"])
            if self.config.grpo.rollout == "dataset":
                for p_ids, c_ids, mask, advantage in self._logged(group_id, prompt, e, tokenizer, "advantages"):
                    rows.append({"group_id": group_id, "prompt_ids": p_ids, "completion_ids": c_ids,
                                 "completion_mask": mask, "advantage": advantage, "old_logps": None})
            else:
                prompt_ids = list(tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True,
                                                                return_dict=True)["input_ids"])
                logged = self._logged(group_id, prompt, e, tokenizer, "rewards") if self.config.grpo.rollout == "mixed" else []
                rows.append({"group_id": group_id, "prompt": prompt, "prompt_ids": prompt_ids[-self.config.max_seq_len:],
                             "expected_answer": e.get("expected_answer"), "logged": logged})
        if not rows:
            raise ValueError(f"grpo: no trainable rows from {len(examples)} groups; first reasons: {self.skipped[:3]}")
        if self.config.grpo.rollout == "dataset" and self.config.grpo.loss_type == "la_grpo":
            for row, start in zip(rows, branch_starts(rows), strict=True):  # whole groups are here, not per batch
                row["branch_start"] = start
        return rows

    def before_loop(self, model: Any, rows: list[dict[str, Any]]) -> None:
        if self.config.grpo.kl_beta > 0 and not hasattr(model, "peft_config"):
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        if self.config.grpo.rollout == "vllm":
            self.policy_sync = VllmPolicySync.from_config(self.config, self.accelerator)
            self.policy_sync.preflight()  # a wrong key or model name fails here, before any step

    def policy_hook(self) -> Any:
        return self.policy_sync.after_step if self.policy_sync is not None else None

    # ---------------------------------------------------------------- the step
    def micro_batch(self, rows: list[dict[str, Any]], model: Any) -> dict[str, Any]:
        """``run_loop``'s micro-batch: on-policy rows are rolled out first (sample → score → advantages), then
        collated; logged replay (rollout="dataset") is collated as it is."""
        if self.config.grpo.rollout != "dataset":
            rows = self._rollout(rows, model)
        return self.collate(rows, model)

    def _rollout(self, rows: list[dict[str, Any]], model: Any) -> list[dict[str, Any]]:
        """Sample each prompt's group (the sampler), score it, set group advantages: one training row per member."""
        if self.sampler is None:  # picked once per run: the model's layout does not change
            self.sampler = pick_sampler(self.config.grpo, model, self.tokenizer, self.policy_sync)
        sampled = self.sampler.sample([r["prompt_ids"] for r in rows], model)
        buffer = RolloutBuffer()
        for r, generations in zip(rows, sampled, strict=True):
            staged = buffer.stage(r["group_id"], r["prompt"], r["prompt_ids"], r.get("expected_answer"))
            staged.generations = [*self._logged_generations(r), *generations]  # mixed: logged attempts first
        buffer.score(self.reward_fn())  # rewards for the sampled members, then advantages over the whole group
        self.rewards.append(buffer.mean_reward())
        out = buffer.rows()
        if self.config.grpo.loss_type == "la_grpo":
            out = [{**r, "branch_start": b} for r, b in zip(out, branch_starts(out), strict=True)]
        return out

    def _logged_generations(self, row: dict[str, Any]) -> list[Generation]:
        """rollout="mixed": the group's logged attempts, with their stored rewards and assistant-token masks."""
        return [Generation(text=self.tokenizer.decode(c_ids, skip_special_tokens=True), token_ids=c_ids, reward=reward,
                           completion_mask=mask, prompt_ids=p_ids)
                for p_ids, c_ids, mask, reward in row.get("logged", [])]

    def collate(self, rows: list[dict[str, Any]], model: Any) -> dict[str, Any]:
        """The batch ``loss`` reads: left-padded prompts + right-padded completions, masks, advantages, and the
        reference log-probs when ``kl_beta > 0``."""
        import torch  # torch: import-time stays torch-free

        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        P = max(len(r["prompt_ids"]) for r in rows)
        C = max(max(len(r["completion_ids"]) for r in rows), 1)
        ids, attn, cmask = [], [], []
        for r in rows:
            p, c, m = r["prompt_ids"], r["completion_ids"], r["completion_mask"]
            ids.append([pad_id] * (P - len(p)) + p + c + [pad_id] * (C - len(c)))
            attn.append([0] * (P - len(p)) + [1] * (len(p) + len(c)) + [0] * (C - len(c)))
            cmask.append(list(m) + [0] * (C - len(m)))
        batch: dict[str, Any] = {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(attn),
                                 "completion_mask": torch.tensor(cmask, dtype=torch.float32),
                                 "advantages": torch.tensor([r["advantage"] for r in rows], dtype=torch.float32),
                                 "prompt_len": P}
        batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        if self.config.grpo.loss_type == "la_grpo":
            batch["branch_start"] = torch.tensor([r["branch_start"] for r in rows], dtype=torch.long)
        # Sampler log-probs (vLLM) are the old policy; otherwise old = current policy, taken as
        # logps.detach() in the loss (one update per rollout batch) instead of a second forward.
        if all(r.get("old_logps") is not None for r in rows):
            batch["old_logps"] = torch.tensor([list(r["old_logps"]) + [0.0] * (C - len(r["old_logps"])) for r in rows])
        if self.config.grpo.kl_beta > 0:
            with torch.inference_mode():
                if self.reference is not None:
                    ref = self._completion_logps(self.reference, batch)
                else:
                    with reference_context(model):
                        ref = self._completion_logps(model, batch)
            batch["ref_logps"] = ref.clone()  # a normal tensor: inference tensors cannot enter autograd
        batch["n_tokens"] = int(batch["attention_mask"].sum())
        trained = batch["completion_mask"]
        if "branch_start" in batch:  # LA-GRPO trains only from the branch point on
            trained = trained * (torch.arange(C)[None, :] >= batch["branch_start"][:, None])
        batch["weight"] = float(trained.sum())
        return batch

    @staticmethod
    def _completion_logps(model: Any, batch: dict[str, Any]) -> Any:
        """(B, C) log-probs of the completion tokens under ``model`` (LM head on the completion positions only)."""
        from training_assets.trainers.modeling import completion_logps  # torch: planning stays torch-free

        return completion_logps(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                                batch["prompt_len"])

    def loss(self, model: Any, batch: dict[str, Any]) -> tuple[Any, float]:
        from training_assets.trainers import objectives  # torch: planning stays torch-free

        logps = self._completion_logps(model, batch)
        dev = logps.device
        mask = batch["completion_mask"].to(dev)
        if batch["weight"] == 0:
            return logps.sum() * 0.0, 0.0
        old = batch["old_logps"].to(dev) if "old_logps" in batch else logps.detach()
        loss = objectives.grpo_surrogate(
            logps, old, batch["advantages"].to(dev), mask,
            ref_logps=batch["ref_logps"].to(dev) if "ref_logps" in batch else None, beta=self.config.grpo.kl_beta,
            epsilon_low=self.config.grpo.epsilon_low, epsilon_high=self.config.grpo.epsilon_high,
            loss_type=self.config.grpo.loss_type, branch_start=batch["branch_start"].to(dev) if "branch_start" in batch else None,
            backend=self.config.kernel_backend)
        return loss, batch["weight"]
