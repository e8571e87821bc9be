"""Which training assets a queued or running Dagster run may be writing: read by ``training-assets gc``.

Lives in defs/ because it asks the Dagster instance (``$DAGSTER_HOME``); the gc verb imports it
only when it runs, so the CLI's other verbs never load dagster.
"""

import dagster as dg

IN_PROGRESS = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
               dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]


def in_progress_runs(assets: set[str]) -> list[dict[str, object]]:
    """Runs queued or in progress whose selection includes one of ``assets`` (a run with no selection: all)."""
    instance = dg.DagsterInstance.get()  # raises with the fix when DAGSTER_HOME is unset
    out = []
    for run in instance.get_runs(dg.RunsFilter(statuses=IN_PROGRESS)):
        selected = {k.to_user_string() for k in run.asset_selection} if run.asset_selection else set(assets)
        touched = sorted(selected & assets)
        if touched:
            out.append({"run_id": run.run_id, "status": run.status.value, "assets": touched})
    return out
