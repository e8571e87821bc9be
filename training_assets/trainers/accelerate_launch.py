"""Run one training job from a JSON spec — the process Dagster, torchrun and ``accelerate launch`` start.

    python -m training_assets.trainers.accelerate_launch job.json
    torchrun --nproc_per_node 2 -m training_assets.trainers.accelerate_launch job.json
    accelerate launch --config_file fsdp.yaml -m training_assets.trainers.accelerate_launch job.json

The job spec (``write_job``) names the trainer kind, the ``TrainConfig`` as a dict, where the
examples come from (a dataset asset under a data root, or a JSONL file), the tokenizer, and
where to write the result JSON. With more than one process (``WORLD_SIZE`` > 1) or
``distributed != "none"`` an ``accelerate.Accelerator`` is created (``cpu=True`` without CUDA:
gloo) and each process trains on its slice of every global batch; only rank 0 writes
checkpoints and the result.

Under Dagster Pipes (``PipesSubprocessClient``) progress lines go to the Dagster run log and
the result is reported as a custom message; the result file is written either way.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from training_assets.storage import write_json_atomic

DATASET_LOADERS = {"pretrain_windows": "load_pretrain_windows", "sft_dataset": "load_sft_dataset",
                   "preference_pairs": "load_preference_pairs", "grpo_groups": "load_grpo_groups"}


def write_job(path: str | os.PathLike[str], kind: str, config: dict[str, Any], examples: dict[str, Any],
              result_path: str, tokenizer_root: str | None = None) -> Path:
    """Write a job spec. ``examples``: ``{"dataset": key, "root": dir, "limit": n?}`` or ``{"jsonl": path}``."""
    return write_json_atomic(path, {"kind": kind, "config": config, "examples": examples,
                                    "result_path": result_path, "tokenizer_root": tokenizer_root})


def load_examples(spec: dict[str, Any]) -> list[dict[str, Any]]:
    if "jsonl" in spec:
        with open(spec["jsonl"], encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
    else:
        from training_assets import training_data

        if spec["dataset"] not in DATASET_LOADERS:
            raise ValueError(f"unknown dataset {spec['dataset']!r}; one of {sorted(DATASET_LOADERS)}")
        rows = getattr(training_data, DATASET_LOADERS[spec["dataset"]])(spec.get("root"))
    limit = spec.get("limit")
    return rows[:limit] if limit else rows


def make_accelerator(config: Any) -> Any:
    """An Accelerator when several processes run or a distributed mode is asked for, else None."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 and config.distributed == "none":
        return None
    import torch
    from accelerate import Accelerator

    return Accelerator(cpu=not torch.cuda.is_available())


def run_job(job: dict[str, Any], log_fn: Any = None) -> dict[str, Any]:
    """Train per the job spec; returns (and on rank 0 writes) the result dict."""
    from training_assets.trainers import TrainConfig, get_trainer

    config = TrainConfig.from_dict(job["config"])
    tokenizer = None
    if job.get("tokenizer_root"):
        from training_assets.tokenizer_trainer import load_tokenizer

        tokenizer = load_tokenizer(job["tokenizer_root"])
    accelerator = make_accelerator(config)
    callbacks = ()
    if log_fn is not None:
        callbacks = (lambda step, m: log_fn(f"step {step} loss {m['loss']:.4f} lr {m['lr']:.2e} "
                                            f"{m['tokens_per_s']:.0f} tok/s eta {m['eta_s']:.0f}s"),)
    trainer = get_trainer(job["kind"], config, tokenizer=tokenizer, accelerator=accelerator, callbacks=callbacks)
    result = trainer.train(load_examples(job["examples"]))
    payload = {"kind": result.kind, "plan": result.plan.to_dict(), "train": result.train_summary(),
               "checkpoint_dir": result.checkpoint_dir, "adapter": result.adapter, "base_model_dir": result.base_model_dir,
               "tokenizer_dir": result.tokenizer_dir, "mlflow_run_id": result.mlflow_run_id,
               "world_size": accelerator.num_processes if accelerator is not None else 1,
               "skipped": getattr(trainer, "skipped", []), "mean_rewards": getattr(trainer, "rewards", [])}
    if accelerator is None or accelerator.is_main_process:
        write_json_atomic(job["result_path"], payload)
    return payload


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m training_assets.trainers.accelerate_launch JOB.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if os.environ.get("DAGSTER_PIPES_CONTEXT"):
        from dagster_pipes import open_dagster_pipes  # the light Pipes protocol package, not dagster itself

        with open_dagster_pipes() as pipes:
            result = run_job(job, log_fn=pipes.log.info)
            pipes.report_custom_message({"result_path": job["result_path"], "final_loss": result["train"]["final_loss"]})
        return 0
    run_job(job)
    return 0


if __name__ == "__main__":
    sys.exit(main())
