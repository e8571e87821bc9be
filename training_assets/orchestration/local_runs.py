"""Runs the agent surface launches on the local instance (``$DAGSTER_HOME``): create, execute, read, cancel.

    run_id = launch(["sft_checkpoint"], run_config, tags)        # NOT_STARTED at once, then a worker runs it
    run_ids = launch_sequence([{...}, {...}])                    # several runs, executed in order by one worker
    python -m training_assets.orchestration.local_runs RUN_ID [...]  # the worker (started detached by launch)

``dagster_home/dagster.yaml`` uses the QueuedRunCoordinator, whose queue only the daemon drains.
With no daemon (no ``dagster dev``), a run the agent launches must still complete, so ``launch``
does here what the coordinator and the default run launcher do there: the run is created in the
instance (NOT_STARTED: Dagster keeps QUEUED for runs a daemon can dequeue through a code server,
which needs a remote origin), the UI shows it at once, then a detached worker process reports it
STARTING and executes it, writing every event to the same instance. Runs submitted with
``--dagster-url`` go through the webserver and its coordinator instead (QUEUED there). When a
daemon is heartbeating on this instance, ``launch`` refuses and points at ``--dagster-url``, so
runs keep the concurrency limits the daemon enforces.

Cancellation follows Dagster's own run worker: the run goes CANCELING and the worker's process
group gets SIGTERM, which interrupts execution (and stops a Pipes training subprocess); Dagster
then records the run CANCELED. A worker still alive ``CANCEL_GRACE_S`` after the cancel is killed,
and a worker that died without finishing its run is reported as a failed run (what run monitoring
does in production).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import dagster as dg
# Private: the public dg.reconstructable / build_reconstructable_job wrap a job in a repository of
# their own, which refuses the reserved name __ASSET_JOB; the implicit job is only reachable through
# the repository that holds it (as `dagster job execute -j __ASSET_JOB` does).
from dagster._core.definitions.reconstruct import ReconstructableRepository
# Private: no public API executes an existing run in-process (dg.execute_job and execute_in_process
# always create a new run, and the run launchers hand the run to a code server); execute_run is
# what Dagster's own run worker (`dagster api execute_run`) calls.
from dagster._core.execution.api import execute_run

from training_assets.orchestration.active_runs import IN_FLIGHT_STATUSES, TERMINAL_STATUSES
from training_assets.orchestration.catalog import defs, get_instance, metadata_values
from training_assets.orchestration.vocabulary import PARTITION_TAG

MODULE = "training_assets.orchestration.local_runs"  # not __name__: the worker runs this file as __main__
DEFINITIONS_MODULE = "training_assets.definitions"
WORKER_PID_TAG = "training_assets/worker_pid"
DAEMON_FRESH_S = 60  # a heartbeat younger than this means a daemon is serving the instance
CANCEL_GRACE_S = 60  # a worker still running this long after a cancel is killed


def _reconstructable() -> Any:
    """The implicit job over every asset (``__ASSET_JOB``; a run selects what it materialises), as a
    pointer a worker process can load: ``training_assets.definitions:defs``."""
    return ReconstructableRepository.for_module(DEFINITIONS_MODULE, "defs").get_reconstructable_job(
        defs.resolve_implicit_global_asset_job_def().name)


def _daemon_heartbeating(instance: dg.DagsterInstance) -> bool:
    now = time.time()
    return any(now - beat.timestamp < DAEMON_FRESH_S for beat in instance.get_daemon_heartbeats().values())


def _create(instance: dg.DagsterInstance, recon: Any, assets: Sequence[str], run_config: Mapping[str, Any],
            tags: Mapping[str, str], partition: str | None) -> str:
    run_tags = {**tags, **({PARTITION_TAG: partition} if partition else {})}
    run = instance.create_run_for_job(  # validates the run config (DagsterInvalidConfigError)
        job_def=recon.get_definition(), run_config=dict(run_config), tags=run_tags,
        asset_selection={dg.AssetKey.from_user_string(a) for a in assets},
        job_code_origin=recon.get_python_origin(), status=dg.DagsterRunStatus.NOT_STARTED)
    return run.run_id


def _instance_for_launch() -> dg.DagsterInstance:
    instance = get_instance()
    if _daemon_heartbeating(instance):
        raise RuntimeError("a Dagster daemon is heartbeating on this instance and would dequeue the run too; "
                           "start the server with --dagster-url http://HOST:PORT to launch through it")
    return instance


def _spawn_worker(instance: dg.DagsterInstance, run_ids: Sequence[str]) -> None:
    log = Path(instance.root_directory) / "agent_workers" / f"{run_ids[-1]}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        # own session: the worker outlives the server that launched it, and a cancel signals it alone
        subprocess.Popen([sys.executable, "-m", MODULE, *run_ids], stdout=out, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, start_new_session=True, env=dict(os.environ))


def launch(assets: Sequence[str], run_config: Mapping[str, Any], tags: Mapping[str, str],
           partition: str | None = None, detach: bool = True) -> str:
    """Create a run of ``assets`` (NOT_STARTED) and have it executed: by a detached worker (returns at
    once), or in this process (``detach=False``, returns when the run has finished).

    Raises ``dg.DagsterInvalidConfigError`` for a run config the assets reject, ``RuntimeError``
    when a daemon serves this instance.
    """
    instance = _instance_for_launch()
    run_id = _create(instance, _reconstructable(), assets, run_config, tags, partition)
    if detach:
        _spawn_worker(instance, [run_id])
    else:
        execute(run_id)
    return run_id


def launch_sequence(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Create every run (``{"assets", "run_config", "tags", "partition"?}``) now, then one detached
    worker executes them in order; when one does not succeed, the later ones are canceled."""
    instance = _instance_for_launch()
    recon = _reconstructable()
    run_ids = [_create(instance, recon, r["assets"], r.get("run_config") or {}, r.get("tags") or {},
                       r.get("partition")) for r in runs]
    _spawn_worker(instance, run_ids)
    return run_ids


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt, which Dagster's execution turns into CANCELED for a CANCELING run."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def execute(run_id: str) -> str:
    """Execute the NOT_STARTED run ``run_id`` in this process; returns its final status."""
    instance = get_instance()
    instance.add_run_tags(run_id, {WORKER_PID_TAG: str(os.getpid())})
    run = instance.get_run_by_id(run_id)
    if run is None:
        raise ValueError(f"no run {run_id} in the instance at {instance.root_directory}")
    if run.status != dg.DagsterRunStatus.NOT_STARTED:
        return run.status.value  # canceled before it started, or already taken
    instance.report_dagster_event(dg.DagsterEvent(event_type_value=dg.DagsterEventType.RUN_STARTING.value,
                                                  job_name=run.job_name), run_id=run_id)
    with _sigterm_interrupts():
        try:
            execute_run(_reconstructable(), instance.get_run_by_id(run_id), instance)
        except KeyboardInterrupt:
            pass  # recorded by Dagster as CANCELED (or FAILURE when nobody asked to cancel)
    return instance.get_run_by_id(run_id).status.value


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) is not alive
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def _iso(timestamp: float | None) -> str | None:
    return None if timestamp is None else dt.datetime.fromtimestamp(timestamp, dt.timezone.utc).isoformat()


def _summary(record: Any) -> dict[str, Any]:
    run = record.dagster_run
    return {"run_id": run.run_id, "status": run.status.value, "tags": dict(run.tags),
            "assets": sorted(k.to_user_string() for k in (run.asset_selection or ())),
            "partition": run.tags.get(PARTITION_TAG), "created_at": _iso(record.create_timestamp.timestamp()),
            "started_at": _iso(record.start_time), "ended_at": _iso(record.end_time)}


def reap_dead_worker(instance: dg.DagsterInstance, record: Any) -> Any:
    """A run still in flight whose worker process is gone can never finish: record it failed (or
    canceled, when a cancel was asked for). A worker still alive CANCEL_GRACE_S after the cancel did
    not honour the interrupt: its process group is killed and the run recorded CANCELED."""
    run = record.dagster_run
    pid = run.tags.get(WORKER_PID_TAG)
    in_flight = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING)
    if run.status not in in_flight or not pid:
        return record
    alive = _process_alive(int(pid))
    if run.status == dg.DagsterRunStatus.CANCELING and alive:
        if time.time() - record.update_timestamp.timestamp() < CANCEL_GRACE_S:
            return record
        try:
            os.killpg(os.getpgid(int(pid)), signal.SIGKILL)
        except ProcessLookupError:
            pass
        instance.report_run_canceled(run, f"worker process {pid} did not stop within {CANCEL_GRACE_S} s of the "
                                          "cancel: killed")
    elif run.status == dg.DagsterRunStatus.CANCELING:
        instance.report_run_canceled(run, f"worker process {pid} exited while the run was canceling")
    elif not alive:
        instance.report_run_failed(run, f"worker process {pid} exited without finishing the run")
    else:
        return record
    return instance.get_run_record_by_id(run.run_id)


def get_run(run_id: str) -> dict[str, Any] | None:
    instance = get_instance()
    record = instance.get_run_record_by_id(run_id)
    return None if record is None else _summary(reap_dead_worker(instance, record))


def find_runs(tags: Mapping[str, str] | None = None, statuses: Iterable[str] | None = None,
              limit: int = 200) -> list[dict[str, Any]]:
    instance = get_instance()
    filters = dg.RunsFilter(tags=dict(tags or {}),
                            statuses=[dg.DagsterRunStatus(s) for s in statuses] if statuses else None)
    return [_summary(r) for r in instance.get_run_records(filters=filters, limit=limit)]


def in_flight(assets: Iterable[str]) -> list[dict[str, Any]]:
    """Runs QUEUED / STARTING / STARTED / CANCELING that materialise any of ``assets``."""
    instance = get_instance()
    wanted = set(assets)
    out = []
    for record in instance.get_run_records(filters=dg.RunsFilter(statuses=list(IN_FLIGHT_STATUSES))):
        record = reap_dead_worker(instance, record)
        summary = _summary(record)
        if summary["status"] in {s.value for s in IN_FLIGHT_STATUSES} and wanted & set(summary["assets"]):
            out.append(summary)
    return out


def _event_line(entry: Any) -> dict[str, Any]:
    event = entry.dagster_event
    return {"time": _iso(entry.timestamp), "level": logging.getLevelName(entry.level),
            "step": entry.step_key, "event": event.event_type_value if event is not None else "LOG",
            "message": (entry.message or "").strip()}


def run_events(run_id: str, max_lines: int = 20) -> dict[str, Any]:
    """The run's last log lines, every log line's message (for step metrics), its materialisations
    (asset, data version, metadata), its check evaluations and its failure messages."""
    instance = get_instance()
    entries = instance.all_logs(run_id)
    materializations, checks, failures = [], [], []
    for entry in entries:
        event = entry.dagster_event
        if event is None:
            continue
        if event.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION:
            m = event.event_specific_data.materialization
            materializations.append({"asset": m.asset_key.to_user_string(), "partition": m.partition,
                                     "data_version": m.tags.get("dagster/data_version") if m.tags else None,
                                     "metadata": metadata_values(m.metadata)})
        elif event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
            c = event.event_specific_data
            checks.append({"asset": c.asset_key.to_user_string(), "check": c.check_name, "passed": c.passed,
                           "description": c.description or "", "metadata": metadata_values(c.metadata or {})})
        elif event.event_type in (dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RUN_FAILURE):
            error = getattr(event.event_specific_data, "error", None)
            while error is not None and error.cause is not None:  # the user's exception, not Dagster's wrapper
                error = error.cause
            failures.append({"step": event.step_key, "message": (event.message or "").strip(),
                             "error": error.message.strip() if error is not None else None})
    lines = [_event_line(e) for e in entries]
    return {"log_lines": lines[-max_lines:],
            "messages": [(ln["step"], ln["message"]) for ln in lines if ln["event"] == "LOG"],
            "materializations": materializations, "checks": checks, "failures": failures}


def cancel(run_id: str) -> str:
    """Cancel a run: not started yet → CANCELED at once; STARTING/STARTED → CANCELING and its worker is interrupted."""
    instance = get_instance()
    record = instance.get_run_record_by_id(run_id)
    if record is None:
        raise KeyError(run_id)
    record = reap_dead_worker(instance, record)
    run = record.dagster_run
    if run.status in TERMINAL_STATUSES:
        raise ValueError(f"run {run_id} already finished with {run.status.value}: nothing to cancel")
    pid = run.tags.get(WORKER_PID_TAG)
    if run.status in (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED) or not pid:
        instance.report_run_canceled(run, "canceled through the agent surface (cancel_run) before it started")
    else:
        if run.status != dg.DagsterRunStatus.CANCELING:
            instance.report_run_canceling(run, "cancel requested through the agent surface (cancel_run)")
        try:
            # the whole group: Dagster defers the worker's interrupt while it waits on the Pipes training
            # subprocess, which SIGTERM stops directly (the step then fails, and CANCELING makes it CANCELED)
            os.killpg(os.getpgid(int(pid)), signal.SIGTERM)
        except ProcessLookupError:
            instance.report_run_canceled(run, f"worker process {pid} was already gone")
    return instance.get_run_by_id(run_id).status.value


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m training_assets.orchestration.local_runs RUN_ID [RUN_ID ...]", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    instance = get_instance()
    for i, run_id in enumerate(argv):
        status = execute(run_id)
        print(f"run {run_id}: {status}", flush=True)
        if status != dg.DagsterRunStatus.SUCCESS.value:
            for later in argv[i + 1:]:
                run = instance.get_run_by_id(later)
                if run is not None and run.status == dg.DagsterRunStatus.NOT_STARTED:
                    instance.report_run_canceled(run, f"not started: run {run_id} before it ended {status}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
