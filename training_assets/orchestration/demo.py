"""The main job behind ``make demo``: sample traces → every asset, on the embedded instance.

    training-assets demo [--json]      # what `make demo` runs, with DAGSTER_HOME=dagster_home

Runs against ``$DAGSTER_HOME`` (the Makefile points it at ``dagster_home/``, SQLite), so what it
materialises is what ``make ui`` shows. Steps: write the sample batches into the inbox, tick
``trace_batch_sensor`` (adding a partition per new batch), materialise each missing
``raw_traces`` partition, then every other asset in one run in dependency order (blocking checks
stop their downstream assets). Idempotent: a second run re-ticks the sensor (nothing new) and
re-materialises the unpartitioned assets.
"""

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg

from training_assets import paths, sample_traces
from training_assets.orchestration.catalog import defs, get_instance, tick_sensor
from training_assets.orchestration.vocabulary import LAUNCHED_BY_TAG


def missing_partitions(instance: dg.DagsterInstance) -> dict[str, list[dg.AssetKey]]:
    """Partition key -> the partitioned assets (in dependency order) not yet materialised for it."""
    graph = defs.resolve_asset_graph()
    missing: dict[str, list[dg.AssetKey]] = {}
    for key in graph.toposorted_asset_keys:
        node = graph.get(key)
        if key not in graph.materializable_asset_keys or node.partitions_def is None:
            continue
        done = instance.get_materialized_partitions(key)
        for partition in node.partitions_def.get_partition_keys(dynamic_partitions_store=instance):
            if partition not in done:
                missing.setdefault(partition, []).append(key)
    return missing


def _materialize(instance: dg.DagsterInstance, keys: list[dg.AssetKey],
                 partition_key: str | None = None) -> dg.ExecuteInProcessResult:
    job = defs.resolve_implicit_global_asset_job_def()
    return job.execute_in_process(
        instance=instance, asset_selection=keys, partition_key=partition_key,
        run_config={"loggers": {"console": {"config": {"log_level": "INFO"}}}},
        tags={LAUNCHED_BY_TAG: "make-demo"}, raise_on_error=False,
    )


def _uri_of(instance: dg.DagsterInstance, key: dg.AssetKey) -> str | None:
    event = instance.get_latest_materialization_event(key)
    if event is None or event.asset_materialization is None:
        return None
    meta = event.asset_materialization.metadata
    for name in ("uri", "path", "output_uri", "checkpoint_uri"):
        if name in meta:
            return str(meta[name].value)
    return None


def run_demo(log: Callable[[str], None] = print) -> dict[str, Any]:
    """Materialise the whole graph on the sample traces; return a summary (also printed by the CLI)."""
    started = time.perf_counter()
    root = paths.data_root()
    written = sample_traces.write_samples(root)
    log(f"sample batches: {', '.join(Path(p).name for p in written['batches'])} -> {paths.inbox_dir(root)}")

    instance = get_instance()
    requested = tick_sensor(instance)
    log(f"sensor tick: {len(requested)} new partition(s) {requested}")

    failures: list[str] = []
    timings: dict[str, float] = {}
    for partition, keys in missing_partitions(instance).items():
        # one run per partition holding every partitioned asset, upstream first
        t0 = time.perf_counter()
        result = _materialize(instance, keys, partition)
        timings[f"partition {partition}"] = round(time.perf_counter() - t0, 2)
        names = ", ".join(k.to_user_string() for k in keys)
        if not result.success:
            failures.append(f"{names} [{partition}]")
        log(f"materialised {names} [{partition}]: {'ok' if result.success else 'FAILED'}")

    graph = defs.resolve_asset_graph()
    unpartitioned = [k for k in graph.toposorted_asset_keys if k in graph.materializable_asset_keys
                     and graph.get(k).partitions_def is None]
    if unpartitioned:
        t0 = time.perf_counter()
        result = _materialize(instance, unpartitioned)
        timings["unpartitioned assets"] = round(time.perf_counter() - t0, 2)
        for event in result.all_events:
            if event.is_step_failure or (event.event_type_value == "ASSET_CHECK_EVALUATION"
                                         and not event.event_specific_data.passed):
                failures.append(event.message or event.step_key or "step failure")
        log(f"materialised {len(unpartitioned)} unpartitioned asset(s): {'ok' if result.success else 'FAILED'}")

    outputs = {}
    for key in graph.toposorted_asset_keys:
        if key not in graph.materializable_asset_keys:
            continue
        if graph.get(key).partitions_def is not None:  # one folder per partition under the asset's folder
            done = len(instance.get_materialized_partitions(key))
            outputs[key.to_user_string()] = f"{paths.asset_dir(key.to_user_string(), root)} ({done} partitions)"
        else:
            outputs[key.to_user_string()] = _uri_of(instance, key)
    summary = {
        "data_root": str(root),
        "dagster_home": str(instance.root_directory),
        "outputs": outputs,
        "timings_s": timings,
        "failures": failures,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    log(json.dumps({"outputs": outputs}, indent=2))
    log("open the UI: make ui  ->  http://127.0.0.1:3000 (asset graph under 'Lineage')")
    return summary
