"""Run configs of the checkpoint assets, built from the library's specs instead of repeating them.

Each ``dg.Config`` field is a ``TrainConfig`` / ``DpoSpec`` / ``GrpoSpec`` / ``LoraSpec`` field: its
type (``Literal`` choices become the launchpad's drop-downs, a typo is refused before launch), its
help text and its default, which an asset may change for the demo (a tiny model on CPU). Only the
fields an asset lets users set are exposed; ``overrides`` turns a config back into the
``TrainConfig`` fields ``trainers.jobs.prepare_job`` takes.
"""

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import dagster as dg
import pydantic
from pydantic import BaseModel, Field

from training_assets.trainers import DpoSpec, GrpoSpec, LoraSpec, TrainConfig

# TrainConfig fields a checkpoint asset's run config exposes (paths, tracking and resume are the asset's own)
TRAIN_FIELDS = ("max_steps", "epochs", "batch_size", "grad_accum", "lr", "weight_decay", "warmup_steps", "lr_scheduler",
                "max_seq_len", "precision", "max_grad_norm", "gradient_checkpointing", "save_steps", "seed",
                "kernel_backend", "torch_threads", "tracker")


def _fields(spec: type[BaseModel], names: Sequence[str], defaults: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for name in names:
        info = spec.model_fields[name]
        default = defaults.get(name, info.get_default(call_default_factory=True))
        out[name] = (info.annotation, Field(default, description=info.description))
    return out


def spec_config(name: str, spec: type[BaseModel], names: Sequence[str] | None = None,
                defaults: Mapping[str, Any] | None = None, **extra: Any) -> type[dg.Config]:
    """A ``dg.Config`` class with ``spec``'s fields ``names`` (all by default), ``defaults`` changed, plus ``extra``."""
    fields = _fields(spec, names if names is not None else list(spec.model_fields), defaults or {})
    return pydantic.create_model(name, __base__=dg.Config, __doc__=f"Run config built from {spec.__name__}.",
                                 **fields, **extra)


def nested(config_class: type[dg.Config], description: str) -> tuple[type, Any]:
    """A nested config field (``dpo: {...}``), defaulting to the class's own defaults."""
    return config_class, Field(default_factory=config_class, description=description)


def _asset_fields(defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The asset's own knobs: LoRA from rank/alpha (rank 0 = full weights), processes and launcher, an example limit."""
    lora = LoraSpec.model_fields
    return {
        "lora_r": (int, Field(defaults.get("lora_r", 0), ge=0,
                              description=f"LoRA rank; 0 trains all weights. {lora['r'].description}")),
        "lora_alpha": (int, Field(defaults.get("lora_alpha", 16), gt=0, description=lora["alpha"].description)),
        "num_processes": (int, Field(defaults.get("num_processes", 1), ge=1,
                                     description="Processes to launch (torchrun on CPU, accelerate launch on GPU).")),
        "launcher": (Literal["auto", "subprocess", "in_process"],
                     Field(defaults.get("launcher", "auto"),
                           description="Where the training runs: 'subprocess' (Dagster Pipes; torchrun / accelerate launch "
                                       "for several processes), 'in_process' (in the run's own process: no start-up cost, "
                                       "one CPU process only), or 'auto': a subprocess with CUDA, several processes or "
                                       "a distributed mode, else in the run's process.")),
        "limit_examples": (int, Field(defaults.get("limit_examples", 0), ge=0,
                                      description="Train on the first N examples only (0 = all).")),
    }


ASSET_ONLY = ("lora_r", "lora_alpha", "num_processes", "launcher", "limit_examples")


def training_config(name: str, defaults: Mapping[str, Any], fields: Sequence[str] = TRAIN_FIELDS,
                    **extra: Any) -> type[dg.Config]:
    """A checkpoint asset's run config: the ``TrainConfig`` fields, LoRA rank/alpha, processes, example limit."""
    return spec_config(name, TrainConfig, fields, defaults, **_asset_fields(defaults), **extra)


DpoOptions = spec_config("DpoOptions", DpoSpec)
GrpoOptions = spec_config("GrpoOptions", GrpoSpec, defaults={"rollout": "mixed", "max_new_tokens": 16})


def overrides(config: dg.Config, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``TrainConfig`` fields of a run config (nested specs as dicts, LoRA from lora_r/lora_alpha)."""
    values = config.model_dump()
    fields = {k: v for k, v in values.items() if k not in ASSET_ONLY}
    if values["lora_r"] > 0:
        fields["lora"] = {"r": values["lora_r"], "alpha": values["lora_alpha"]}
    return {**fields, **(extra or {})}
