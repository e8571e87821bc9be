"""The `training` pool: two training runs launched at once never train at the same time.

Two processes each execute a run against one instance configured by the project's
``deploy/dagster.yaml`` (PostgreSQL on a database of its own; pools: default_limit 1, op
granularity). Each run holds a step in ``TRAINING_POOL`` that trains for a moment inside
``training_slot``, as every checkpoint asset does; the event log's step start/success times show
the second step started training only after the first finished, while both runs were in progress
at once (each started before the other's training step ended), and the waiting one logged what
held it: the pool's limit, or — when both steps claimed the pool's one slot within milliseconds,
which Dagster 1.13 allows on PostgreSQL and SQLite alike (seen here: steps 1.7 ms apart both
claimed it) — the slot lock on the data root (``training_assets.slots``).
"""

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import pytest

from training_assets.defs.automation import TRAINING_POOL
from training_assets.defs.training import assets as training_assets
from training_assets.slots import hold_slot

REPO = Path(__file__).resolve().parents[2]
HOLD_S = 5.0  # how long each stand-in training step holds the pool slot

RUN = f"""
import sys, time, dagster as dg
from pathlib import Path
from training_assets.defs.training.assets import training_slot

@dg.asset(pool={TRAINING_POOL!r})
def stand_in_checkpoint(context):
    with training_slot(context, Path(sys.argv[1])):
        context.log.info("training starts")
        time.sleep({HOLD_S})
        context.log.info("training ends")

dg.materialize([stand_in_checkpoint], instance=dg.DagsterInstance.get())
"""


def _events(instance: dg.DagsterInstance, run_id: str, event_type: str) -> list:
    return [e for e in instance.all_logs(run_id) if e.dagster_event and e.dagster_event.event_type_value == event_type]


def test_every_checkpoint_asset_is_in_the_training_pool():
    for asset in [*training_assets.checkpoint_assets, training_assets.merged_adapter]:
        assert asset.op.pool == TRAINING_POOL, asset.key


@pytest.fixture
def production_home(tmp_path, monkeypatch, postgres_databases):
    """``deploy/dagster.yaml`` on a fresh database of the local PostgreSQL, dropped afterwards."""
    with postgres_databases("ta_pools") as db:
        shutil.copyfile(REPO / "deploy" / "dagster.yaml", tmp_path / "dagster.yaml")
        env = {"DAGSTER_HOME": str(tmp_path), "DAGSTER_PG_HOST": "127.0.0.1", "DAGSTER_PG_PORT": "5432",
               "DAGSTER_PG_DB": db, "DAGSTER_PG_USER": "postgres", "DAGSTER_PG_PASSWORD": "",
               "DAGSTER_DEQUEUE_INTERVAL_SECONDS": "1", "DAGSTER_STORAGE_DIR": str(tmp_path / "storage")}
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        yield tmp_path


@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_two_training_runs_at_once_do_not_overlap(production_home):
    home = production_home
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.get_concurrency_config().pool_config.default_pool_limit == 1
        instance.get_runs()  # create the storage once, before two processes open it
        # The pool's row, from dagster.yaml's default_limit, made once: Dagster 1.13 makes it lazily
        # at a step's first claim, and two processes doing that at the same moment on PostgreSQL
        # abort one run (InFailedSqlTransaction after a caught IntegrityError; dagster-io/dagster#33599)
        instance.event_log_storage.initialize_concurrency_limit_to_default(TRAINING_POOL)
    procs = [subprocess.Popen([sys.executable, "-c", RUN, str(home / "data")], env=dict(os.environ), cwd=home,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    for proc in procs:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out[-3000:]
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs()
        assert len(runs) == 2 and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        windows = sorted((_logged(instance, r.run_id, "training starts"), _logged(instance, r.run_id, "training ends"),
                          r.run_id) for r in runs)
        (first_start, first_end, _), (second_start, second_end, second_run) = windows
        assert second_start >= first_end, f"training overlapped: {windows}"
        started = [_events(instance, r.run_id, "PIPELINE_START")[0].timestamp for r in runs]
        assert max(started) < first_end, f"the runs were not in progress at once: started {started}, {windows}"
        held = [e.user_message for e in instance.all_logs(second_run)
                if f"blocked by limit for pool {TRAINING_POOL}" in e.user_message
                or f"{TRAINING_POOL!r} slot(s) under" in e.user_message]
        assert held, "the waiting run never reported what held it (the pool's limit or the slot lock)"


def _logged(instance: dg.DagsterInstance, run_id: str, message: str) -> float:
    return next(e.timestamp for e in instance.all_logs(run_id) if e.user_message == message)


def test_slots_admit_at_most_limit_holders_at_once(tmp_path):
    """Threads stand in for processes: each ``open`` is its own file description, which ``flock`` locks apart."""
    intervals, lock = [], threading.Lock()

    def worker():
        with hold_slot(tmp_path, "training", limit=2, poll_s=0.01) as slot:
            start = time.monotonic()
            time.sleep(0.2)
            with lock:
                intervals.append((start, time.monotonic(), slot))

    threads = [threading.Thread(target=worker) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(intervals) == 5
    most = max(sum(1 for s, e, _ in intervals if s <= t < e) for t, _, _ in intervals)
    assert most == 2, intervals  # two at once, never three
    assert {slot for _, _, slot in intervals} == {0, 1}


def test_a_killed_holder_frees_its_slot_at_once(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from training_assets.slots import hold_slot\n"
        "with hold_slot(sys.argv[1], 'training'):\n    print('held', flush=True); time.sleep(600)"), str(tmp_path)],
        stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        waits: list[str] = []
        done = threading.Event()

        def take():
            with hold_slot(tmp_path, "training", poll_s=0.01, on_wait=waits.append):
                done.set()

        taker = threading.Thread(target=take)
        taker.start()
        time.sleep(0.3)
        assert not done.is_set() and waits and "waiting for one" in waits[0]
        holder.send_signal(signal.SIGKILL)
        assert done.wait(10), "the slot stayed held after its holder was killed"
        taker.join(10)
        assert waits[-1].startswith("got 'training' slot 0 after waiting")
    finally:
        holder.kill()
        holder.wait()


def test_slot_limit_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="limit must be >= 1, got 0"):
        with hold_slot(tmp_path, "training", limit=0):
            pass
