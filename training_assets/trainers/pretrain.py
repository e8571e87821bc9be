"""Pretraining from random init on fixed-length packed windows (``pretrain_windows``).

Rows carry ``input_ids``, ``position_ids`` (restarting at 0 per document), ``doc_ids`` (-1 =
padding) and ``labels`` (-100 where the loss must not cross a document or on padding), in the
Hugging Face convention: ``labels[t]`` is the target at position t, shifted inside the loss.
Attention is block-diagonal per document (``modeling.block_causal_mask``), so a packed row trains
exactly like its documents one by one.
"""

from __future__ import annotations

from typing import Any

from training_assets.trainers.base import TrainerBase


class PretrainTrainer(TrainerBase):
    kind = "pretrain"

    def example_tokens(self, example: dict[str, Any]) -> int:
        return sum(1 for d in example["doc_ids"] if d >= 0) if "doc_ids" in example else len(example["input_ids"])

    def prepare(self, examples: list[dict[str, Any]], tokenizer: Any) -> list[dict[str, Any]]:
        rows = []
        for i, e in enumerate(examples):
            ids = list(e["input_ids"])[: self.config.max_seq_len]
            n = len(ids)
            rows.append({"input_ids": ids,
                         "position_ids": list(e.get("position_ids") or range(n))[:n],
                         "doc_ids": list(e.get("doc_ids") or [0] * n)[:n],
                         "labels": list(e.get("labels") or ids)[:n]})
            if len(rows[-1]["position_ids"]) != n or len(rows[-1]["labels"]) != n:
                raise ValueError(f"pretrain window {i}: input_ids, position_ids, doc_ids, labels differ in length")
        return rows

    def collate(self, rows: list[dict[str, Any]], model: Any) -> dict[str, Any]:
        from training_assets.trainers.modeling import IGNORE_INDEX, pad_rows

        batch = {"input_ids": pad_rows([r["input_ids"] for r in rows], 0),
                 "position_ids": pad_rows([r["position_ids"] for r in rows], 0),
                 "doc_ids": pad_rows([r["doc_ids"] for r in rows], -1),
                 "labels": pad_rows([r["labels"] for r in rows], IGNORE_INDEX)}
        batch["n_tokens"] = int((batch["doc_ids"] >= 0).sum())
        batch["weight"] = float((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
        return batch

    def loss(self, model: Any, batch: dict[str, Any]) -> tuple[Any, float]:
        from training_assets.trainers.modeling import shifted_ce

        return shifted_ce(model, batch, self.config.kernel_backend)
