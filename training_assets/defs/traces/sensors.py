"""trace_batch_sensor: one partition and one run per new batch in the inbox."""

import json
import os

import dagster as dg

from training_assets import ingest
from training_assets.defs.partitions import trace_batches
from training_assets.defs.resources import DataRoot
from training_assets.traces import BatchError


# How often the daemon may tick the sensor; deployments and tests shorten it through the environment.
SENSOR_INTERVAL_S = int(os.environ.get("TRAINING_ASSETS_SENSOR_INTERVAL_S", "15"))


@dg.sensor(
    name="trace_batch_sensor",
    target=dg.AssetSelection.assets("raw_traces"),
    minimum_interval_seconds=SENSOR_INTERVAL_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Watches $TRAINING_ASSETS_DATA/inbox; each new (name, content) is a partition of trace_batches.",
)
def trace_batch_sensor(context: dg.SensorEvaluationContext, data_root: DataRoot) -> dg.SensorResult | dg.SkipReason:
    fingerprints = json.loads(context.cursor) if context.cursor else {}
    known = context.instance.get_dynamic_partitions(trace_batches.name)
    try:
        scan = ingest.scan_inbox(fingerprints, known, data_root.root())
    except BatchError as exc:  # a file changing under us: try again next tick, keep the cursor
        context.log.warning(str(exc))
        return dg.SkipReason(str(exc))
    for name, reason in scan.rejected:
        context.log.warning(f"inbox file {name!r} refused: {reason}; moved to inbox/_rejected/")
    if not scan.new:
        context.update_cursor(json.dumps(scan.fingerprints, sort_keys=True))
        return dg.SkipReason(f"no new batches ({len(scan.known)} known, {len(scan.rejected)} refused)")
    new_ids = [b.batch_id for b in scan.new]
    context.log.info(f"new trace batches: {new_ids}")
    return dg.SensorResult(
        # run_key = batch id: Dagster never launches a second run for the same batch
        run_requests=[dg.RunRequest(run_key=b, partition_key=b) for b in new_ids],
        dynamic_partitions_requests=[trace_batches.build_add_request(new_ids)],
        cursor=json.dumps(scan.fingerprints, sort_keys=True),
    )
