"""Kahneman-Tversky Optimisation (Ethayarajh et al. 2024, https://arxiv.org/abs/2402.01306).

Examples are ``binary_feedback`` rows: ``prompt`` and ``completion`` (JSON messages) and
``label`` (True: desirable). Each is encoded as prompt + completion; only the completion's
assistant tokens count in the sequence log-prob. The loss is ``objectives.kto_loss``: each
example's policy/reference log-ratio against the reference point z0, a KL estimate.

z0 comes from mismatched pairs (x_i, y_j), as TRL does: its dataset map cycles the completions by
one within each run of ``batch_size`` consecutive rows, then trains those rows as one batch. Here
the partner is fixed the same way when the rows are prepared (``kl_partners``: the nearest earlier
row of the run, cyclically, whose prompt differs — a same-task neighbour would be a matched pair),
so the reference log-probs of both sequences can be computed once, while the loop still shuffles
the rows: a batch's z0 is the mean log-ratio of its rows' fixed mismatched pairs, detached (the
policy's KL forward runs without gradients, as in TRL).

The reference is the policy at the start of training. By default its log-probs are computed once
before the first step (``KtoSpec.precompute_ref_logps``) and saved next to the checkpoints
(``ref_logps.json``); otherwise the reference runs every step — for a LoRA policy the same model
with the adapter disabled, for a full policy a frozen copy. Each loss call records the mean
desirable and undesirable rewards and z0 (``result_extra``: ``chosen_rewards``,
``rejected_rewards``, ``kl``).

torch, ``modeling`` and ``objectives`` (both import torch) are imported by the methods that run
tensors: building and planning the trainer imports no torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from training_assets.trainers.base import TrainerBase
from training_assets.trainers.modeling_refs import frozen_copy, precompute_reference_logps, reference_context
from training_assets.trainers.sft import as_messages, encode_completion, encode_prompt

REF_LOGPS_FILE = "ref_logps.json"


def kl_partners(prompts: Sequence[str], run: int) -> list[int]:
    """Per row, the row whose completion forms its mismatched KL pair.

    Rows are taken in runs of ``run`` consecutive rows (a last run of one joins the run before it:
    alone it could only pair with itself); within a run each row takes the nearest earlier row,
    cyclically, whose prompt differs from its own, else the previous one (a run of one prompt).

    >>> kl_partners(["a", "b", "c", "d"], 4)
    [3, 0, 1, 2]
    >>> kl_partners(["a", "a", "b"], 3)
    [2, 2, 1]
    """
    n = len(prompts)
    starts = list(range(0, n, run))
    if len(starts) > 1 and n - starts[-1] == 1:
        starts.pop()
    out = []
    for s, start in enumerate(starts):
        end = starts[s + 1] if s + 1 < len(starts) else n
        size = end - start
        for k in range(size):
            earlier = [start + (k - d) % size for d in range(1, size)]
            out.append(next((j for j in earlier if prompts[j] != prompts[start + k]), earlier[0]))
    return out


class KTOTrainer(TrainerBase):
    kind = "kto"
    sequences_per_example = 2  # the example and its mismatched KL pair

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.skipped: list[dict[str, str]] = []
        self.reference: Any = None
        self.logged: dict[str, list[float | None]] = {"chosen_rewards": [], "rejected_rewards": [], "kl": []}

    def example_tokens(self, example: dict[str, Any]) -> int:
        if "input_ids" in example:
            return len(example["input_ids"])
        text = sum(len(str(m.get("content") or "")) for key in ("prompt", "completion") for m in as_messages(example[key]))
        return text // 4  # ≈ 4 chars per token; the KL pair is about as long

    def prepare(self, examples: list[dict[str, Any]], tokenizer: Any) -> list[dict[str, Any]]:
        rows, prompts = [], []
        for i, e in enumerate(examples):
            row_id = str(e.get("id", i))
            if not isinstance(e.get("label"), bool):
                raise ValueError(f"kto: example {row_id}: label is {e.get('label')!r}; it must be true (desirable) or "
                                 "false (undesirable), as binary_feedback writes it")
            prompt, completion = as_messages(e["prompt"]), as_messages(e["completion"])
            prompt_ids = encode_prompt(tokenizer, prompt)
            encoded = encode_completion(tokenizer, prompt, completion, self.config.max_seq_len, prompt_ids)
            if encoded is None:
                self.skipped.append({"id": row_id, "reason": "completion has no assistant tokens within max_seq_len"})
                continue
            ids, mask, prompt_len = encoded
            rows.append({"id": row_id, "label": e["label"], "seq": (ids, mask), "prompt_ids": prompt_ids,
                         "completion": (ids[prompt_len:], mask[prompt_len:])})
            prompts.append(json.dumps(prompt, sort_keys=True))
        if len(rows) < 2:
            raise ValueError(f"kto: {len(rows)} of {len(examples)} examples have trainable tokens "
                             f"(max_seq_len={self.config.max_seq_len}); the KL reference point needs at least 2 "
                             f"(first reasons: {self.skipped[:3]})")
        n = self.config.max_seq_len
        for row, j in zip(rows, kl_partners(prompts, self.config.batch_size), strict=True):
            # prompt tokens + the partner's completion tokens, as TRL concatenates them (the template closes
            # every turn, so a turn's tokens do not depend on what precedes them: encode_completion checks it);
            # a pair truncated to its prompt adds nothing to z0 (log-ratio 0 over no tokens)
            ids, mask = rows[j]["completion"]
            row["kl"] = ((row["prompt_ids"] + ids)[:n], ([0] * len(row["prompt_ids"]) + mask)[:n])
        return [{k: r[k] for k in ("id", "label", "seq", "kl")} for r in rows]

    def result_extra(self) -> dict[str, Any]:
        return {"skipped": list(self.skipped), **{k: list(v) for k, v in self.logged.items()}}

    def _tensors(self, seqs: list[tuple[list[int], list[int]]]) -> dict[str, Any]:
        from training_assets.trainers.modeling import pad_sequences  # torch: planning stays torch-free

        return pad_sequences(seqs, self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0)

    def _logps(self, model: Any, t: dict[str, Any]) -> Any:
        from training_assets.trainers.modeling import sequence_logps  # torch: planning stays torch-free

        return sequence_logps(model, t["input_ids"], t["attention_mask"], t["loss_mask"], self.config.kernel_backend)

    def before_loop(self, model: Any, rows: list[dict[str, Any]]) -> None:
        """Reference log-probs of every example and its KL pair, once (or set up the per-step reference)."""
        if not self.config.kto.precompute_ref_logps:
            self.reference = frozen_copy(model)
            return
        # one forward over both sequences of each row (2B): the examples first, then their KL pairs
        precompute_reference_logps(
            model, rows, self.config.batch_size,
            lambda m, chunk: self._logps(m, self._tensors([r["seq"] for r in chunk] + [r["kl"] for r in chunk])),
            ("ref", "ref_kl"), Path(self.config.output_dir) / REF_LOGPS_FILE)

    def collate(self, rows: list[dict[str, Any]], model: Any) -> dict[str, Any]:
        import torch  # torch: import-time stays torch-free

        batch = {"own": self._tensors([r["seq"] for r in rows]), "kl": self._tensors([r["kl"] for r in rows]),
                 "desirable": torch.tensor([r["label"] for r in rows], dtype=torch.bool)}
        if self.config.kto.precompute_ref_logps:
            batch["ref"] = torch.tensor([r["ref"] for r in rows], dtype=torch.float64)
            batch["ref_kl"] = torch.tensor([r["ref_kl"] for r in rows], dtype=torch.float64)
        batch["n_tokens"] = int(batch["own"]["attention_mask"].sum() + batch["kl"]["attention_mask"].sum())
        batch["weight"] = float(len(rows))
        return batch

    def _reference_logps(self, model: Any, batch: dict[str, Any]) -> tuple[Any, Any]:
        """(B,) reference log-probs of the examples and of their KL pairs, run now."""
        import torch  # torch: import-time stays torch-free

        with torch.inference_mode():
            if self.reference is not None:
                return self._logps(self.reference, batch["own"]).clone(), self._logps(self.reference, batch["kl"]).clone()
            with reference_context(model):  # clone: inference tensors cannot enter autograd
                return self._logps(model, batch["own"]).clone(), self._logps(model, batch["kl"]).clone()

    def loss(self, model: Any, batch: dict[str, Any]) -> tuple[Any, float]:
        import torch  # torch: import-time stays torch-free
        import torch.distributed as dist  # torch: as above

        from training_assets.trainers import objectives  # torch: planning stays torch-free

        spec = self.config.kto
        logps = self._logps(model, batch["own"])  # (B,)
        with torch.no_grad():  # as TRL: z0 is a constant of the step
            kl_logps = self._logps(model, batch["kl"])
        if spec.precompute_ref_logps:
            ref, ref_kl = (batch[k].to(logps.device, logps.dtype) for k in ("ref", "ref_kl"))
        else:
            ref, ref_kl = self._reference_logps(model, batch)
        z0 = objectives.kto_kl_estimate(kl_logps, ref_kl)
        if dist.is_available() and dist.is_initialized():  # TRL averages the per-rank estimates, then clamps
            dist.all_reduce(z0)
            z0 = z0 / dist.get_world_size()
        out = objectives.kto_loss(logps, ref, batch["desirable"].to(logps.device), z0, beta=spec.beta,
                                  desirable_weight=spec.desirable_weight, undesirable_weight=spec.undesirable_weight,
                                  backend=self.config.kernel_backend)
        for name, part in (("chosen_rewards", out.chosen_rewards), ("rejected_rewards", out.rejected_rewards)):
            self.logged[name].append(float(part.mean()) if part.numel() else None)  # None: no such example in the batch
        self.logged["kl"].append(float(out.kl))
        return out.loss, float(logps.shape[0])
