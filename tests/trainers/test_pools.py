"""The `training` pool: two training runs launched at once never train at the same time.

Two processes each execute a run against one instance configured by the project's own
``dagster_home/dagster.yaml`` (pools: default_limit 1, op granularity). Each run holds a step in
``TRAINING_POOL`` (the pool of every checkpoint asset) that trains for a moment; the event log's
step start/success times show the second step started only after the first finished, while both
runs were in progress at once (each started before the other's training step ended) and the
waiting one logged that the ``training`` pool's limit blocked it: the pool did the serialising,
not the timing of the two processes.

It runs on the production instance (``deploy/dagster.yaml``: PostgreSQL, same pool limits), on a
database of its own. On the embedded SQLite instance Dagster claims a slot with a SELECT and then
an UPDATE, whose ``FOR UPDATE SKIP LOCKED`` SQLite ignores: two steps starting within
milliseconds of each other can both take the one slot (seen once here, 26 ms apart, with four
test workers on two cores), so the guarantee is PostgreSQL's row lock.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from training_assets.defs.automation import TRAINING_POOL
from training_assets.defs.training import assets as training_assets

REPO = Path(__file__).resolve().parents[2]
HOLD_S = 5.0  # how long each stand-in training step holds the pool slot

RUN = f"""
import time, dagster as dg

@dg.asset(pool={TRAINING_POOL!r})
def stand_in_checkpoint(context):
    time.sleep({HOLD_S})

dg.materialize([stand_in_checkpoint], instance=dg.DagsterInstance.get())
"""


def _events(instance: dg.DagsterInstance, run_id: str, event_type: str) -> list:
    return [e for e in instance.all_logs(run_id) if e.dagster_event and e.dagster_event.event_type_value == event_type]


def test_every_checkpoint_asset_is_in_the_training_pool():
    for name in ("base_checkpoint", "sft_checkpoint", "dpo_checkpoint", "grpo_checkpoint", "merged_adapter"):
        assert getattr(training_assets, name).op.pool == TRAINING_POOL, name


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
    procs = [subprocess.Popen([sys.executable, "-c", RUN], env=dict(os.environ), cwd=home, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    for proc in procs:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out[-3000:]
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs()
        assert len(runs) == 2 and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        windows = sorted((_events(instance, r.run_id, "STEP_START")[0].timestamp,
                          _events(instance, r.run_id, "STEP_SUCCESS")[0].timestamp, r.run_id) for r in runs)
        (first_start, first_end, _), (second_start, second_end, second_run) = windows
        assert second_start >= first_end, f"training steps overlapped: {windows}"
        started = [_events(instance, r.run_id, "PIPELINE_START")[0].timestamp for r in runs]
        assert max(started) < first_end, f"the runs were not in progress at once: started {started}, {windows}"
        blocked = [e.dagster_event.message for e in _events(instance, second_run, "ENGINE_EVENT")
                   if f"blocked by limit for pool {TRAINING_POOL}" in (e.dagster_event.message or "")]
        assert blocked, "the waiting run never reported the training pool's limit"
