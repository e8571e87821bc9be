"""The training kinds: one row per kind, and every other layer reads its names from here.

    from training_assets.kinds import KINDS, kind_of_checkpoint
    KINDS["dpo"].dataset            # "preference_pairs"
    kind_of_checkpoint("grpo_checkpoint").tool   # "train_grpo"

A kind is the whole vertical slice of one way of training: the dataset asset it reads, the
checkpoint asset it writes and the one it starts from, the trainer class, its objective in
``trainers.objectives``, the eval report that gates it, the MCP tool and persona that run it, and
its CLI choice (``train KIND``, ``build-dataset KIND``). Dagster jobs, the launcher, the agent's
graph map and plans, the CLI choices and the tools are derived from this table, so adding a kind
is a row here plus its trainer, objective and dataset builder. Pure data: importing this module
imports nothing else of the package (every layer may read it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainingKind:
    """One kind of training and the names every layer knows it by."""

    name: str  # the CLI choice and TrainConfig-level kind: `train NAME`, `build-dataset NAME`
    dataset: str  # the dataset asset it trains on
    checkpoint: str  # the checkpoint asset it writes
    upstream: str | None  # the checkpoint asset it starts from (None: random init)
    trainer: str  # "module:Class" under training_assets.trainers, imported only when it trains
    objective: str  # the loss in training_assets.trainers.objectives
    gate: str | None  # the eval report asset whose blocking check gates this checkpoint (None: ungated)
    tool: str  # the MCP tool that plans / runs it
    persona: str  # the persona that owns the tool
    summary: str  # one line for help texts and tool descriptions
    spec: str | None  # the TrainConfig field holding this kind's own options (TrainConfig.dpo, ...), if any
    adapter: bool  # trained as a LoRA adapter on its upstream by default
    merged: bool = False  # one of the adapters TIES-merged into merged_adapter (the merge waits for its gate)


KINDS: dict[str, TrainingKind] = {k.name: k for k in (
    TrainingKind("pretrain", "pretrain_windows", "base_checkpoint", None, "pretrain:PretrainTrainer", "cross_entropy",
                 None, "pretrain_model", "training_engineer",
                 "a random-init decoder pretrained on packed corpus windows", spec="pretrain", adapter=False),
    TrainingKind("sft", "sft_dataset", "sft_checkpoint", "base_checkpoint", "sft:SFTTrainer", "cross_entropy",
                 "sft_eval_report", "train_sft", "training_engineer",
                 "supervised fine-tuning on successful traces (assistant-only loss, packed)", spec=None, adapter=False),
    TrainingKind("dpo", "preference_pairs", "dpo_checkpoint", "sft_checkpoint", "dpo:DPOTrainer", "dpo_loss",
                 "dpo_eval_report", "train_dpo", "training_engineer",
                 "direct preference optimisation on success/failure pairs of one task", spec="dpo", adapter=True, merged=True),
    TrainingKind("grpo", "grpo_groups", "grpo_checkpoint", "sft_checkpoint", "grpo:GRPOTrainer", "grpo_surrogate",
                 "grpo_eval_report", "train_grpo", "training_engineer",
                 "group relative policy optimisation with the composite task reward", spec="grpo", adapter=True, merged=True),
    TrainingKind("kto", "binary_feedback", "kto_checkpoint", "sft_checkpoint", "kto:KTOTrainer", "kto_loss",
                 "kto_eval_report", "train_kto", "training_engineer",
                 "Kahneman-Tversky optimisation on every trace alone, desirable when it succeeded", spec="kto", adapter=True),
    TrainingKind("orpo", "preference_pairs", "orpo_checkpoint", "base_checkpoint", "orpo:ORPOTrainer", "orpo_loss",
                 "orpo_eval_report", "train_orpo", "training_engineer",
                 "odds-ratio preference optimisation: SFT and preference in one stage, no reference model",
                 spec="orpo", adapter=False),
)}
KIND_NAMES: tuple[str, ...] = tuple(KINDS)
CHECKPOINTS: tuple[str, ...] = tuple(k.checkpoint for k in KINDS.values())
DATASETS: tuple[str, ...] = tuple(dict.fromkeys(k.dataset for k in KINDS.values()))  # each once
# the adapters TIES-merged into merged_adapter (each gated by its own report first)
MERGED_KINDS: tuple[str, ...] = tuple(k.name for k in KINDS.values() if k.merged)


def _index(attr: str) -> dict[str, TrainingKind]:
    """value of ``attr`` -> the first kind with it (two kinds may share a dataset: dpo and orpo read preference pairs)."""
    out: dict[str, TrainingKind] = {}
    for k in KINDS.values():
        out.setdefault(getattr(k, attr), k)
    return out


_BY_CHECKPOINT, _BY_DATASET, _BY_TOOL = _index("checkpoint"), _index("dataset"), _index("tool")


def _lookup(table: dict[str, TrainingKind], key: str, what: str) -> TrainingKind:
    try:
        return table[key]
    except KeyError:
        raise ValueError(f"{key!r} is not a training {what}; choose one of {sorted(table)}") from None


def kind(name: str) -> TrainingKind:
    """The kind named ``name`` (``ValueError`` listing the kinds otherwise)."""
    return _lookup(KINDS, name, "kind")


def kind_of_checkpoint(asset: str) -> TrainingKind:
    return _lookup(_BY_CHECKPOINT, asset, "checkpoint asset")


def kind_of_dataset(asset: str) -> TrainingKind:
    return _lookup(_BY_DATASET, asset, "dataset asset")


def kind_of_tool(tool: str) -> TrainingKind:
    return _lookup(_BY_TOOL, tool, "tool")


def is_checkpoint(asset: str) -> bool:
    return asset in _BY_CHECKPOINT
