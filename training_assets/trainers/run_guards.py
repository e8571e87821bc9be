"""What a training run must pass before it executes: a model it can load, a bounded time, its folder to itself.

    problem = model_source_problem("base_model", config.base_model)   # None, or why it cannot be loaded
    problem = train_time_problem(plan, config, cuda=False)            # None, or the ETA against the limit
    with hold_run_dir(config.output_dir):                             # RunDirBusy names the holder's pid
        train()

``trainers.jobs.run_training`` applies them, in this order, before anything trains: every execute
(CLI ``--execute``, the checkpoint assets and so MCP executes, ``training_pipeline``) goes through it.

* **Model sources.** A ``base_model`` (or ``tokenizer``) that is neither a local folder nor a hub
  id the hub can serve used to surface as a 42-line transformers traceback mid-start-up.
* **Time.** ``TrainConfig`` bounds ``max_steps`` and ``epochs``; within those bounds a big model
  can still plan weeks of training and hold the one training slot. The ETA is the plan's FLOPs
  (``plan.train_flops``) at an assumed throughput; a run over ``$TRAINING_ASSETS_MAX_TRAIN_HOURS``
  (default 72) is refused until the deployment raises that limit.
* **One run per folder.** Two runs writing one ``output_dir`` raced on its checkpoints: one died
  with ``OSError: Directory not empty`` and a starting run's ``remove_partial_checkpoints`` could
  delete the checkpoint the other was writing. ``hold_run_dir`` holds an exclusive ``flock`` on
  ``<output_dir>/.run.lock`` for the run; the kernel drops it when the holder exits or dies, so a
  crashed run never leaves its folder locked. The file stays (removing it would race a new holder).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from training_assets.trainers.config import TrainConfig
from training_assets.trainers.plan import Plan

LOCK_FILE = ".run.lock"
MAX_TRAIN_HOURS_ENV = "TRAINING_ASSETS_MAX_TRAIN_HOURS"
DEFAULT_MAX_TRAIN_HOURS = 72.0
# Sustained training throughput the ETA assumes, FLOP/s per process. A CPU thread: 1e10 (fp32; the
# demo's pretraining ran at 0.8e10 on one thread of this 2-core host). A CUDA GPU: 4e14 (an H100 at
# ~40% of its dense bf16 peak). Within a small factor of real runs: enough to tell a run of hours
# from one of weeks, which is what the limit is for.
CPU_FLOPS_PER_THREAD = 1e10
GPU_FLOPS = 4e14
# files that make a folder loadable as each source (an adapter folder loads on its base through PEFT)
SOURCE_FILES = {"base_model": ("config.json", "adapter_config.json"), "tokenizer": ("tokenizer.json", "tokenizer_config.json")}


class RunDirBusy(RuntimeError):
    """Another training run holds the output folder."""


def model_source_problem(field: str, value: str | None) -> str | None:
    """Why ``value`` cannot be loaded as the run's ``field`` (``base_model`` or ``tokenizer``), or None when it can.

    A local folder must hold one of ``SOURCE_FILES[field]``; anything else must be a hub id, and
    with the hub offline (``HF_HUB_OFFLINE``) one already in the local cache.
    """
    if value is None:
        return None
    from huggingface_hub import constants, try_to_load_from_cache  # the hub client: only for a hub id
    from huggingface_hub.utils import HFValidationError, validate_repo_id  # the hub client: only for a hub id

    wanted = SOURCE_FILES[field]
    what = (f"a {field} is a Hugging Face folder (with {' or '.join(wanted)}) or, where a hub is reachable, "
            "a hub id such as Qwen/Qwen2.5-0.5B")
    path = Path(value).expanduser()
    if path.is_dir():
        if any((path / name).is_file() for name in wanted):
            return None
        return f"{field}={value!r}: a folder without {' or '.join(wanted)}; {what}"
    if path.exists():
        return f"{field}={value!r} is a file; {what}"
    try:
        validate_repo_id(value)
    except HFValidationError:
        return f"{field}={value!r}: no such folder; {what}"
    if constants.HF_HUB_OFFLINE and not any(isinstance(try_to_load_from_cache(value, name), str) for name in wanted):
        return (f"{field}={value!r}: no such folder, and the hub is offline (HF_HUB_OFFLINE) with no copy of it in "
                f"the local cache; {what}")
    return None


def max_train_hours() -> float:
    """The deployment's limit on one run's ETA, in hours (``$TRAINING_ASSETS_MAX_TRAIN_HOURS``, default 72)."""
    raw = os.environ.get(MAX_TRAIN_HOURS_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_TRAIN_HOURS
    try:
        hours = float(raw)
    except ValueError:
        hours = -1.0
    if not hours > 0:
        raise ValueError(f"${MAX_TRAIN_HOURS_ENV}={raw!r}: expected a positive number of hours (default "
                         f"{DEFAULT_MAX_TRAIN_HOURS:g})")
    return hours


def throughput_flops(config: TrainConfig, cuda: bool) -> float:
    """The FLOP/s one training process is assumed to sustain (``GPU_FLOPS``, or ``CPU_FLOPS_PER_THREAD`` per thread)."""
    if cuda:
        return GPU_FLOPS
    return CPU_FLOPS_PER_THREAD * (config.torch_threads or len(os.sched_getaffinity(0)))


def train_time_problem(plan: Plan, config: TrainConfig, cuda: bool) -> str | None:
    """Why the planned run may not execute here (its ETA exceeds the limit), or None.

    No estimate (parameter count unknown, e.g. a hub base without its config.json here): no refusal.
    """
    if plan.train_flops is None:
        return None
    rate = throughput_flops(config, cuda) * plan.world_size
    eta_h = plan.train_flops / rate / 3600
    limit = max_train_hours()
    if eta_h <= limit:
        return None
    return (f"{plan.kind}: the plan's ETA is {eta_h:,.1f} h ({plan.planned_steps:,} steps, {plan.train_flops:.2e} FLOPs "
            f"at an assumed {rate:.1e} FLOP/s on {plan.world_size} {'GPU' if cuda else 'CPU'} process(es)), over the "
            f"{limit:g} h limit of ${MAX_TRAIN_HOURS_ENV}; lower max_steps or epochs, or raise ${MAX_TRAIN_HOURS_ENV} "
            "where runs this long are meant")


@contextmanager
def hold_run_dir(folder: str | os.PathLike[str]) -> Iterator[Path]:
    """Hold ``<folder>/.run.lock`` while the block runs (non-blocking); ``RunDirBusy`` names the holder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / LOCK_FILE, "a+", encoding="utf-8")  # noqa: SIM115 (closed below: closing releases the lock)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "not yet written"
            raise RunDirBusy(f"{folder} is in use by another training run (pid {holder}); wait for it to finish "
                             "or train into another output folder") from None
        handle.truncate(0)  # "a+" writes at the end, which is now 0
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield folder
    finally:
        handle.close()


def run_dir_holder(folder: str | os.PathLike[str]) -> str | None:
    """The pid text of the run holding ``<folder>/.run.lock``, or None when no run holds it (nothing is created)."""
    try:
        handle = open(Path(folder) / LOCK_FILE, encoding="utf-8")  # noqa: SIM115 (closed below)
    except FileNotFoundError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return handle.read().strip() or "not yet written"
        return None
