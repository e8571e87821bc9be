"""trace_batch_sensor: one partition and one run per new batch in the inbox.

A tick only lists the inbox and ``lstat``s each entry (``inbox.scan_inbox``): the partition key
comes from (name, size, mtime), so a tick never reads a batch, whatever its size. Hashing and
copying happen inside the ``raw_traces`` run. The cursor maps each file name to the key already
requested for it; ``run_key`` = the key, so a tick evaluated again (a daemon restart, a lost
cursor) never starts a second run for the same file.
"""

import json
import os

import dagster as dg

from training_assets import inbox
from training_assets.defs.partitions import trace_batches
from training_assets.defs.resources import DataRoot

# How often the daemon may tick the sensor; deployments and tests shorten it through the environment.
SENSOR_INTERVAL_S = int(os.environ.get("TRAINING_ASSETS_SENSOR_INTERVAL_S", "15"))


@dg.sensor(
    name="trace_batch_sensor",
    target=dg.AssetSelection.assets("raw_traces"),
    minimum_interval_seconds=SENSOR_INTERVAL_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Watches $TRAINING_ASSETS_DATA/inbox; each new (name, size, mtime) is a partition of trace_batches.",
)
def trace_batch_sensor(context: dg.SensorEvaluationContext, data_root: DataRoot) -> dg.SensorResult | dg.SkipReason:
    seen = json.loads(context.cursor) if context.cursor else {}
    scan = inbox.scan_inbox(seen, root=data_root.root())
    if scan.reject_error:
        context.log.error(scan.reject_error)
    where = "left in the inbox" if scan.reject_error else "moved to inbox/_rejected/"
    for name, reason in scan.rejected:
        context.log.warning(f"inbox file {name!r} refused: {reason}; {where}")
    partitions = set(context.instance.get_dynamic_partitions(trace_batches.name))
    # Not in the cursor: new, or added by a tick that never got to its runs (a crash in between),
    # or the cursor was lost. A partition that already has a run is done; the others get one.
    new_ids = [b.batch_id for b in scan.new if b.batch_id not in partitions or not _has_run(context, b.batch_id)]
    cursor = json.dumps(scan.seen, sort_keys=True)
    if not new_ids:
        context.update_cursor(cursor)
        return dg.SkipReason(f"no new batches ({len(scan.seen)} known, {len(scan.rejected)} refused)")
    context.log.info(f"{len(new_ids)} new trace batch(es): {', '.join(new_ids[:10])}{' ...' if len(new_ids) > 10 else ''}")
    return dg.SensorResult(
        # run_key = batch id: Dagster never launches a second run for the same batch
        run_requests=[dg.RunRequest(run_key=b, partition_key=b) for b in new_ids],
        dynamic_partitions_requests=[trace_batches.build_add_request([b for b in new_ids if b not in partitions])],
        cursor=cursor,
    )


def _has_run(context: dg.SensorEvaluationContext, batch_id: str) -> bool:
    return context.instance.get_runs_count(dg.RunsFilter(tags={"dagster/partition": batch_id})) > 0
