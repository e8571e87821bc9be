"""Where the agent surface's runs go and how it reads them back: the local instance, or a webserver.

    backend = LocalRuns()                                 # $DAGSTER_HOME, a detached worker per launch
    backend = GraphQLRuns("http://127.0.0.1:3000")        # a running dagster-webserver (production)
    run_id = backend.launch(["sft_checkpoint"], run_config, tags)
    report = run_report(backend, run_id)                  # status in Dagster's words, logs, metrics, outputs

Both answer the same questions with the same plain dicts. ``LocalRuns`` calls
``training_assets.defs.agent_catalog`` / ``agent_runs`` (the only place that imports dagster);
``GraphQLRuns`` (``graphql_runs.py``) speaks the webserver's public GraphQL API. The static graph
(keys, parents, config fields) always comes from this package's Definitions: the MCP server runs
the same code as the code location it drives.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from typing import Any, Protocol

from training_assets.agent.models import AssetOutput, CheckResult, LogLine, RunReport, StepMetrics

LAUNCHED_BY_TAG = "training_assets/launched_by"
PLANNED_STEPS_TAG = "training_assets/planned_steps"  # JSON {asset: planned optimizer steps}, for progress
WORKFLOW_TAG = "training_assets/workflow"
STAGE_TAG = "training_assets/stage"
TERMINAL = ("SUCCESS", "FAILURE", "CANCELED")
# `step 3 loss 5.1234 lr 3.00e-03 1234 tok/s eta 12s` (trainers.accelerate_launch, through Pipes);
# the loop's own log writes `step 3/8 loss ...`
STEP_LINE = re.compile(r"step (\d+)(?:/(\d+))? loss ([-+]?(?:[\d.]+(?:e[-+]?\d+)?|nan|inf))"
                       r"(?:.*?([\d.]+) tok/s)?(?:.*?eta ([\d.]+)s)?", re.IGNORECASE)


class RunBackend(Protocol):
    name: str

    def graph(self) -> dict[str, dict[str, Any]]: ...
    def config_class(self, asset: str) -> type | None: ...
    def asset_states(self, keys: Iterable[str] | None = None) -> dict[str, dict[str, Any]]: ...
    def launch(self, assets: Sequence[str], run_config: Mapping[str, Any], tags: Mapping[str, str],
               partition: str | None = None, wait: bool = False) -> str: ...
    def launch_sequence(self, runs: Sequence[dict[str, Any]]) -> list[str]: ...
    def get_run(self, run_id: str) -> dict[str, Any] | None: ...
    def run_events(self, run_id: str, max_lines: int = 20) -> dict[str, Any]: ...
    def find_runs(self, tags: Mapping[str, str]) -> list[dict[str, Any]]: ...
    def in_flight(self, assets: Iterable[str]) -> list[dict[str, Any]]: ...
    def cancel(self, run_id: str) -> str: ...
    def register_new_batches(self) -> list[str]: ...


class LocalRuns:
    """The instance at ``$DAGSTER_HOME``; each launch is executed by a detached worker process."""

    name = "local"

    @cached_property
    def _catalog(self) -> Any:
        from training_assets.defs import agent_catalog

        return agent_catalog

    @cached_property
    def _runs(self) -> Any:
        from training_assets.defs import agent_runs

        return agent_runs

    @cached_property
    def _graph(self) -> dict[str, dict[str, Any]]:
        return self._catalog.describe_graph()

    def graph(self) -> dict[str, dict[str, Any]]:
        return self._graph

    def config_class(self, asset: str) -> type | None:
        return self._catalog.config_class(asset)

    def asset_states(self, keys: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
        return self._catalog.asset_states(keys)

    def launch(self, assets: Sequence[str], run_config: Mapping[str, Any], tags: Mapping[str, str],
               partition: str | None = None, wait: bool = False) -> str:
        return self._runs.launch(list(assets), run_config, tags, partition=partition, detach=not wait)

    def launch_sequence(self, runs: Sequence[dict[str, Any]]) -> list[str]:
        return self._runs.launch_sequence(runs)

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        return self._runs.get_run(run_id)

    def run_events(self, run_id: str, max_lines: int = 20) -> dict[str, Any]:
        return self._runs.run_events(run_id, max_lines)

    def find_runs(self, tags: Mapping[str, str]) -> list[dict[str, Any]]:
        return self._runs.find_runs(tags)

    def in_flight(self, assets: Iterable[str]) -> list[dict[str, Any]]:
        return self._runs.in_flight(assets)

    def cancel(self, run_id: str) -> str:
        return self._runs.cancel(run_id)

    def register_new_batches(self) -> list[str]:
        return self._catalog.register_new_batches()

    def warm_up(self) -> None:
        """Import dagster and load the Definitions (a few seconds), so the first tool call is quick."""
        self.graph()
        _ = self._runs


def make_backend(dagster_url: str | None = None) -> RunBackend:
    if dagster_url:
        from training_assets.agent.graphql_runs import GraphQLRuns

        return GraphQLRuns(dagster_url)
    return LocalRuns()


def step_metrics(messages: Iterable[tuple[str | None, str]], planned: Mapping[str, int] | None = None) -> list[StepMetrics]:
    """The latest training-step line per asset from ``(step_key, message)`` log messages."""
    latest: dict[str | None, StepMetrics] = {}
    for step_key, message in messages:
        match = STEP_LINE.search(message or "")
        if not match:
            continue
        step, total, loss, tok_s, eta = match.groups()
        latest[step_key] = StepMetrics(
            asset=step_key, step=int(step), loss=float(loss),
            total_steps=int(total) if total else (planned or {}).get(step_key or ""),
            tokens_per_s=float(tok_s) if tok_s else None, eta_s=float(eta) if eta else None)
    return list(latest.values())


def _output(m: Mapping[str, Any]) -> AssetOutput:
    meta = dict(m.get("metadata") or {})
    uri = meta.get("checkpoint_uri") or meta.get("uri")
    return AssetOutput(asset=m["asset"], partition=m.get("partition"), data_version=m.get("data_version"),
                       uri=str(uri) if uri is not None else None, metadata=meta)


def run_report(backend: RunBackend, run_id: str, max_lines: int = 20) -> RunReport | None:
    """Everything ``get_run`` answers about a Dagster run, or None when the backend has no such run."""
    run = backend.get_run(run_id)
    if run is None:
        return None
    events = backend.run_events(run_id, max_lines)
    try:
        planned = json.loads(run["tags"].get(PLANNED_STEPS_TAG, "{}"))
    except ValueError:
        planned = {}
    outputs = [_output(m) for m in events["materializations"]]
    registry = next((o.metadata.get("version") for o in outputs if o.asset == "registry_entry"), None)
    failures = [f"{f['step'] or 'run'}: {f['error'] or f['message']}" for f in events["failures"]]
    return RunReport(
        run_id=run_id, status=run["status"], assets=run["assets"], partition=run.get("partition"), tags=run["tags"],
        created_at=run.get("created_at"), started_at=run.get("started_at"), ended_at=run.get("ended_at"),
        log_lines=[LogLine(**line) for line in events["log_lines"]],
        metrics=step_metrics(events["messages"], planned),
        outputs=outputs if run["status"] in TERMINAL else [],
        checks=[CheckResult(**c) for c in events["checks"]], failures=list(dict.fromkeys(failures)),
        registry_version=int(registry) if registry is not None else None)
