"""Preference pairs as token rows, shared by the trainers that read ``preference_pairs`` (DPO, ORPO).

    rows = encode_pairs("dpo", examples, tokenizer, config.max_seq_len, skipped)
    # [{"id", "chosen": (input_ids, loss_mask), "rejected": (input_ids, loss_mask)}, ...]

The prompt is encoded once for both sides; a pair whose chosen or rejected side has no assistant
token within ``max_seq_len`` is skipped with the reason (``skipped`` collects them), and a batch
with no trainable pair at all is refused in one line.
"""

from __future__ import annotations

from typing import Any

from training_assets.trainers.sft import as_messages, encode_completion, encode_prompt


def pair_tokens(example: dict[str, Any]) -> int:
    """A pair's token estimate before tokenising (the plan's): ≈ 4 chars per token, two sequences share the prompt."""
    if "chosen_input_ids" in example:
        return (len(example["chosen_input_ids"]) + len(example["rejected_input_ids"])) // 2
    text = sum(len(str(m.get("content") or "")) for key in ("prompt", "chosen", "rejected") for m in as_messages(example[key]))
    return text // 8


def encode_pairs(kind: str, examples: list[dict[str, Any]], tokenizer: Any, max_seq_len: int,
                 skipped: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Token rows of the pairs with trainable tokens on both sides; the others go to ``skipped`` with why."""
    rows = []
    for i, e in enumerate(examples):
        prompt = as_messages(e["prompt"])
        prompt_ids = encode_prompt(tokenizer, prompt)  # once for both sides
        chosen = encode_completion(tokenizer, prompt, as_messages(e["chosen"]), max_seq_len, prompt_ids)
        rejected = encode_completion(tokenizer, prompt, as_messages(e["rejected"]), max_seq_len, prompt_ids)
        if chosen is None or rejected is None:
            side = "chosen" if chosen is None else "rejected"
            skipped.append({"id": str(e.get("id", i)), "reason": f"{side} has no assistant tokens within max_seq_len"})
            continue
        rows.append({"id": str(e.get("id", i)), "chosen": chosen[:2], "rejected": rejected[:2]})
    if not rows:
        raise ValueError(f"{kind}: none of {len(examples)} pairs has trainable tokens on both sides "
                         f"(max_seq_len={max_seq_len}); first reasons: {skipped[:3]}")
    return rows
