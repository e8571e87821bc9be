"""Runs of a loop process that is gone (killed, interrupted) are recorded failed when the next loop starts."""

import os
import subprocess

import dagster as dg

from training_assets.orchestration.local_runs import WORKER_PID_TAG
from training_assets.orchestration.self_training import LOOP_TAG, reap_dead_loop_runs
from training_assets.orchestration.vocabulary import LAUNCHED_BY_TAG


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _run(instance, run_id: str, tags: dict[str, str]) -> None:
    instance.add_run(dg.DagsterRun(job_name="__ASSET_JOB", run_id=run_id, status=dg.DagsterRunStatus.STARTED,
                                   tags=tags))


def test_only_loop_runs_whose_process_is_gone_are_recorded_failed():
    with dg.DagsterInstance.ephemeral() as instance:
        dead, alive = str(_dead_pid()), str(os.getpid())
        loop = {LAUNCHED_BY_TAG: "loop", LOOP_TAG: "g1"}
        _run(instance, "a" * 36, {**loop, WORKER_PID_TAG: dead})  # its loop was killed
        _run(instance, "b" * 36, {**loop, WORKER_PID_TAG: alive})  # a loop still running
        _run(instance, "c" * 36, {WORKER_PID_TAG: dead})  # not the loop's: left to its own surface
        assert reap_dead_loop_runs(instance) == ["a" * 36]
        status = {r: instance.get_run_by_id(r).status for r in ("a" * 36, "b" * 36, "c" * 36)}
        assert status == {"a" * 36: dg.DagsterRunStatus.FAILURE, "b" * 36: dg.DagsterRunStatus.STARTED,
                          "c" * 36: dg.DagsterRunStatus.STARTED}
        assert reap_dead_loop_runs(instance) == []  # once
