"""The one place that maps a tool's ``config`` onto the asset graph: which assets a tool
materialises, which of their Dagster config fields it may set, and the Dagster run config.

    target = tool_target("train_sft")                          # ("sft_checkpoint",)
    run_config = to_run_config("train_sft", {"max_steps": 4, "lora": {"r": 8}}, graph)
    # {"sft_checkpoint": {"max_steps": 4, "lora": {"r": 8}}}   (per asset, TrainConfig's own spelling)

Field names and defaults come from the Definitions (``graph`` is ``describe_graph()``): a field
an asset's ``dg.Config`` gains is accepted without touching this module. What is hand-kept here
is only what the graph cannot say: the tool → asset table (its training rows from
``training_assets.kinds``), the subsets of ``curated_corpus`` that ``dedup_corpus`` /
``decontaminate_corpus`` own, the TrainConfig fields the graph itself decides (the base model, where a run writes), and
the config fields that name a file or a host (``REACH_FIELDS``), which ``check_reach`` holds to the
operator's allow-lists (``paths.confine_path`` / ``confine_ray_address``) before anything runs.
"""

from __future__ import annotations

import difflib
import glob
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from training_assets import kinds, paths
from training_assets.agent.errors import AgentError, ToolInputError

# tool -> the assets its config may set, in order (the last one is the tool's target)
TOOL_ASSETS: dict[str, tuple[str, ...]] = {
    "curate_corpus": ("held_out_sets", "curated_corpus"),
    "dedup_corpus": ("curated_corpus",),
    "decontaminate_corpus": ("held_out_sets", "curated_corpus"),
    "train_tokenizer": ("tokenizer",),
    "compose_reward": ("grpo_groups",),
    **{k.tool: (k.checkpoint,) for k in kinds.KINDS.values()},  # one training tool per kind
    "merge_adapters_ties": ("merged_adapter",),
    "register_model": ("registry_entry",),
}
DATASET_KINDS = {k.name: k.dataset for k in kinds.KINDS.values()}
EVAL_REPORTS = {**{k.checkpoint: k.gate for k in kinds.KINDS.values() if k.gate}, "merged_adapter": "merged_eval_report"}
TRAINING_TOOLS = {k.tool: k.checkpoint for k in kinds.KINDS.values()}
CHECKPOINT_ASSETS = set(kinds.CHECKPOINTS)

# Parts of curated_corpus's config that belong to one tool (the rest belongs to curate_corpus).
FIELD_SUBSETS: dict[str, dict[str, set[str]]] = {
    "dedup_corpus": {"curated_corpus": {"method", "threshold", "min_dedup_rate", "max_dedup_rate"}},
    "decontaminate_corpus": {"held_out_sets": {"paths", "fields"},
                             "curated_corpus": {"decontam_ngram", "decontam_min_ngram"}},
    "compose_reward": {"grpo_groups": {"reward_weights", "scale_rewards"}},
}
# Config fields that name what a run reads or connects to: glob patterns, files, a Ray cluster.
REACH_FIELDS: dict[str, Literal["glob", "file", "host"]] = {
    "paths": "glob",  # held_out_sets
    "extra_sources": "file",  # curated_corpus
    "cases_path": "file",  # the eval reports ("" = the shipped suite)
    "ray_address": "host",  # curated_corpus (None = $RAY_ADDRESS)
}
GLOB_MAGIC = re.compile(r"[*?[]")
# TrainConfig fields the asset graph decides for a checkpoint asset, and why
GRAPH_OWNED = {
    "base_model": "the checkpoint asset trains from its upstream checkpoint (sft <- base_checkpoint, dpo/grpo <- sft_checkpoint)",
    "tokenizer": "the tokenizer asset is used",
    "output_dir": "each checkpoint asset writes under <data root>/<asset>/runs/",
    "resume_from": "a re-run with the same inputs resumes automatically",
    "tracker": "MLflow tracking is set by the asset", "tracking_uri": "MLflow tracking is set by the asset",
    "run_name": "set by the asset", "tracker_tags": "set by the asset (the Dagster run id)",
    "packing": "sft_checkpoint always packs",
}


def tool_target(tool: str, kind: str | None = None, checkpoint: str | None = None) -> tuple[str, ...]:
    """The assets whose config a tool sets; the last is what it materialises."""
    if tool == "build_training_dataset":
        return (DATASET_KINDS[kind or ""],)
    if tool == "evaluate_checkpoint":
        return (EVAL_REPORTS[checkpoint or ""],)
    return TOOL_ASSETS[tool]


def _train_config_names() -> set[str]:
    from training_assets.trainers import TrainConfig  # pyarrow: ~0.3 s, the server builds without it

    return set(TrainConfig.model_fields)


def accepted_fields(tool: str, assets: tuple[str, ...], graph: Mapping[str, Any]) -> dict[str, str]:
    """field -> the asset it configures, for the config a tool takes."""
    subsets = FIELD_SUBSETS.get(tool)
    accepted: dict[str, str] = {}
    for asset in assets:
        names = set(graph[asset]["config"])
        if subsets is not None:
            names &= subsets.get(asset, set())
        for name in names:
            accepted.setdefault(name, asset)
    return accepted


def to_run_config(tool: str, config: Mapping[str, Any] | None, graph: Mapping[str, Any],
                  assets: tuple[str, ...] | None = None) -> dict[str, dict[str, Any]]:
    """Per-asset Dagster config values for a tool's ``config``; raises ToolInputError naming the field."""
    assets = assets or tool_target(tool)
    flat = dict(config or {})
    accepted = accepted_fields(tool, assets, graph)
    training = tool in TRAINING_TOOLS
    out: dict[str, dict[str, Any]] = {a: {} for a in assets}
    for name, value in flat.items():
        if name not in accepted:
            raise ToolInputError(f"config.{name}", unknown_field_reason(tool, name, accepted, assets[-1]))
        out[accepted[name]][name] = value
    return {a: v for a, v in out.items() if v}


def unknown_field_reason(tool: str, name: str, accepted: Iterable[str], target: str | None = None) -> str:
    """Why ``tool``'s config refuses field ``name``, and the fix (a graph-owned field, a close name, the list)."""
    accepted = sorted(accepted)
    if tool in TRAINING_TOOLS and name in GRAPH_OWNED:
        return f"set by the asset graph ({GRAPH_OWNED[name]}); remove it"
    if tool in TRAINING_TOOLS and name in _train_config_names():
        return f"a TrainConfig field that {target or TRAINING_TOOLS[tool]} does not expose; it takes {accepted}"
    closest = _closest(name, dict.fromkeys(accepted))
    hint = f"; did you mean {closest}?" if closest else ""
    return f"unknown field for {tool}{hint} (accepted: {accepted})"


def asset_run_config(asset: str, config: Mapping[str, Any] | None, graph: Mapping[str, Any],
                     where: str) -> dict[str, Any]:
    """One asset's Dagster config values from fields in its own or TrainConfig spelling (workflow tasks)."""
    if not isinstance(config, Mapping):
        raise ToolInputError(where, "an object of config fields")
    flat = dict(config)
    accepted = graph[asset]["config"]
    for name in flat:
        if name in accepted:
            continue
        if name in GRAPH_OWNED and asset in CHECKPOINT_ASSETS:
            raise ToolInputError(f"{where}.{name}", f"set by the asset graph ({GRAPH_OWNED[name]}); remove it")
        hint = f"; did you mean {_closest(name, accepted)}?" if _closest(name, accepted) else ""
        raise ToolInputError(f"{where}.{name}", f"unknown field for {asset}{hint} (accepted: {sorted(accepted)})")
    return flat


def _closest(name: str, options: Mapping[str, Any]) -> str | None:
    match = difflib.get_close_matches(name, list(options), n=1, cutoff=0.75)
    return match[0] if match else None


def dagster_run_config(per_asset: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Dagster's run config shape: each asset's op is named after its key."""
    return {"ops": {asset: {"config": dict(values)} for asset, values in per_asset.items() if values}}


def effective_config(asset: str, values: Mapping[str, Any], graph: Mapping[str, Any]) -> dict[str, Any]:
    """The asset's config as it will run: its defaults from the Definitions, overridden by ``values``."""
    defaults = {name: spec["default"] for name, spec in graph[asset]["config"].items()}
    return {**defaults, **values}


def train_config_fields(asset: str, effective: Mapping[str, Any]) -> dict[str, Any]:
    """The TrainConfig fields a checkpoint asset's run config means, exactly as the asset builds them
    (``defs.training.config.overrides``: nested lora and kind specs as TrainConfig takes them)."""
    from training_assets.defs.training.config import overrides  # dagster: the server lists tools without it
    from training_assets.orchestration.catalog import config_class  # dagster and the Definitions: seconds, only to plan
    from training_assets.trainers import TrainConfig  # pyarrow: ~0.3 s, the server builds without it

    fields = overrides(config_class(asset)(**effective))
    try:  # the library's model is the one that knows the nested fields (lora.r, dpo.beta, ...)
        TrainConfig(**fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise ToolInputError("config." + ".".join(map(str, error["loc"])), error["msg"]) from None
    return fields


def _glob_reach(pattern: str) -> list[str]:
    """What a glob pattern can open: its literal folder (the parts before the first wildcard) and
    every file it matches now (a match may be a symlink pointing elsewhere)."""
    parts = Path(pattern).parts
    fixed = next((i for i, part in enumerate(parts) if GLOB_MAGIC.search(part)), len(parts))
    base = str(Path(*parts[:fixed])) if fixed else "."
    return [base, *sorted(glob.glob(pattern))]


def check_reach(values: Mapping[str, Any], where: str) -> None:
    """Refuse a config value (``REACH_FIELDS``) that reaches a file outside the data root and the
    allowed source folders, or a Ray cluster on a host not allowed; ``where`` prefixes the field
    (``config``, ``task.config.held_out_sets``). Values of the wrong type are left to validation."""
    for name, kind in REACH_FIELDS.items():
        value = values.get(name)
        items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
        for i, item in items:
            if not isinstance(item, str) or not item:
                continue
            field = f"{where}.{name}" + (f"[{i}]" if i is not None else "")
            try:
                if kind == "host":
                    paths.confine_ray_address(item, field)
                else:
                    for target in _glob_reach(item) if kind == "glob" else [item]:
                        paths.confine_path(target, field)
            except ValueError as exc:
                raise AgentError(str(exc)) from None
