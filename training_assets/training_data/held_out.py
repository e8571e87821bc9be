"""The held-out eval examples every dataset is checked against (the ``held_out_sets`` asset)."""

from __future__ import annotations

import os
from typing import Any

from training_assets.data_engine import load_held_out_sets
from training_assets.storage import fingerprint


def held_out_examples(root: str | os.PathLike[str] | None = None) -> list[Any]:
    """The ``held_out_sets`` examples (eval_set, example_id, text), via the data engine's loader."""
    return load_held_out_sets(root)


def held_out_version(root: str | os.PathLike[str] | None = None) -> str:
    """Content version of the held-out examples: changes whenever any example does."""
    return fingerprint([[e.eval_set, e.example_id, e.text] for e in held_out_examples(root)])
