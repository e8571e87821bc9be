"""The reference policy for DPO / GRPO without a second model in memory."""

from __future__ import annotations

import contextlib
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
