"""One way to train: ``prepare_job`` resolves a run's inputs once, ``run_training`` plans once, trains, writes the manifest.

    job = prepare_job("dpo_checkpoint", root, {"max_steps": 8, "lora": {"r": 8}})   # upstream manifest read here
    run = run_training(job)                       # in this process; or launcher=... for a subprocess
    run.plan["planned_steps"], run.manifest.data_version

Every training goes through ``run_training``: the checkpoint assets (Pipes subprocess), the CLI
(``train ... --execute``, in-process or torchrun) and ``training_pipeline`` (in-memory examples,
injected model). It loads the examples, makes the plan (once: a subprocess receives it in the job
spec), trains in-process or through ``launcher`` (a callable that runs the launch command and
returns the reported result), then writes the manifest (``checkpoint_manifest``, last).

Asset runs live in ``<root>/<asset>/runs/<fingerprint of config + upstream versions + limit>/``
with ``resume_from="auto"``: re-materialising after a crash with the same inputs resumes the
interrupted run instead of starting over, and changed inputs start a fresh one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training_assets import kinds, paths
from training_assets.checkpoint_manifest import (CheckpointManifest, merged_manifest, read_manifest, trained_manifest,
                                                 write_asset_manifest, write_manifest)
from training_assets.dataset_rows import DatasetRows
from training_assets.launch import build_launch_command
from training_assets.peft_manager import merge_lora_adapters
from training_assets.storage import fingerprint, sha256_file, sha256_tree
from training_assets.tokenizer_trainer import tokenizer_dir, tokenizer_hash
from training_assets.trainers import get_trainer
from training_assets.trainers.accelerate_launch import load_examples, write_job
from training_assets.trainers.base import as_examples
from training_assets.trainers.config import TrainConfig
from training_assets.trainers.loop import step_logger
from training_assets.trainers.plan import Plan
from training_assets.trainers.run_guards import hold_run_dir, model_source_problem, train_time_problem
from training_assets.training_data import read_dataset_info

RUNS_DIR = "runs"
# argv -> the result the launched job reported (a Pipes message, or the result file rank 0 wrote)
Launcher = Callable[[list[str]], Mapping[str, Any]]


@dataclass(frozen=True)
class TrainingJob:
    """A training run with its inputs resolved: what trains, on what, and where its manifest goes."""

    asset: str  # the manifest's asset key
    kind: str
    config: TrainConfig
    examples: dict[str, Any]  # {"dataset", "root", "limit"} | {"jsonl", "limit"} | {} (given in memory)
    data_versions: dict[str, str]
    manifest_dir: Path  # <root>/<asset> for asset runs, else the run's output_dir

    @property
    def run_dir(self) -> Path:
        return Path(self.config.output_dir)


@dataclass
class TrainingRun:
    """A planned (``manifest is None``) or finished run: the plan, the reported result and the manifest."""

    job: TrainingJob
    plan: Plan
    result: dict[str, Any] = field(default_factory=dict)
    manifest: CheckpointManifest | None = None


def _dataset_version(dataset: str, root: Path) -> str:
    info = read_dataset_info(dataset, root)
    if info is None:
        raise FileNotFoundError(f"{dataset} is not materialised under {root}; materialise {dataset} first "
                                f"(training-assets build-dataset, or `make demo`)")
    return info.data_version


def prepare_job(asset: str, root: str | os.PathLike[str] | None = None, overrides: Mapping[str, Any] | None = None, *,
                output_dir: str | os.PathLike[str] | None = None, examples_jsonl: str | os.PathLike[str] | None = None,
                limit: int | None = None, tracking_uri: str | None = None,
                tags: Mapping[str, str] | None = None) -> TrainingJob:
    """Resolve a checkpoint asset's inputs (``overrides`` are TrainConfig fields) into a ``TrainingJob``.

    The base model defaults to the upstream checkpoint's (its manifest is read here, once), the
    tokenizer to the tokenizer asset, the examples to the dataset asset (or ``examples_jsonl``).
    Without ``output_dir`` this is the asset's own run (fingerprinted run dir, resumable, manifest at
    ``<root>/<asset>``); with one, a run there whose manifest lands beside it (the CLI).
    """
    training = kinds.kind_of_checkpoint(asset)
    root = paths.data_root(root)
    kind, dataset, upstream = training.name, training.dataset, training.upstream
    fields: dict[str, Any] = dict(overrides or {})
    versions: dict[str, str] = {}
    if upstream is not None and "base_model" not in fields:
        base = read_manifest(root, upstream)
        fields["base_model"], versions[upstream] = base.checkpoint_dir, base.data_version
    elif fields.get("base_model"):
        versions["base_model"] = str(fields["base_model"])
    if "tokenizer" not in fields and (tokenizer_dir(root) / "tokenizer.json").is_file():
        fields["tokenizer"], versions["tokenizer"] = str(tokenizer_dir(root)), tokenizer_hash(root)
    elif fields.get("tokenizer"):
        versions["tokenizer"] = sha256_tree(fields["tokenizer"])
    if examples_jsonl is not None:
        examples: dict[str, Any] = {"jsonl": str(examples_jsonl), "limit": limit}
        versions["examples"] = sha256_file(examples_jsonl)
    else:
        examples = {"dataset": dataset, "root": str(root), "limit": limit}
        versions[dataset] = _dataset_version(dataset, root)
    if output_dir is None:
        probe = TrainConfig.from_dict({**fields, "output_dir": "-"})
        run_dir = paths.asset_dir(asset, root) / RUNS_DIR / fingerprint(probe.to_dict(), versions, limit)
        fields |= {"output_dir": str(run_dir), "resume_from": "auto", "run_name": f"{asset}-{run_dir.name}"}
        manifest_dir = paths.asset_dir(asset, root)
    else:
        fields["output_dir"] = str(Path(output_dir).resolve())
        manifest_dir = Path(fields["output_dir"])
    if tracking_uri is not None:
        fields.setdefault("tracker", "mlflow")
        fields["tracking_uri"] = tracking_uri
    if tags:
        fields["tracker_tags"] = {**(fields.get("tracker_tags") or {}), **tags}
    return TrainingJob(asset, kind, TrainConfig.from_dict(fields), examples, versions, manifest_dir)


def in_memory_job(asset: str, kind: str, config: TrainConfig, data_versions: Mapping[str, str]) -> TrainingJob:
    """A job whose examples the caller passes to ``run_training`` (pipelines); its manifest goes to output_dir."""
    return TrainingJob(asset, kind, config, {}, dict(data_versions), Path(config.output_dir))


def run_training(job: TrainingJob, *, execute: bool = True, rows: Sequence[dict[str, Any]] | DatasetRows | None = None,
                 model: Any = None, tokenizer: Any = None, num_processes: int = 1, launcher: Launcher | None = None,
                 dagster_run_id: str | None = None, log: Callable[[str], None] | None = None,
                 callbacks: Sequence[Callable[[int, dict[str, float]], None]] = ()) -> TrainingRun:
    """Plan ``job`` once and, with ``execute``, train it and write its manifest (last).

    Before an execute trains, ``trainers.run_guards`` refuses a base model or tokenizer it cannot
    load (``ValueError``), a plan whose ETA exceeds ``$TRAINING_ASSETS_MAX_TRAIN_HOURS``
    (``ValueError``) and a run folder another run holds (``RunDirBusy``); the folder stays locked
    until the manifest is written.

    ``rows``: the examples, when the job has no source to load them from; ``model``/``tokenizer``:
    injected (in-process only). ``launcher``: run the training in another process (Pipes,
    torchrun, accelerate launch); required for ``num_processes > 1``. ``log``: the plan line and,
    training in this process, one line per logged step (a launched run logs through its launcher).
    ``callbacks``: more ``run_loop`` step callbacks when training in this process (one may raise to stop).
    """
    if execute:
        sources = {"base_model": model is None, "tokenizer": tokenizer is None}  # injected ones are not loaded
        problems = [model_source_problem(f, getattr(job.config, f)) for f, loaded in sources.items() if loaded]
        if any(problems):
            raise ValueError(f"{job.asset}: " + "; ".join(p for p in problems if p))
    if rows is None:
        if not job.examples:
            raise ValueError(f"{job.asset}: the job names no examples; pass rows=")
        rows = load_examples(job.examples)
    rows = as_examples(rows)  # a mapped dataset stays mapped: plan and train read its columns and micro-batches
    in_process = (step_logger(log),) if log is not None else ()
    trainer = get_trainer(job.kind, job.config, model=model, tokenizer=tokenizer,
                          callbacks=(*in_process, *callbacks) if launcher is None else ())
    plan = trainer.plan(rows, world_size=num_processes)
    run = TrainingRun(job, plan)
    if not execute:
        return run
    if log is not None:
        log(f"{job.asset}: plan " + ", ".join(f"{k}={v}" for k, v in plan.to_dict().items() if k != "notes"))
    if launcher is None and num_processes > 1:
        raise ValueError(f"{job.asset}: num_processes={num_processes} needs a launcher (torchrun / accelerate launch)")
    if launcher is not None and (model is not None or tokenizer is not None or not job.examples):
        raise ValueError(f"{job.asset}: a launched run loads its own model, tokenizer and examples from the job spec")
    too_long = train_time_problem(plan, job.config, cuda=has_cuda())
    if too_long:
        raise ValueError(too_long)
    with hold_run_dir(job.run_dir):
        if launcher is None:
            run.result = trainer.train(rows, plan=plan).to_dict()
        else:
            spec = write_job(job.run_dir / "job.json", job.kind, job.config.to_dict(), job.examples,
                             str(job.run_dir / "result.json"), plan.to_dict())
            run.result = dict(launcher(build_launch_command(
                "training_assets.trainers.accelerate_launch", spec, distributed=job.config.distributed,
                num_processes=num_processes, cpu=not has_cuda(), python=sys.executable)))
        run.manifest = trained_manifest(job.asset, run.result, job.config.to_dict(), job.data_versions, job.examples,
                                        dagster_run_id)
        # Older run folders stay: a registry version, a manifest or a queued run may still use one;
        # `training-assets gc` frees those nothing refers to.
        write_manifest(job.manifest_dir, run.manifest)
    return run


def has_cuda() -> bool:
    import torch  # torch: import-time stays torch-free

    return torch.cuda.is_available()


def subprocess_launcher() -> Launcher:
    """Run the command as a child process and read the result file its rank 0 wrote beside the job spec."""
    def launch(argv: list[str]) -> Mapping[str, Any]:
        path = Path(argv[-1]).parent / "result.json"
        path.unlink(missing_ok=True)  # a stale result must never be mistaken for this run's
        done = subprocess.run(argv)
        if done.returncode != 0 or not path.is_file():
            raise RuntimeError(f"training failed (exit {done.returncode}, no {path}): {' '.join(argv)}")
        return json.loads(path.read_text())

    return launch


def merge_job(root: str | os.PathLike[str] | None, sources: tuple[str, ...] = ("dpo_checkpoint", "grpo_checkpoint"),
              weights: list[float] | None = None, density: float = 0.5,
              dagster_run_id: str | None = None) -> CheckpointManifest:
    """TIES-merge the LoRA adapters of ``sources`` into ``merged_adapter``; returns its manifest."""
    root = paths.data_root(root)
    manifests = [read_manifest(root, s) for s in sources]
    not_adapters = [m.asset for m in manifests if not m.is_adapter]
    if not_adapters:
        raise ValueError(f"{not_adapters} are full checkpoints; TIES merge needs LoRA adapters (give them a `lora` config)")
    bases = {m.base_model_dir for m in manifests}
    if len(bases) != 1:
        raise ValueError(f"adapters sit on different bases {sorted(map(str, bases))}; retrain them from the same sft_checkpoint")
    out = paths.asset_dir("merged_adapter", root) / "adapter"
    summary = merge_lora_adapters([m.checkpoint_dir for m in manifests], out, weights, density)
    manifest = merged_manifest(manifests, out, summary, {"method": "ties", "weights": summary["weights"],
                                                         "density": density, "sources": list(sources)}, dagster_run_id)
    write_asset_manifest(root, manifest)
    return manifest
