"""Run one training job from a JSON spec — the process Dagster, torchrun and ``accelerate launch`` start.

    python -m training_assets.trainers.accelerate_launch job.json
    torchrun --nproc_per_node 2 -m training_assets.trainers.accelerate_launch job.json
    accelerate launch --config_file fsdp.yaml -m training_assets.trainers.accelerate_launch job.json

The job spec (``write_job``, written by ``trainers.jobs.run_training``) names the trainer kind, the
``TrainConfig`` as a dict, where the examples come from (a dataset asset under a data root, or a
JSONL file), the plan already made for them (so the run does not plan again), and optionally
where to write the result JSON. With more than one process (``WORLD_SIZE`` > 1) or
``distributed != "none"`` an ``accelerate.Accelerator`` is created (``cpu=True`` without CUDA:
gloo) and each process trains on its slice of every global batch; only rank 0 reports.

Under Dagster Pipes (``PipesSubprocessClient`` sets ``DAGSTER_PIPES_CONTEXT``) rank 0 streams
progress lines to the run log and reports the result — the ``TrainResult`` mapping — as the
custom message ``{"training_result": ...}``, which the asset reads from the completed invocation.

``--help`` prints the usage; a bad argument, job spec or configuration is one line on stderr
naming the file or field, and exit 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from dagster_pipes import open_dagster_pipes  # the light Pipes protocol package, not dagster itself

from training_assets.dataset_rows import DatasetRows
from training_assets.kinds import DATASETS
from training_assets.launch import check_launched
from training_assets.storage import write_json_atomic
from training_assets.trainers import TrainConfig, get_trainer
from training_assets.trainers.loop import step_logger
from training_assets.trainers.plan import Plan
from training_assets.training_data import open_dataset_rows

RESULT_MESSAGE = "training_result"


def write_job(path: str | os.PathLike[str], kind: str, config: dict[str, Any], examples: dict[str, Any],
              result_path: str | None = None, plan: dict[str, Any] | None = None) -> Path:
    """Write a job spec. ``examples``: ``{"dataset": key, "root": dir, "limit": n?}`` or ``{"jsonl": path, "limit": n?}``."""
    return write_json_atomic(path, {"kind": kind, "config": config, "examples": examples, "plan": plan,
                                    "result_path": result_path})


def load_examples(spec: dict[str, Any]) -> list[dict[str, Any]] | DatasetRows:
    """The job's examples: a dataset asset memory-mapped (``DatasetRows``, read a micro-batch at a time), or a JSONL file's rows."""
    if "jsonl" in spec:
        with open(spec["jsonl"], encoding="utf-8") as handle:
            rows: list[dict[str, Any]] | DatasetRows = [json.loads(line) for line in handle if line.strip()]
    else:
        if spec["dataset"] not in DATASETS:
            raise ValueError(f"unknown dataset {spec['dataset']!r}; one of {sorted(DATASETS)}")
        rows = open_dataset_rows(spec["dataset"], spec.get("root"))
    limit = spec.get("limit")
    return rows[:limit] if limit else rows


def make_accelerator(config: Any) -> Any:
    """An Accelerator when a launcher started several processes or a distributed mode is asked for, else None.

    FSDP and DeepSpeed come from ``accelerate launch`` with their config on GPUs; under another
    launcher, or on CPU (Accelerate 1.15 builds ``MULTI_CPU``, i.e. DDP, even with
    ``ACCELERATE_USE_FSDP=true``), they would silently train as plain DDP, so that is refused.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 and config.distributed == "none":
        return None
    check_launched(config)
    flag = {"fsdp": "ACCELERATE_USE_FSDP", "deepspeed": "ACCELERATE_USE_DEEPSPEED"}.get(config.distributed)
    if flag and os.environ.get(flag, "").lower() != "true":
        raise RuntimeError(f"distributed={config.distributed!r} needs `accelerate launch` with a {config.distributed} "
                           f"config (launch.write_config + build_launch_command(..., config_file=...)); {flag} is not set")
    import torch  # torch: import-time stays torch-free
    from accelerate import Accelerator  # the train extra, ~1 s: only for a multi-process or distributed run

    if flag and not torch.cuda.is_available():
        raise RuntimeError(f"distributed={config.distributed!r} needs GPUs: Accelerate sets up {config.distributed} only "
                           "on accelerators, and on CPU it would silently train as plain DDP; use distributed='ddp' "
                           "(torchrun over gloo) on CPU")
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    wanted = {"fsdp": "FSDP", "deepspeed": "DEEPSPEED"}.get(config.distributed)
    if wanted and accelerator.distributed_type.value != wanted:
        raise RuntimeError(f"distributed={config.distributed!r} but Accelerate set up {accelerator.distributed_type.value}; "
                           f"check the accelerate config file ({config.distributed}) passed to `accelerate launch`")
    return accelerator


def run_job(job: dict[str, Any], log_fn: Any = None) -> dict[str, Any]:
    """Train per the job spec; returns (and on rank 0 writes, if the spec names a file) the result dict."""
    config = TrainConfig.from_dict(job["config"])
    accelerator = make_accelerator(config)
    callbacks = (step_logger(log_fn),) if log_fn is not None else ()
    trainer = get_trainer(job["kind"], config, accelerator=accelerator, callbacks=callbacks)
    plan = Plan.from_dict(job["plan"]) if job.get("plan") else None
    payload = trainer.train(load_examples(job["examples"]), plan=plan).to_dict()
    if job.get("result_path") and (accelerator is None or accelerator.is_main_process):
        write_json_atomic(job["result_path"], payload)
    return payload


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (not the usage block), as the ``training-assets`` verbs report."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help for usage)\n")


def parse_args(argv: list[str], prog: str, kind: str | None) -> argparse.Namespace:
    what = f"a {kind} job" if kind else "a job of any trainer kind"
    parser = _Parser(prog=prog, description=f"Train {what} from its spec (trainers.accelerate_launch.write_job), in "
                                            "this process or under torchrun / accelerate launch.")
    parser.add_argument("job", metavar="JOB.json", type=Path, help="the job spec: kind, TrainConfig, examples, plan")
    return parser.parse_args(argv)


def read_job(path: Path, kind: str | None) -> dict[str, Any]:
    """The job spec at ``path``; a missing, unreadable or wrong-kind spec is a ``ValueError`` naming the file."""
    try:
        job = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: no such job spec; write one with trainers.accelerate_launch.write_job") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable JSON job spec ({exc})") from None
    missing = [k for k in ("kind", "config", "examples") if not isinstance(job, dict) or k not in job]
    if missing:
        raise ValueError(f"{path}: not a job spec (no {', '.join(missing)}); write one with trainers.accelerate_launch.write_job")
    if kind is not None and job["kind"] != kind:
        raise ValueError(f"{path}: a {job['kind']!r} job; this entry trains {kind!r} jobs only "
                         "(python -m training_assets.trainers.accelerate_launch runs any)")
    return job


def main(argv: list[str] | None = None, kind: str | None = None, prog: str | None = None) -> int:
    """Run ``JOB.json``; ``kind``: the only trainer kind this entry accepts (``pretrain_trainer``); ``prog``: its name in messages.

    A bad job spec or configuration (``ValueError``, ``FileNotFoundError``: they name the file or the
    field) is one line on stderr and exit 2; under Pipes it is reported to Dagster first.
    """
    prog = prog or f"python -m {__spec__.name if __spec__ else __name__}"
    args = parse_args(sys.argv[1:] if argv is None else argv, prog, kind)
    try:
        job = read_job(args.job, kind)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        if os.environ.get("DAGSTER_PIPES_CONTEXT") and os.environ.get("RANK", "0") == "0":
            with open_dagster_pipes() as pipes:
                result = run_job(job, log_fn=pipes.log.info)
                pipes.report_custom_message({RESULT_MESSAGE: result})
            return 0
        run_job(job)
    except (ValueError, FileNotFoundError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
