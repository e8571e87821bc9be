"""Odds Ratio Preference Optimisation (Hong et al. 2024, https://arxiv.org/abs/2403.07691): SFT and preference in one stage.

Examples are ``preference_pairs`` rows, the same as DPO's: ``prompt`` (shared messages), ``chosen``
and ``rejected`` (continuations); each side is encoded as prompt + continuation and only the
continuation's assistant tokens count. There is no reference model, so ORPO starts from the base
checkpoint and needs no SFT stage before it: one forward runs chosen and rejected together (2B
rows) and the loss is ``objectives.orpo_loss`` on

* the mean token log-prob of each completion (the odds ``p / (1 - p)`` with ``p = exp(mean)``), and
* the chosen NLL: the token-mean cross-entropy over the chosen completion tokens of the micro-batch.
  TRL's ``ORPOTrainer`` takes it over prompt and completion; here the prompt is the task and the
  tool results, which SFT does not train on either (assistant-only loss).

``beta`` (``OrpoSpec.beta``) is the paper's lambda. Each micro-batch's rewards (``beta`` times the
mean log-probs), reward accuracy, log odds and NLL are kept and reported in the result.

torch, ``modeling`` and ``objectives`` (both import torch) are imported by the methods that run
tensors: building and planning the trainer imports no torch.
"""

from __future__ import annotations

from typing import Any

from training_assets.trainers.base import TrainerBase
from training_assets.trainers.pairs import encode_pairs, pair_tokens

# the per-micro-batch means reported in the result, in the order loss() stacks them
METRICS = ("chosen_rewards", "rejected_rewards", "reward_accuracy", "log_odds", "nll")


class ORPOTrainer(TrainerBase):
    kind = "orpo"
    sequences_per_example = 2

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.skipped: list[dict[str, str]] = []
        self.metrics: list[Any] = []  # one detached (len(METRICS),) tensor per micro-batch: no host sync per step

    def example_tokens(self, example: dict[str, Any]) -> int:
        return pair_tokens(example)

    def prepare(self, examples: list[dict[str, Any]], tokenizer: Any) -> list[dict[str, Any]]:
        return encode_pairs("orpo", examples, tokenizer, self.config.max_seq_len, self.skipped)

    def result_extra(self) -> dict[str, Any]:
        import torch  # torch: import-time stays torch-free

        columns = torch.stack(self.metrics).T.tolist() if self.metrics else [[] for _ in METRICS]
        return {"skipped": list(self.skipped), **dict(zip(METRICS, columns, strict=True))}

    def collate(self, rows: list[dict[str, Any]], model: Any) -> dict[str, Any]:
        from training_assets.trainers.modeling import pad_sequences  # torch: planning stays torch-free

        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        seqs = [r["chosen"] for r in rows] + [r["rejected"] for r in rows]  # (2B): chosen first
        batch = pad_sequences(seqs, pad_id)
        return {**batch, "n_tokens": sum(len(s[0]) for s in seqs), "weight": float(len(rows)),
                # completion tokens per sequence: the targets sequence_logps sums (position t predicts t+1)
                "n_completion": batch["loss_mask"][:, 1:].sum(dim=1)}

    def loss(self, model: Any, batch: dict[str, Any]) -> tuple[Any, float]:
        import torch  # torch: import-time stays torch-free

        from training_assets.trainers import objectives  # torch: planning stays torch-free
        from training_assets.trainers.modeling import sequence_logps  # torch: planning stays torch-free

        backend = self.config.kernel_backend
        logps = sequence_logps(model, batch["input_ids"], batch["attention_mask"], batch["loss_mask"], backend)  # (2B,)
        counts = batch["n_completion"].to(logps.device, logps.dtype)  # (2B,), each >= 1 (prepare skips empty sides)
        B = logps.shape[0] // 2
        mean_logps = logps / counts
        nll = -logps[:B].sum() / counts[:B].sum()  # token-mean over the chosen completion tokens
        out = objectives.orpo_loss(mean_logps[:B], mean_logps[B:], nll, beta=self.config.orpo.beta, backend=backend)
        accuracy = (out.chosen_rewards > out.rejected_rewards).float().mean()
        parts = (out.chosen_rewards.mean(), out.rejected_rewards.mean(), accuracy, out.log_odds.mean(), out.nll)
        self.metrics.append(torch.stack([p.float() for p in parts]))
        return out.loss, float(B)
