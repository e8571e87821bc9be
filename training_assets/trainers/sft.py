"""Supervised fine-tuning with assistant-only loss, optionally packed.

Examples are ``sft_dataset`` rows (``input_ids`` + ``assistant_mask``, 1 = trained on) or raw
``{"messages": [...]}`` which are tokenised with the tokenizer's chat template
(``return_assistant_tokens_mask=True``: the template's ``{% generation %}`` blocks). Only
assistant tokens carry a label; prompts, tool results and padding are -100.

Packing (``TrainConfig.packing``) fills rows of ``max_seq_len`` greedily in dataset order; each
example keeps its own position ids (restarting at 0) and a block-diagonal attention mask, so
packing changes speed (no pad tokens), not the loss.

A ``DatasetRows`` (the memory-mapped ``sft_dataset``) is planned from its columns and prepared a
micro-batch at a time (``LazyRows``): packing groups come from the ``input_ids`` list lengths, and
each micro-batch reads only its examples. The rows, groups and losses equal the list path's.

Shared prefixes (``TrainConfig.share_prefixes``, on by default, unpacked rows): rows of a
micro-batch that begin with the same tokens — the system turn with its tool schemas, 240 to 990
of a loop conversation's 330 to 1,240 tokens — have that prefix computed once per group
(``shared_prefixes``) and its keys and values reused by each row, which then runs only its own
suffix; the gradient reaches the prefix through every row that used it. Exact (the same loss and
gradients as the full rows, to float rounding: tested), and only where no prefix position carries
a label. Off with packing, with gradient checkpointing (which runs without a cache) and in
distributed runs (a wrapped model would run two forwards per backward: not tested there).

``modeling`` (torch) is imported by ``collate`` and ``loss``: building and planning an SFT trainer
imports no torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from training_assets.dataset_rows import DatasetRows
from training_assets.trainers.base import Examples, LazyRows, TrainerBase, as_examples
from training_assets.trainers.plan import Plan, make_plan


MIN_SHARED_PREFIX = 32  # tokens: below this a separate prefix forward costs more than it saves


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    x, y = np.asarray(a[:n]), np.asarray(b[:n])
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


def shared_prefixes(ids: Sequence[Sequence[int]], labels: Sequence[Sequence[int]],
                    min_shared: int = MIN_SHARED_PREFIX) -> tuple[list[tuple[int, int]], list[int]] | None:
    """Groups of rows that start with the same tokens: ``([(representative row, prefix length), ...],
    group of each row (-1: none))``, or None when no two rows share ``min_shared`` tokens. A row that
    shares with none is a group of its own, so every suffix stays short.

    A row's prefix never reaches a labelled token (positions ``0..P-1`` predict tokens ``1..P``, all
    -100) and leaves at least one token to run. In row order (deterministic), a row joins the group
    where that computes the fewest tokens: sharing ``l`` tokens with a group of ``m`` rows whose
    prefix is ``P`` saves ``l`` for the row but costs ``m * (P - l)`` for the members (the prefix
    shrinks to what all share), so a calculator row does not pull the list tools' 990-token system
    turn down to the 60 tokens both begin with; otherwise it starts a group of its own.
    """
    caps = []
    for row, lab in zip(ids, labels):
        labelled = np.flatnonzero(np.asarray(lab[1:]) != -100)
        first = int(labelled[0]) + 1 if labelled.size else len(row)
        caps.append(max(0, min(len(row) - 1, first - 1)))
    groups: list[list[int]] = []  # [representative, prefix length, members]
    members: list[list[int]] = []
    for i, row in enumerate(ids):
        best, best_len, best_gain = -1, 0, 0
        for g, (rep, length) in enumerate(groups):
            shared = _common_prefix(ids[rep], row, min(length, caps[i]))
            gain = shared - len(members[g]) * (length - shared)
            if shared >= min_shared and gain > best_gain:
                best, best_len, best_gain = g, shared, gain
        if best >= 0:
            groups[best][1] = best_len
            members[best].append(i)
        else:
            groups.append([i, caps[i]])
            members.append([i])
    if all(len(m) == 1 for m in members):
        return None
    # a row alone keeps its own prefix too (no tokens saved, none lost): else the suffix batch would be
    # padded to its whole length (one 1,100-token list conversation among seven shorter ones: 8 x 1,100)
    shared_groups = [g for g in range(len(groups)) if groups[g][1] >= min_shared]
    row_group = [-1] * len(ids)
    for new, g in enumerate(shared_groups):
        for i in members[g]:
            row_group[i] = new
    return [(groups[g][0], groups[g][1]) for g in shared_groups], row_group


def pack_bounds(lengths: Sequence[int], max_len: int) -> list[int]:
    """Greedy first-fit in order: packed row r holds examples ``bounds[r]:bounds[r + 1]`` (pure, used by plan too)."""
    bounds: list[int] = []
    used = 0
    for i, n in enumerate(lengths):
        n = min(n, max_len)
        if not bounds or used + n > max_len:
            bounds.append(i)
            used = 0
        used += n
    return [*bounds, len(lengths)] if bounds else [0]


def encode_messages(tokenizer: Any, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """``(input_ids, assistant_mask)`` through the chat template's generation markers."""
    out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
    if not any(mask):
        raise ValueError("chat template marked no assistant tokens: it needs {% generation %} blocks "
                         "(the project tokenizer has them; see tokenizer_trainer)")
    return ids, mask


def encode_prompt(tokenizer: Any, prompt: list[dict[str, Any]]) -> list[int]:
    """The prompt messages' own tokenisation (no generation prompt): the prefix ``encode_completion`` checks."""
    return list(tokenizer.apply_chat_template(prompt, tokenize=True, return_dict=True)["input_ids"]) if prompt else []


def encode_completion(tokenizer: Any, prompt: list[dict[str, Any]], completion: list[dict[str, Any]],
                      max_len: int, prompt_ids: list[int] | None = None) -> tuple[list[int], list[int], int] | None:
    """``(input_ids, completion_mask, prompt_len)`` for prompt + completion messages, or None if nothing to train.

    The completion mask is the template's assistant mask restricted to tokens after the prompt
    (tool results inside the completion are not trained on). The prompt's own tokenisation must
    be a prefix of the full one — true for templates that close every turn with a special token.
    ``prompt_ids``: ``encode_prompt(tokenizer, prompt)`` when the caller has it already (DPO's two
    sides, a GRPO group's attempts share one prompt).
    """
    if prompt_ids is None:
        prompt_ids = encode_prompt(tokenizer, prompt)
    ids, mask = encode_messages(tokenizer, list(prompt) + list(completion))
    if ids[: len(prompt_ids)] != prompt_ids:
        raise ValueError("chat template tokenises the prompt differently inside the full conversation; "
                         "completion masks would be misaligned (use a template that ends each turn with a special token)")
    mask = [m if i >= len(prompt_ids) else 0 for i, m in enumerate(mask)]
    ids, mask = ids[:max_len], mask[:max_len]
    return (ids, mask, len(prompt_ids)) if any(mask) else None


class SFTTrainer(TrainerBase):
    kind = "sft"
    truncated = 0  # examples the last prepare cut to max_seq_len (_count_truncated)

    def example_tokens(self, example: dict[str, Any]) -> int:
        if "n_tokens" in example:
            return int(example["n_tokens"])
        if "input_ids" in example:
            return len(example["input_ids"])
        return sum(len(str(m.get("content") or "")) for m in _messages(example)) // 4  # rough: ~4 chars per token

    def example_lengths(self, examples: Examples) -> list[int] | np.ndarray:
        if isinstance(examples, DatasetRows):  # example_tokens' order of preference, from the columns
            if "n_tokens" in examples.column_names:
                return examples.column("n_tokens").astype(np.int64)
            if "input_ids" in examples.column_names:
                return examples.list_lengths("input_ids")
        return super().example_lengths(examples)

    def example_token_total(self, examples: Examples) -> int:
        if isinstance(examples, DatasetRows):
            if "n_tokens" in examples.column_names:
                return examples.column_sum("n_tokens")
            if "input_ids" in examples.column_names:
                return examples.list_total("input_ids")
        return super().example_token_total(examples)

    def plan(self, examples: Examples, world_size: int = 1) -> Plan:
        if not self.config.packing:
            return super().plan(examples, world_size)
        examples = as_examples(examples)
        lengths = [int(n) for n in self.example_lengths(examples)]
        bounds = pack_bounds(lengths, self.config.max_seq_len)
        vocab = len(self.tokenizer) if self.tokenizer is not None else None
        mean = sum(min(n, self.config.max_seq_len) for n in lengths) / max(len(bounds) - 1, 1)
        plan = make_plan(self.kind, self.config, len(bounds) - 1, mean, vocab, world_size)
        plan.notes.append(f"packing: {len(examples)} examples into {len(bounds) - 1} rows of ≤ {self.config.max_seq_len} tokens")
        return plan

    @staticmethod
    def _tokens(example: dict[str, Any], tokenizer: Any) -> tuple[list[int], list[int]]:
        if "input_ids" in example and "assistant_mask" in example:
            return list(example["input_ids"]), list(example["assistant_mask"])
        return encode_messages(tokenizer, _messages(example))

    def _row(self, ids: list[int], mask: list[int]) -> dict[str, list[int]]:
        ids, mask = ids[: self.config.max_seq_len], mask[: self.config.max_seq_len]
        return {"input_ids": ids, "labels": [t if m else -100 for t, m in zip(ids, mask)]}

    def _encode(self, example: dict[str, Any], tokenizer: Any) -> dict[str, list[int]]:
        return self._row(*self._tokens(example, tokenizer))

    def _count_truncated(self, lengths: Sequence[int] | np.ndarray) -> None:
        """Record how many examples ``_encode`` cuts to ``max_seq_len`` (``result_extra``'s ``truncated``)."""
        self.truncated = int((np.asarray(lengths, dtype=np.int64) > self.config.max_seq_len).sum())

    def result_extra(self) -> dict[str, Any]:
        # examples longer than max_seq_len lose their right end (TRL's max_length does the same); the count
        # shows in the checkpoint's manifest, and sft_dataset's max_tokens leaves such rows out up front
        return {"truncated": self.truncated}

    @staticmethod
    def _pack(encoded: list[dict[str, list[int]]]) -> dict[str, list[int]]:
        """One packed row: the examples end to end, positions restarting at 0, ``doc_ids`` 0, 1, ... per example."""
        row: dict[str, list[int]] = {"input_ids": [], "labels": [], "position_ids": [], "doc_ids": []}
        for doc, e in enumerate(encoded):
            n = len(e["input_ids"])
            row["input_ids"] += e["input_ids"]
            row["labels"] += e["labels"]
            row["position_ids"] += list(range(n))
            row["doc_ids"] += [doc] * n
        return row

    def prepare(self, examples: Examples, tokenizer: Any) -> list[dict[str, Any]] | LazyRows:
        if isinstance(examples, DatasetRows) and {"input_ids", "assistant_mask"} <= set(examples.column_names):
            return self._prepare_lazily(examples, tokenizer)
        tokens = [self._tokens(e, tokenizer) for e in examples]
        self._count_truncated([len(ids) for ids, _ in tokens])
        encoded = [self._row(ids, mask) for ids, mask in tokens]
        if not self.config.packing:
            return encoded
        bounds = pack_bounds([len(e["input_ids"]) for e in encoded], self.config.max_seq_len)
        return [self._pack(encoded[a:b]) for a, b in zip(bounds, bounds[1:])]

    def _prepare_lazily(self, examples: DatasetRows, tokenizer: Any) -> LazyRows:
        """Rows (or packed rows) made per micro-batch from the mapped examples: equal to ``prepare`` of the list."""
        lengths = examples.list_lengths("input_ids")
        self._count_truncated(lengths)
        if not self.config.packing:
            return LazyRows(len(examples), lambda idx: [self._encode(e, tokenizer) for e in examples.take(idx)])
        bounds = pack_bounds(lengths.tolist(), self.config.max_seq_len)

        def make(indices: Sequence[int]) -> list[dict[str, Any]]:
            spans = [(bounds[r], bounds[r + 1]) for r in indices]
            encoded = [self._encode(e, tokenizer) for e in examples.take([i for a, b in spans for i in range(a, b)])]
            out, at = [], 0
            for a, b in spans:
                out.append(self._pack(encoded[at:at + b - a]))
                at += b - a
            return out

        return LazyRows(len(bounds) - 1, make)

    def collate(self, rows: list[dict[str, Any]], model: Any) -> dict[str, Any]:
        from training_assets.trainers.modeling import (  # torch: planning stays torch-free
            IGNORE_INDEX,
            ones_mask,
            pad_rows,
            prefix_batch,
        )

        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        batch: dict[str, Any] = {"input_ids": pad_rows([r["input_ids"] for r in rows], pad_id),
                                 "labels": pad_rows([r["labels"] for r in rows], IGNORE_INDEX)}
        if self.config.packing:
            batch["position_ids"] = pad_rows([r["position_ids"] for r in rows], 0)
            batch["doc_ids"] = pad_rows([r["doc_ids"] for r in rows], -1)
            batch["n_tokens"] = int((batch["doc_ids"] >= 0).sum())
        else:
            batch["attention_mask"] = ones_mask([len(r["input_ids"]) for r in rows], batch["input_ids"].shape[1])
            batch["n_tokens"] = int(batch["attention_mask"].sum())
            # one process only: a DDP/FSDP/DeepSpeed-wrapped model would run two forwards per backward
            if self.config.share_prefixes and not self.config.gradient_checkpointing and self.config.distributed == "none":
                shared = shared_prefixes([r["input_ids"] for r in rows], [r["labels"] for r in rows])
                if shared is not None:
                    batch["shared"] = prefix_batch(rows, *shared, pad_id)
        batch["weight"] = float((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
        return batch

    def loss(self, model: Any, batch: dict[str, Any]) -> tuple[Any, float]:
        from training_assets.trainers.modeling import shared_prefix_ce, shifted_ce  # torch: planning stays torch-free

        if "shared" in batch:
            return shared_prefix_ce(model, batch, self.config.kernel_backend)
        return shifted_ce(model, batch, self.config.kernel_backend)


def _messages(example: dict[str, Any]) -> list[dict[str, Any]]:
    return as_messages(example["messages"])


def as_messages(value: Any) -> list[dict[str, Any]]:
    """Messages from JSON text or a list; plain text becomes one assistant turn."""
    if isinstance(value, str):
        stripped = value.lstrip()
        if stripped.startswith("["):
            return json.loads(stripped)
        return [{"role": "assistant", "content": value}]
    return [dict(m) for m in value]
