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

from pathlib import Path
from typing import Any

from training_assets.trainers.base import TrainerBase
from training_assets.trainers.modeling_refs import frozen_copy, precompute_reference_logps, reference_context
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
        from training_assets.trainers.modeling import pad_sequences  # torch: planning stays torch-free

        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        return pad_sequences([r["chosen"] for r in rows] + [r["rejected"] for r in rows], pad_id)  # (2B): chosen first

    def before_loop(self, model: Any, rows: list[dict[str, Any]]) -> None:
        """Reference log-probs of every pair, once (or set up the per-step reference)."""
        from training_assets.trainers.modeling import sequence_logps  # torch: planning stays torch-free

        if not self.config.dpo.precompute_ref_logps:
            self.reference = frozen_copy(model)
            return

        def paired(m: Any, chunk: list[dict[str, Any]]) -> Any:
            t = self._pair_tensors(chunk)
            return sequence_logps(m, t["input_ids"], t["attention_mask"], t["loss_mask"], "torch")

        precompute_reference_logps(model, rows, self.config.batch_size, paired, ("ref_chosen", "ref_rejected"),
                                   Path(self.config.output_dir) / REF_LOGPS_FILE)

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
