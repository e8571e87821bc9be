"""Pretraining from random init on fixed-length packed windows (``pretrain_windows``).

Rows carry ``input_ids``, ``position_ids`` (restarting at 0 per document), ``doc_ids`` (-1 =
padding) and ``labels`` (-100 where the loss must not cross a document or on padding), in the
Hugging Face convention: ``labels[t]`` is the target at position t, shifted inside the loss.
Attention is block-diagonal per document (``modeling.block_causal_mask``), so a packed row trains
exactly like its documents one by one.

A ``DatasetRows`` (the memory-mapped ``pretrain_windows``) is planned from its columns and each
micro-batch's windows are read when the loop reaches it (``LazyRows``).

``modeling`` (torch) is imported by ``collate`` and ``loss``: building and planning the trainer
imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from training_assets.dataset_rows import DatasetRows
from training_assets.trainers.base import Examples, LazyRows, TrainerBase


class PretrainTrainer(TrainerBase):
    kind = "pretrain"

    def example_tokens(self, example: dict[str, Any]) -> int:
        return sum(1 for d in example["doc_ids"] if d >= 0) if "doc_ids" in example else len(example["input_ids"])

    def example_lengths(self, examples: Examples) -> list[int] | np.ndarray:
        if not isinstance(examples, DatasetRows):
            return super().example_lengths(examples)
        if "doc_ids" not in examples.column_names:
            return examples.list_lengths("input_ids")
        counts = []
        for offsets, values in examples.list_chunks("doc_ids"):  # tokens with doc_ids >= 0, per window
            real = np.concatenate([[0], np.cumsum(values >= 0, dtype=np.int64)])
            counts.append(real[offsets[1:]] - real[offsets[:-1]])
        return np.concatenate(counts) if counts else np.zeros(0, np.int64)

    def prepare(self, examples: Examples, tokenizer: Any) -> list[dict[str, Any]] | LazyRows:
        if isinstance(examples, DatasetRows):
            return LazyRows(len(examples), lambda idx: self._windows(examples.take(idx), idx))
        return self._windows(examples, range(len(examples)))

    def _windows(self, examples: Sequence[dict[str, Any]], indices: Sequence[int]) -> list[dict[str, Any]]:
        """Training rows of ``examples`` (window ``indices[k]`` of the dataset each), cut to ``max_seq_len``."""
        rows = []
        for i, e in zip(indices, examples, strict=True):
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
        from training_assets.trainers.modeling import IGNORE_INDEX, pad_rows  # torch: planning stays torch-free

        batch = {"input_ids": pad_rows([r["input_ids"] for r in rows], 0),
                 "position_ids": pad_rows([r["position_ids"] for r in rows], 0),
                 "doc_ids": pad_rows([r["doc_ids"] for r in rows], -1),
                 "labels": pad_rows([r["labels"] for r in rows], IGNORE_INDEX)}
        batch["n_tokens"] = int((batch["doc_ids"] >= 0).sum())
        batch["weight"] = float((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
        return batch

    def loss(self, model: Any, batch: dict[str, Any]) -> tuple[Any, float]:
        from training_assets.trainers.modeling import shifted_ce  # torch: planning stays torch-free

        return shifted_ce(model, batch, self.config.kernel_backend)
