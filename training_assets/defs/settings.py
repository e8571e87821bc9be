"""Dagster run configs derived from the library's settings models, so a field is declared once.

    SftDatasetConfig = spec_config("SftDatasetConfig", builders.SftConfig)
    builders.SftConfig(**config.model_dump())        # back to the library's model at the asset boundary

Each ``dg.Config`` field takes the model field's type (``Literal`` choices become the launchpad's
drop-downs, a typo is refused before launch), its help text and its default; an asset may change a
default for the demo (a tiny model on CPU), and only the fields it lets users set are exposed.
The model's constraints (``ge``, ``gt``, ``min_length``, ...) come along, so an out-of-range value is
refused when the config is built (an MCP plan, the launchpad's run), not when the asset runs. A field that is itself a model (``GrpoSpec.vllm: VllmSpec | None``)
becomes a nested config derived the same way (``Optional`` when the model allows None), so
``model_dump`` hands the library the nested dict it takes.
"""

from collections.abc import Mapping, Sequence
from types import NoneType, UnionType
from typing import Annotated, Any, Optional, Union, get_args, get_origin

import dagster as dg
import pydantic
from pydantic import BaseModel, ConfigDict, Field


class StrictConfig(dg.Config):
    """A run config that refuses an unknown field in Python too (Dagster's launch-time schema already does):
    a nested ``{"lora": {"rank": 8}}`` built here must fail, not fall back to defaults."""

    model_config = ConfigDict(extra="forbid")


def _config_type(annotation: Any) -> Any:
    """Dagster's config types have no tuples: ``tuple[X, ...]`` is offered as ``list[X]`` (the model takes it back)."""
    if get_origin(annotation) is tuple:
        return list[get_args(annotation)[0]]
    return annotation


def _nested_model(annotation: Any) -> tuple[type[BaseModel], bool] | None:
    """``(Model, optional)`` when ``annotation`` is a model or ``Model | None``, else None."""
    members = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
    if len(models) != 1 or any(m is not models[0] and m is not NoneType for m in members):
        return None
    return models[0], NoneType in members


def _nested_field(owner: str, name: str, model: type[BaseModel], optional: bool, default: Any,
                  description: str | None) -> tuple[Any, Any]:
    """A model-typed field as a nested config (a model default is dumped: Dagster shows and fills in a dict)."""
    config_class = spec_config(f"{owner}{name.title().replace('_', '')}", model)
    if isinstance(default, BaseModel):
        default = default.model_dump()
    annotation = Optional[config_class] if optional else config_class  # noqa: UP045 (Dagster reads Optional)
    return annotation, Field(default, validate_default=True, description=description)


def _fields(owner: str, spec: type[BaseModel], names: Sequence[str], defaults: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for name in names:
        info = spec.model_fields[name]
        default = defaults.get(name, info.get_default(call_default_factory=True))
        nested_model = _nested_model(info.annotation)
        if nested_model is not None:
            out[name] = _nested_field(owner, name, *nested_model, default, info.description)
            continue
        kind = _config_type(info.annotation)
        if info.metadata:  # the model's bounds (ge, le, min_length, ...): an out-of-range value fails before launch
            kind = Annotated[kind, *info.metadata]
        out[name] = (kind, Field(list(default) if isinstance(default, tuple) else default, description=info.description))
    return out


def spec_config(name: str, spec: type[BaseModel], names: Sequence[str] | None = None,
                defaults: Mapping[str, Any] | None = None, **extra: Any) -> type[dg.Config]:
    """A ``dg.Config`` class with ``spec``'s fields ``names`` (all by default), ``defaults`` changed, plus ``extra``."""
    fields = _fields(name, spec, names if names is not None else list(spec.model_fields), defaults or {})
    return pydantic.create_model(name, __base__=StrictConfig, __doc__=f"Run config built from {spec.__name__}.",
                                 **fields, **extra)


def nested(config_class: type[dg.Config], description: str) -> tuple[type, Any]:
    """A nested config field (``dpo: {...}``), defaulting to the class's own defaults."""
    return config_class, Field(default_factory=config_class, description=description)
