"""Add special / functional tokens to an existing tokenizer and grow a model's embeddings to match.

    reg = register_tokens(tokenizer, ["<|tool_call|>", "<|/tool_call|>"], model=model)

New embedding rows (input and, when untied, output) start at the mean of the old rows: a new
token then begins as an "average" token instead of a random vector whose norm can dominate the
logits (Hewitt 2021, "Initializing New Word Embeddings for Pretrained Language Models").
Idempotent: a second call with the same tokens adds nothing and leaves the model untouched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from training_assets.tokenizer_trainer import SPECIAL_TOKENS


@dataclass(frozen=True)
class TokenRegistration:
    """What ``register_tokens`` did, and why."""

    added: list[str]  # tokens new to the tokenizer, in id order
    already_present: list[str]
    vocab_before: int
    vocab_after: int
    embedding_rows_before: int | None  # None when no model was given
    embedding_rows_after: int | None
    reason: str


def _grow_embeddings(model: Any, n_rows: int) -> tuple[int, int]:
    """Resize ``model``'s embeddings to ``n_rows`` (never shrinks), new rows = mean of the old ones."""
    import torch  # the train extra: ~2 s, only when embeddings grow

    inputs = model.get_input_embeddings()
    before = int(inputs.weight.shape[0])
    if before >= n_rows:
        return before, before  # already large enough (models often pad the vocab to a multiple of 64)
    outputs = model.get_output_embeddings()
    tied = outputs is None or outputs.weight.data_ptr() == inputs.weight.data_ptr()
    with torch.no_grad():
        input_mean = inputs.weight[:before].mean(dim=0)  # (hidden,)
        output_mean = None if tied else outputs.weight[:before].mean(dim=0)
    model.resize_token_embeddings(n_rows, mean_resizing=False)
    with torch.no_grad():
        model.get_input_embeddings().weight[before:] = input_mean
        if output_mean is not None:
            model.get_output_embeddings().weight[before:] = output_mean
    return before, n_rows


def register_tokens(
    tokenizer: Any,
    tokens: Sequence[str] = SPECIAL_TOKENS,
    model: Any = None,
    special_tokens_map: Mapping[str, str] | None = None,
) -> TokenRegistration:
    """Make every token in ``tokens`` a single, never-split special token of ``tokenizer``.

    ``special_tokens_map`` (e.g. ``{"pad_token": "<|pad|>"}``) assigns roles to tokens (which
    are registered first if new). With a ``model``, its embeddings grow to ``len(tokenizer)``
    (mean-initialised); a model already that large is left alone.
    """
    roles = dict(special_tokens_map or {})
    wanted = list(dict.fromkeys([*tokens, *roles.values()]))
    vocab = tokenizer.get_vocab()
    present = [t for t in wanted if t in vocab]
    new = [t for t in wanted if t not in vocab]
    before = len(tokenizer)
    if new:
        tokenizer.add_tokens(new, special_tokens=True)
    for role, token in sorted(roles.items()):
        if getattr(tokenizer, role, None) != token:
            setattr(tokenizer, role, token)
    rows_before = rows_after = None
    if model is not None:
        rows_before, rows_after = _grow_embeddings(model, len(tokenizer))
    parts = [f"added {len(new)} token(s)" if new else "all tokens already present"]
    if model is not None:
        parts.append(f"embeddings {rows_before} -> {rows_after} rows (new rows = mean of old)"
                     if rows_after != rows_before else f"embeddings already hold {rows_before} rows")
    return TokenRegistration(
        added=sorted(new, key=tokenizer.convert_tokens_to_ids), already_present=present,
        vocab_before=before, vocab_after=len(tokenizer),
        embedding_rows_before=rows_before, embedding_rows_after=rows_after, reason="; ".join(parts),
    )
