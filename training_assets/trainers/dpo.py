"""Direct Preference Optimisation (Rafailov et al. 2023, https://arxiv.org/abs/2305.18290).

Examples are ``preference_pairs`` rows: ``prompt`` (shared messages), ``chosen`` and ``rejected``
(continuations). Each side is encoded as prompt + continuation; only the continuation's
assistant tokens count in the sequence log-prob. One forward runs chosen and rejected together
(2B rows). The loss is ``objectives.dpo_loss`` (sigmoid / IPO / hinge, label smoothing).

The reference is the policy at the start of training. By default its log-probs are computed
once before the first step (``DpoSpec.precompute_ref_logps``) and saved next to the checkpoints
(``ref_logps.json``), so no second model stays in memory; otherwise the reference runs every
step — for a LoRA policy that is the same model with the adapter disabled, for a full policy a
frozen copy.

torch, ``modeling`` and ``objectives`` (both import torch) are imported by the methods that run
tensors: building and planning the trainer imports no torch.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from training_assets.trainers.base import TrainerBase
from training_assets.trainers.modeling_refs import reference_context
from training_assets.trainers.pairs import encode_pairs, pair_tokens

REF_LOGPS_FILE = "ref_logps.json"


class DPOTrainer(TrainerBase):
    kind = "dpo"
    sequences_per_example = 2

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.skipped: list[dict[str, str]] = []
        self.reference: Any = None

    def example_tokens(self, example: dict[str, Any]) -> int:
        return pair_tokens(example)

    def prepare(self, examples: list[dict[str, Any]], tokenizer: Any) -> list[dict[str, Any]]:
        return encode_pairs("dpo", examples, tokenizer, self.config.max_seq_len, self.skipped)

    def result_extra(self) -> dict[str, Any]:
        return {"skipped": list(self.skipped)}

    def _pair_tensors(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        from training_assets.trainers.modeling import ones_mask, pad_rows  # torch: planning stays torch-free

        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        seqs = [r["chosen"] for r in rows] + [r["rejected"] for r in rows]  # (2B): chosen first
        ids = pad_rows([s[0] for s in seqs], pad_id)
        return {"input_ids": ids, "attention_mask": ones_mask([len(s[0]) for s in seqs], ids.shape[1]),
                "loss_mask": pad_rows([s[1] for s in seqs], 0)}

    def before_loop(self, model: Any, rows: list[dict[str, Any]]) -> None:
        """Reference log-probs of every pair, once (or set up the per-step reference)."""
        import torch  # torch: import-time stays torch-free

        from training_assets.trainers.modeling import sequence_logps  # torch: planning stays torch-free

        if not self.config.dpo.precompute_ref_logps:
            if not hasattr(model, "peft_config"):
                self.reference = copy.deepcopy(model).eval().requires_grad_(False)
            return
        was_training = model.training
        model.eval()
        with torch.inference_mode(), reference_context(model):
            for start in range(0, len(rows), self.config.batch_size):
                chunk = rows[start:start + self.config.batch_size]
                t = self._pair_tensors(chunk)
                logps = sequence_logps(model, t["input_ids"], t["attention_mask"], t["loss_mask"], "torch").cpu()
                for j, r in enumerate(chunk):
                    r["ref_chosen"], r["ref_rejected"] = float(logps[j]), float(logps[len(chunk) + j])
        model.train(was_training)
        out = Path(self.config.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / REF_LOGPS_FILE).write_text(json.dumps(
            {r["id"]: [r["ref_chosen"], r["ref_rejected"]] for r in rows}, indent=1, sort_keys=True))

    def collate(self, rows: list[dict[str, Any]], model: Any) -> dict[str, Any]:
        import torch  # torch: import-time stays torch-free

        batch = self._pair_tensors(rows)
        if self.config.dpo.precompute_ref_logps:
            batch["ref_chosen"] = torch.tensor([r["ref_chosen"] for r in rows], dtype=torch.float64)
            batch["ref_rejected"] = torch.tensor([r["ref_rejected"] for r in rows], dtype=torch.float64)
        batch["n_tokens"] = int(batch["attention_mask"].sum())
        batch["weight"] = float(len(rows))
        return batch

    def loss(self, model: Any, batch: dict[str, Any]) -> tuple[Any, float]:
        import torch  # torch: import-time stays torch-free

        from training_assets.trainers import objectives  # torch: planning stays torch-free
        from training_assets.trainers.modeling import sequence_logps  # torch: planning stays torch-free

        backend = self.config.kernel_backend
        logps = sequence_logps(model, batch["input_ids"], batch["attention_mask"], batch["loss_mask"], backend)
        B = logps.shape[0] // 2
        if self.config.dpo.precompute_ref_logps:
            ref_c = batch["ref_chosen"].to(logps.device, logps.dtype)
            ref_r = batch["ref_rejected"].to(logps.device, logps.dtype)
        else:
            with torch.inference_mode():
                if self.reference is not None:
                    ref = sequence_logps(self.reference, batch["input_ids"], batch["attention_mask"], batch["loss_mask"], backend)
                else:
                    with reference_context(model):
                        ref = sequence_logps(model, batch["input_ids"], batch["attention_mask"], batch["loss_mask"], backend)
            ref = ref.clone()  # a normal tensor: inference tensors cannot enter autograd
            ref_c, ref_r = ref[:B], ref[B:]
        loss = objectives.dpo_loss(logps[:B], logps[B:], ref_c, ref_r, beta=self.config.dpo.beta,
                                   label_smoothing=self.config.dpo.label_smoothing, loss_type=self.config.dpo.loss_type,
                                   backend=backend)
        return loss, float(B)
