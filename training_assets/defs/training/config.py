"""Run configs of the checkpoint assets, built from the library's specs instead of repeating them.

Each ``dg.Config`` field is a ``TrainConfig`` / ``DpoSpec`` / ``GrpoSpec`` / ``LoraSpec`` field: its
type (``Literal`` choices become the launchpad's drop-downs, a typo is refused before launch), its
help text and its default, which an asset may change for the demo (a tiny model on CPU). Only the
fields an asset lets users set are exposed; ``overrides`` turns a config back into the
``TrainConfig`` fields ``trainers.jobs.prepare_job`` takes.
"""

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Optional

import dagster as dg
from pydantic import Field

from training_assets.defs.settings import spec_config
from training_assets.trainers import LoraSpec, TrainConfig

# TrainConfig fields a checkpoint asset's run config exposes (paths, tracking and resume are the asset's own)
TRAIN_FIELDS = ("max_steps", "epochs", "batch_size", "grad_accum", "lr", "weight_decay", "warmup_steps", "lr_scheduler",
                "max_seq_len", "precision", "weight_dtype", "max_grad_norm", "gradient_checkpointing", "share_prefixes", "save_steps", "seed",
                "kernel_backend", "torch_threads", "tracker")


LoraOptions = spec_config("LoraOptions", LoraSpec)


def _asset_fields(defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The asset's own knobs: LoRA (LoraSpec's fields; null trains all weights), processes, launcher, an example limit."""
    lora = defaults.get("lora")
    return {
        "lora": (Optional[LoraOptions], Field(  # noqa: UP045 (Dagster's config types read Optional)
            LoraOptions(**lora).model_dump() if lora else None,  # Dagster shows (and fills in) a dict default
            validate_default=True, description=TrainConfig.model_fields["lora"].description)),
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


ASSET_ONLY = ("num_processes", "launcher", "limit_examples")


def training_config(name: str, defaults: Mapping[str, Any], fields: Sequence[str] = TRAIN_FIELDS,
                    **extra: Any) -> type[dg.Config]:
    """A checkpoint asset's run config: the ``TrainConfig`` fields, LoRA, processes, example limit."""
    return spec_config(name, TrainConfig, fields, defaults, **_asset_fields(defaults), **extra)


def overrides(config: dg.Config, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``TrainConfig`` fields of a run config (nested specs and LoRA as dicts, as ``TrainConfig`` takes them)."""
    values = config.model_dump()
    return {**{k: v for k, v in values.items() if k not in ASSET_ONLY}, **(extra or {})}
