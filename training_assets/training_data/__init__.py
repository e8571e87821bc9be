"""Training data: the trace selection, SFT / DPO / GRPO datasets, packing and composite rewards
(pure, deterministic).

Builders take traces as plain dicts of the trace schema (or ``raw_traces`` rows, or ``Trace``
objects) and return a ``BuildResult`` (rows plus what was left out and why); ``open_dataset_rows`` maps a
dataset asset for the trainers (``DatasetRows``: rows on demand), the ``load_*`` loaders read one
back as a list of dicts; ``contributing_batches`` names the trace batches a
dataset's rows came from. Formats: ``docs/datasets.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from training_assets.dataset_rows import DatasetRows
from training_assets.training_data.common import BuildResult
from training_assets.training_data.io import (
    contributing_batches,
    dataset_path,
    load_grpo_groups,
    load_preference_pairs,
    load_pretrain_windows,
    load_sft_dataset,
    open_dataset_rows,
    read_dataset_info,
)
from training_assets.training_data.packing import PackedWindows, pack_sequences
from training_assets.training_data.rewards import (
    DEFAULT_REWARD_WEIGHTS,
    REWARD_COMPONENTS,
    RewardScores,
    answer_correctness_reward,
    compose_reward,
    length_penalty,
    score_reward,
    step_efficiency_reward,
    success_reward,
    tool_call_validity_reward,
)
from training_assets.training_data.sft import build_sft_examples

# The builders that group with polars load on first use: a trainer process (which only reads
# datasets) then never imports polars (23 MB of RSS and ~0.1 s of its start-up).
_LAZY = {
    "build_grpo_groups": "grpo", "filter_by_difficulty": "grpo", "group_advantages": "grpo",
    "build_preference_pairs": "preferences",
    "SelectionConfig": "selection", "load_selected_traces": "selection", "load_selection_decisions": "selection",
    "select_traces": "selection", "selection_version": "selection",
}

if TYPE_CHECKING:
    from training_assets.training_data.grpo import build_grpo_groups, filter_by_difficulty, group_advantages
    from training_assets.training_data.preferences import build_preference_pairs
    from training_assets.training_data.selection import (
        SelectionConfig,
        load_selected_traces,
        load_selection_decisions,
        select_traces,
        selection_version,
    )


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_REWARD_WEIGHTS", "REWARD_COMPONENTS", "BuildResult", "DatasetRows", "PackedWindows", "RewardScores", "SelectionConfig",
    "answer_correctness_reward", "build_grpo_groups", "build_preference_pairs", "build_sft_examples",
    "compose_reward", "contributing_batches", "dataset_path", "filter_by_difficulty", "group_advantages",
    "length_penalty", "load_grpo_groups", "load_preference_pairs", "load_pretrain_windows", "load_selected_traces",
    "load_selection_decisions", "load_sft_dataset", "open_dataset_rows", "pack_sequences", "read_dataset_info", "score_reward",
    "select_traces", "selection_version", "step_efficiency_reward", "success_reward", "tool_call_validity_reward",
]
