"""The reference policy for DPO / KTO / GRPO without a second model in memory, and its log-probs computed once."""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def reference_context(model: Any) -> contextlib.AbstractContextManager:
    """Context where ``model`` computes the reference: adapters disabled for a PEFT model, else unchanged.

    For a LoRA policy the reference is the base model it was trained from, which is exactly the
    policy with its adapter switched off; a full-weight policy needs a frozen copy instead.
    """
    raw = getattr(model, "module", model)  # unwrap DDP
    if hasattr(raw, "disable_adapter"):
        return raw.disable_adapter()
    return contextlib.nullcontext()


def frozen_copy(model: Any) -> Any:
    """The per-step reference when log-probs are not precomputed: None for a PEFT policy (its adapter is
    switched off instead, ``reference_context``), else a frozen copy of the full-weight policy."""
    return None if hasattr(model, "peft_config") else copy.deepcopy(model).eval().requires_grad_(False)


def precompute_reference_logps(model: Any, rows: list[dict[str, Any]], batch_size: int,
                               paired_logps: Callable[[Any, list[dict[str, Any]]], Any], keys: Sequence[str],
                               path: Path) -> None:
    """Store the reference's two log-probs per row (``row[keys[0]]``, ``row[keys[1]]``) and write them to ``path``.

    ``paired_logps(model, chunk)`` returns (2B,) log-probs: the first sequences of the B rows, then their
    second ones (DPO: chosen, rejected; KTO: the example, its KL pair), run under ``reference_context``.
    """
    import torch  # torch: this module stays importable by planning without it

    was_training = model.training
    model.eval()
    with torch.inference_mode(), reference_context(model):
        for start in range(0, len(rows), batch_size):
            chunk = rows[start:start + batch_size]
            logps = paired_logps(model, chunk).cpu()
            for j, r in enumerate(chunk):
                r[keys[0]], r[keys[1]] = float(logps[j]), float(logps[len(chunk) + j])
    model.train(was_training)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({r["id"]: [r[keys[0]], r[keys[1]]] for r in rows}, indent=1, sort_keys=True))
