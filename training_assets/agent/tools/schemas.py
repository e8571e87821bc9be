"""The typed ``config`` each MCP tool takes, derived from the library's settings models.

    TrainSftInput = overrides_model("TrainSftConfig", Part(TrainConfig, ("max_steps", "lora", ...)))
    TrainSftInput(max_steps=4, lora={"r": 8})         # validated: types, bounds, no unknown field
    overrides(TrainSftInput(max_steps=4))              # {"max_steps": 4}: only what the caller set

An input model has every field of the settings model(s) it is cut from, with the type, bounds and
help declared there, and nothing required: a field left out keeps the asset's default, so the
Python default is an unset marker and the model's own default is shown as the JSON Schema
``default`` (what ``training-assets <verb> --help`` shows too). A field that is itself a model
(``lora: LoraSpec | None``, ``dpo: DpoSpec``) becomes a nested input model derived the same way, so
``{"lora": {"r": 8}}`` overrides r alone. Unknown fields are refused (``extra="forbid"``): the SDK
answers with the one-line error of ``server._validation_line``.

Where a demo deployment changes a default (``defs/``: a tiny model on CPU), the plan's
``config_fields`` shows the default the asset will run with; the schema shows the library's.

What no library model declares yet, this module declares once for the agent (``ASSET_KNOBS``):
the checkpoint assets' launcher knobs, the dedup choice and its rate bounds, the merge weights,
the eval cases file and the registry entry. ``tests/agent/test_tool_schemas.py`` holds each of
them equal to the Dagster config field of the same name (type, default, help).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import NoneType, UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from training_assets import kinds
from training_assets.data_engine import CurationConfig, QualityConfig
from training_assets.data_engine.corpus import RUN_ONLY_FIELDS, HeldOutConfig
from training_assets.evaluation.settings import RUN_FIELDS, EvalSettings, GateThresholds
from training_assets.settings import DATASET_SETTINGS, GrpoConfig
from training_assets.tokenizer_trainer import TokenizerConfig
from training_assets.trainers.config import TrainConfig

_INPUT = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Part:
    """Fields ``names`` (all when None) of a settings model, as one tool's config offers them."""

    model: type[BaseModel]
    names: Sequence[str] | None = None

    def fields(self) -> dict[str, FieldInfo]:
        names = self.names if self.names is not None else list(self.model.model_fields)
        return {name: self.model.model_fields[name] for name in names}


def _nested_model(annotation: Any) -> tuple[type[BaseModel], bool] | None:
    """``(Model, optional)`` when ``annotation`` is a model or ``Model | None``, else None."""
    members = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
    if len(models) != 1 or any(m is not models[0] and m is not NoneType for m in members):
        return None
    return models[0], NoneType in members


def _override(owner: str, name: str, info: FieldInfo) -> tuple[Any, FieldInfo]:
    """One settings field as an input field: same type, bounds and help; unset by default, the model's default shown."""
    default = info.get_default(call_default_factory=True)
    nested = _nested_model(info.annotation)
    if nested is not None:
        model, optional = nested
        annotation: Any = overrides_model(f"{owner}{name.title().replace('_', '')}", Part(model),
                                          doc=f"{model.__name__}'s fields: each left out keeps its default.")
        annotation = annotation | None if optional else annotation
    else:
        annotation = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
    # None is the unset marker (never validated: an explicit null is validated like any value)
    return annotation, Field(None, description=info.description,
                             json_schema_extra={"default": to_jsonable_python(default)})


def overrides_model(name: str, *parts: Part | Mapping[str, FieldInfo], doc: str | None = None) -> type[BaseModel]:
    """An input model of ``parts``' fields, each optional (left out: the default applies); unknown fields refused.

    A field offered by two parts must be the same declaration (``ValueError`` otherwise): one
    name, one meaning, whichever asset it lands on."""
    fields: dict[str, FieldInfo] = {}
    for part in parts:
        for field_name, info in (part.fields() if isinstance(part, Part) else part).items():
            if field_name in fields and fields[field_name] is not info:
                raise ValueError(f"{name}: field {field_name!r} is declared twice with different settings")
            fields[field_name] = info
    return create_model(name, __config__=_INPUT, __doc__=doc or f"Overrides of {name}'s defaults.",
                        **{n: _override(name, n, info) for n, info in sorted(fields.items())})


def overrides(config: BaseModel | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The fields a caller set (nested too), as JSON values (tuples as lists, as Dagster's config takes them)."""
    if config is None or isinstance(config, Mapping):
        return None if config is None else dict(config)
    return config.model_dump(mode="json", exclude_unset=True)


def _knob(annotation: Any, default: Any, description: str, **bounds: Any) -> FieldInfo:
    return FieldInfo.from_annotated_attribute(annotation, Field(default, description=description, **bounds))


# Settings no library model declares yet (their Dagster config is declared in defs/): one declaration here.
ASSET_KNOBS: dict[str, dict[str, FieldInfo]] = {
    "checkpoint": {
        "num_processes": _knob(int, 1, "Processes to launch (torchrun on CPU, accelerate launch on GPU).", ge=1),
        "launcher": _knob(Literal["auto", "subprocess", "in_process"], "auto",
                          "Where the training runs: 'subprocess' (Dagster Pipes; torchrun / accelerate launch "
                          "for several processes), 'in_process' (in the run's own process: no start-up cost, "
                          "one CPU process only), or 'auto': a subprocess with CUDA, several processes or "
                          "a distributed mode, else in the run's process."),
        "limit_examples": _knob(int, 0, "Train on the first N examples only (0 = all).", ge=0),
    },
    "dedup": {
        "method": _knob(Literal["minhash", "cosine"], "minhash", (
            "Near-dup method: 'minhash' (Jaccard of word n-grams) or 'cosine'. Shingling: the minhash resource.")),
        "threshold": _knob(float, 0.8, "Similarity at or above which two records are duplicates."),
        "min_dedup_rate": _knob(float, 0.0, "Blocking check: lowest acceptable share of records removed by dedup.",
                                ge=0.0, le=1.0),
        "max_dedup_rate": _knob(float, 0.5, "Blocking check: highest acceptable share (more means a broken source).",
                                ge=0.0, le=1.0),
    },
    "merge": {
        "density": _knob(float, 0.5, "TIES: share of each task vector kept (largest magnitudes).", ge=0.0, le=1.0),
        **{f"{name}_weight": _knob(float, 1.0, f"Weight of the {name} adapter.") for name in kinds.MERGED_KINDS},
    },
    "eval": {
        "cases_path": _knob(str, "", (
            "JSONL eval cases, under the data root or a folder of $TRAINING_ASSETS_SOURCE_DIRS; empty = the shipped "
            "reliability suite (eval_tasks/).")),
    },
    "promotion": {
        "role": _knob(str, "generator", "Compare with the model registered for this role (none: thresholds only)."),
        "model_name": _knob(str, "agent-model", "MLflow registered model holding the role aliases."),
    },
    "registry_entry": {
        "role": _knob(str, "generator", "The role this model serves (its MLflow alias)."),
        "served_model_name": _knob(str, "agent-generator", "Name clients request from the serving endpoint."),
        "base_url": _knob(str, "", (
            "vLLM server to load the adapter into; it must be one the deployment resource allows "
            "(TRAINING_ASSETS_DEPLOY_ALLOWED_URLS). Empty: the resource's server (VLLM_BASE_URL), else record the "
            "`vllm serve` command.")),
        "model_name": _knob(str, "agent-model", "MLflow registered model that holds the role aliases."),
    },
}

# TrainConfig fields no checkpoint asset exposes: the graph decides them (graph_map.GRAPH_OWNED) or the
# deployment does (attention kernel, Liger, Adam betas, checkpoint retention, distributed mode, logging)
_HIDDEN_TRAIN_FIELDS = {"base_model", "tokenizer", "output_dir", "resume_from", "tracking_uri", "run_name",
                        "tracker_tags", "attn_impl", "use_liger", "adam_betas", "save_total_limit", "distributed",
                        "log_steps", "packing"}
_SPEC_FIELDS = {k.spec for k in kinds.KINDS.values() if k.spec}
_KIND_FIELDS = {"sft": ("packing",)}  # TrainConfig fields only some kinds expose


def _train_fields(kind: kinds.TrainingKind) -> tuple[str, ...]:
    """The TrainConfig fields ``kind``'s checkpoint asset lets a run set (its own spec nested, LoRA nested)."""
    shared = [n for n in TrainConfig.model_fields if n not in _HIDDEN_TRAIN_FIELDS | _SPEC_FIELDS]
    return (*shared, *_KIND_FIELDS.get(kind.name, ()), *((kind.spec,) if kind.spec else ()))


def _title(name: str) -> str:
    return name.title().replace("_", "")


TRAINING_INPUTS: dict[str, type[BaseModel]] = {
    k.tool: overrides_model(f"{_title(k.tool)}Config", Part(TrainConfig, _train_fields(k)), ASSET_KNOBS["checkpoint"],
                            doc=f"{k.checkpoint}'s run config: TrainConfig fields and the asset's launcher knobs.")
    for k in kinds.KINDS.values()
}
CURATION_FIELDS = ("decontam_ngram", "decontam_min_ngram", "extra_sources", *RUN_ONLY_FIELDS)
DECONTAM_FIELDS = ("decontam_ngram", "decontam_min_ngram")
# The tools' config models, by tool (the training tools' from the kinds table).
INPUTS: dict[str, type[BaseModel]] = {
    "curate_corpus": overrides_model("CurateCorpusConfig", Part(HeldOutConfig), Part(QualityConfig),
                                     Part(CurationConfig, CURATION_FIELDS), ASSET_KNOBS["dedup"]),
    "dedup_corpus": overrides_model("DedupCorpusConfig", ASSET_KNOBS["dedup"]),
    "decontaminate_corpus": overrides_model("DecontaminateCorpusConfig", Part(HeldOutConfig),
                                            Part(CurationConfig, DECONTAM_FIELDS)),
    "train_tokenizer": overrides_model("TrainTokenizerConfig", Part(TokenizerConfig)),
    "build_training_dataset": overrides_model(
        "BuildTrainingDatasetConfig", *(Part(m) for m in dict.fromkeys(DATASET_SETTINGS.values())),
        doc="The chosen kind's dataset settings (each field belongs to one kind's dataset)."),
    "compose_reward": overrides_model("ComposeRewardConfig", Part(GrpoConfig, ("reward_weights", "scale_rewards"))),
    **TRAINING_INPUTS,
    "merge_adapters_ties": overrides_model("MergeAdaptersTiesConfig", ASSET_KNOBS["merge"]),
    "evaluate_checkpoint": overrides_model(
        "EvaluateCheckpointConfig", Part(EvalSettings, RUN_FIELDS), Part(GateThresholds), ASSET_KNOBS["eval"],
        ASSET_KNOBS["promotion"], doc="The eval report's run settings and gate thresholds (role and model_name: "
                                      "merged_adapter's promotion gate only)."),
    "register_model": overrides_model("RegisterModelConfig", ASSET_KNOBS["registry_entry"]),
}


def input_model(tool: str) -> type[BaseModel]:
    return INPUTS[tool]


def fields_at(model: type[BaseModel], path: Sequence[str | int]) -> list[str]:
    """The field names of the (nested) input model at ``path`` (``["lora"]``: LoRA's), [] when not a model."""
    for step in path:
        info = model.model_fields.get(str(step))
        nested = _nested_model(info.annotation) if info is not None else None
        if nested is None:
            return []
        model = nested[0]
    return sorted(model.model_fields)
