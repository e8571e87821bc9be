"""Which training assets a queued or running Dagster run may be writing: read by ``training-assets gc``.

    in_progress_runs({"sft_checkpoint"})   # [{"run_id", "status", "assets"}] for runs not finished yet

Opens the instance at ``$DAGSTER_HOME`` and nothing else (not the Definitions): the gc verb imports
it only when it runs, and stays quick. ``IN_FLIGHT_STATUSES`` / ``TERMINAL_STATUSES`` are the
shared status names (``vocabulary.py``) as Dagster's enum, for every module here that asks the instance.
"""

import dagster as dg

from training_assets.orchestration.vocabulary import IN_FLIGHT, TERMINAL

IN_FLIGHT_STATUSES = tuple(dg.DagsterRunStatus(s) for s in IN_FLIGHT)
TERMINAL_STATUSES = tuple(dg.DagsterRunStatus(s) for s in TERMINAL)


def in_progress_runs(assets: set[str]) -> list[dict[str, object]]:
    """Runs queued or in progress whose selection includes one of ``assets`` (a run with no selection: all)."""
    instance = dg.DagsterInstance.get()  # raises with the fix when DAGSTER_HOME is unset
    out = []
    for run in instance.get_runs(dg.RunsFilter(statuses=list(IN_FLIGHT_STATUSES))):
        selected = {k.to_user_string() for k in run.asset_selection} if run.asset_selection else set(assets)
        touched = sorted(selected & assets)
        if touched:
            out.append({"run_id": run.run_id, "status": run.status.value, "assets": touched})
    return out
