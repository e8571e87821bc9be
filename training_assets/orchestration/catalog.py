"""The asset graph and each asset's state, as the agent surface (``training_assets.agent``) reads them.

    graph = describe_graph()                    # key -> parents, checks, config fields (from the Definitions)
    states = asset_states(["sft_checkpoint"])   # key -> last materialisation, data version, stale, checks
    tick_sensor(instance)                       # one tick of trace_batch_sensor, as the daemon would

The agent package never imports dagster; it reaches this module through ``backends.LocalRuns``
and gets plain dicts back. Everything is read from the Definitions and the instance at
``$DAGSTER_HOME``: nothing here is a hand-kept list of assets.
"""

from __future__ import annotations

import datetime as dt
import inspect
import os
from collections.abc import Iterable, Mapping
from typing import Any

import dagster as dg
# Private: stale status has no public Python API in Dagster 1.13 (see _stale_resolver).
from dagster._core.definitions.data_version import CachingStaleStatusResolver
from dagster._core.loader import LoadingContext

from training_assets.definitions import defs

# Metadata longer than this (plots are base64 PNGs in Markdown) is left to the UI.
MAX_METADATA_CHARS = 1500


def get_instance() -> dg.DagsterInstance:
    """The instance at ``$DAGSTER_HOME``, opened once per process and home (opening runs storage checks)."""
    home = os.environ.get("DAGSTER_HOME", "")
    if not home:
        raise RuntimeError("DAGSTER_HOME is not set: export DAGSTER_HOME=<repo>/dagster_home (the instance runs go to), "
                           "or start the server with --dagster-url http://HOST:PORT")
    if home not in _INSTANCES:
        _INSTANCES[home] = dg.DagsterInstance.get()
    return _INSTANCES[home]


_INSTANCES: dict[str, dg.DagsterInstance] = {}


def _config_fields(assets_def: dg.AssetsDefinition) -> dict[str, dict[str, Any]]:
    schema = assets_def.op.config_schema
    if schema is None or not hasattr(schema.config_type, "fields"):
        return {}
    out = {}
    for name, field in schema.config_type.fields.items():
        out[name] = {"default": field.default_value if field.default_provided else None,
                     "required": field.is_required, "description": field.description or ""}
    return out


def config_class(key: str) -> type | None:
    """The asset's ``dg.Config`` class (a pydantic model), for validating a tool's config before launch.

    Dagster keeps only the derived config schema on the op; the class is the annotation of the
    asset function's ``config`` parameter.
    """
    fn = getattr(defs.resolve_assets_def(key).op.compute_fn, "decorated_fn", None)
    param = inspect.signature(fn).parameters.get("config") if fn is not None else None
    annotation = param.annotation if param is not None else None
    return annotation if isinstance(annotation, type) and issubclass(annotation, dg.Config) else None


def describe_graph() -> dict[str, dict[str, Any]]:
    """Every materialisable asset in dependency order: group, description, partitioned, parents,
    children, code version, op tags, check specs and config fields (with defaults and help)."""
    graph = defs.resolve_asset_graph()
    out: dict[str, dict[str, Any]] = {}
    for key in graph.toposorted_asset_keys:
        if key not in graph.materializable_asset_keys:
            continue
        node = graph.get(key)
        assets_def = defs.resolve_assets_def(key)
        out[key.to_user_string()] = {
            "group": node.group_name,
            "description": node.description or "",
            "partitioned": node.partitions_def is not None,
            "parents": sorted(k.to_user_string() for k in node.parent_keys),
            "children": sorted(k.to_user_string() for k in node.child_keys),
            "code_version": node.code_version,
            "op_tags": dict(assets_def.op.tags or {}),
            "checks": [{"name": s.name, "blocking": s.blocking, "description": s.description or ""}
                       for s in assets_def.check_specs],
            "config": _config_fields(assets_def),
        }
    return out


def metadata_values(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Metadata as JSON-able values; plots and other long Markdown are dropped (they live in the UI)."""
    out = {}
    for name, value in metadata.items():
        raw = getattr(value, "value", value)
        if isinstance(raw, (dg.AssetKey,)):
            raw = raw.to_user_string()
        if isinstance(raw, str) and (len(raw) > MAX_METADATA_CHARS or "data:image" in raw):
            continue
        if isinstance(raw, (str, int, float, bool, type(None), list, dict)):
            out[name] = raw
        else:
            out[name] = str(raw)
    return out


def _iso(timestamp: float | None) -> str | None:
    return None if timestamp is None else dt.datetime.fromtimestamp(timestamp, dt.timezone.utc).isoformat()


class _Loading(LoadingContext):
    """The loading context the stale-status resolver asks for: the instance and a loader cache."""

    def __init__(self, instance: dg.DagsterInstance) -> None:
        self._instance, self._loaders = instance, {}

    @property
    def instance(self) -> dg.DagsterInstance:
        return self._instance

    @property
    def loaders(self) -> dict:
        return self._loaders


def _stale_resolver(instance: dg.DagsterInstance, graph: Any) -> Any:
    """Dagster's own stale-status resolver (what the UI shows).

    No public Python API exposes stale status in Dagster 1.13: its public face is the GraphQL
    ``staleStatus`` / ``staleCauses`` fields, which the ``--dagster-url`` path reads. Locally we
    call the resolver behind those fields (dagster is pinned exactly, see pyproject.toml).
    """
    return CachingStaleStatusResolver(instance, graph, _Loading(instance))


def _cause(cause: Any) -> str:
    """``<asset>: <reason> (<dependency>)``, e.g. ``dpo_checkpoint: has a new dependency data version (preference_pairs)``."""
    dependency = f" ({cause.dependency.asset_key.to_user_string()})" if cause.dependency is not None else ""
    return f"{cause.key.asset_key.to_user_string()}: {cause.reason}{dependency}"


def _check_state(instance: dg.DagsterInstance, key: dg.AssetKey, name: str) -> dict[str, Any]:
    record = instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(key, name))
    if record is None:
        return {"name": name, "status": "NOT_EVALUATED", "passed": None, "description": "", "run_id": None,
                "metadata": {}}
    evaluation = record.event.dagster_event.event_specific_data if record.event and record.event.dagster_event else None
    passed = getattr(evaluation, "passed", None)
    return {"name": name, "status": record.status.value, "passed": passed, "run_id": record.run_id,
            "description": getattr(evaluation, "description", None) or "",
            "metadata": metadata_values(getattr(evaluation, "metadata", {}) or {})}


def asset_states(keys: Iterable[str] | None = None, instance: dg.DagsterInstance | None = None) -> dict[str, dict[str, Any]]:
    """key -> materialised?, when, by which run, data version, stale status (FRESH | STALE | MISSING)
    with its causes, partitions (partitioned assets), the latest result of each check, and the
    latest materialisation's metadata."""
    graph = defs.resolve_asset_graph()
    instance = instance or get_instance()
    resolver = _stale_resolver(instance, graph)
    wanted = list(keys) if keys is not None else [k.to_user_string() for k in graph.toposorted_asset_keys
                                                  if k in graph.materializable_asset_keys]
    out = {}
    for name in wanted:
        key = dg.AssetKey.from_user_string(name)
        node = graph.get(key)
        event = instance.get_latest_materialization_event(key)
        materialization = event.asset_materialization if event is not None else None
        state: dict[str, Any] = {
            "asset": name, "materialized": materialization is not None,
            "last_materialized_at": _iso(event.timestamp) if event is not None else None,
            "run_id": event.run_id if event is not None else None,
            "data_version": materialization.tags.get("dagster/data_version") if materialization else None,
            "metadata": metadata_values(materialization.metadata) if materialization else {},
            "partitions": None,
            "checks": [_check_state(instance, key, spec.name) for spec in defs.resolve_assets_def(key).check_specs],
        }
        if node.partitions_def is not None:
            known = node.partitions_def.get_partition_keys(dynamic_partitions_store=instance)
            done = instance.get_materialized_partitions(key)
            missing = sorted(set(known) - set(done))
            state["partitions"] = {"total": len(known), "materialized": len(known) - len(missing), "missing": missing,
                                   "known": sorted(known)}
            state["stale_status"] = "MISSING" if missing or not known else "FRESH"
            state["stale_causes"] = [f"{len(missing)} partition(s) not materialised"] if missing else []
        else:
            state["stale_status"] = resolver.get_status(key).value
            state["stale_causes"] = [_cause(c) for c in resolver.get_stale_causes(key)]
        out[name] = state
    return out


def tick_sensor(instance: dg.DagsterInstance, sensor_name: str = "trace_batch_sensor") -> list[str]:
    """Evaluate one sensor tick and apply its partition requests, as the daemon would; returns the
    partition keys it requested runs for.

    The sensor is invoked directly: ``evaluate_tick`` validates run requests against partitions
    that only exist once the same tick's ``dynamic_partitions_requests`` are applied.
    """
    sensor = defs.resolve_sensor_def(sensor_name)
    context = dg.build_sensor_context(instance=instance, definitions=defs, sensor_name=sensor_name,
                                      resources=dict(defs.resources or {}))
    result = sensor(context)
    if not isinstance(result, dg.SensorResult):
        return []
    for request in result.dynamic_partitions_requests or ():
        if isinstance(request, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return [r.partition_key for r in result.run_requests or () if r.partition_key]


def register_new_batches(instance: dg.DagsterInstance | None = None) -> list[str]:
    """One tick of ``trace_batch_sensor`` (as the daemon would): new inbox batches become partitions."""
    return tick_sensor(instance or get_instance())
