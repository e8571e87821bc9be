"""Runs through a running Dagster webserver (the production path): its public GraphQL API.

    backend = GraphQLRuns("http://127.0.0.1:3000")
    run_id = backend.launch(["sft_checkpoint"], run_config, tags)   # submitted; the webserver's coordinator runs it

Launching and terminating go through ``dagster_graphql.DagsterGraphQLClient``; reading runs, logs
and asset states (stale status and causes, data versions, partitions, check executions) are plain
GraphQL queries against ``<url>/graphql``. The static graph comes from this package's Definitions,
as for the local backend. New trace batches are registered by the daemon's ``trace_batch_sensor``.
``dagster_graphql`` and ``requests`` are imported when a call needs them: building the backend (at
the MCP server's start) must stay quick.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from typing import Any

from training_assets.orchestration.backends import LocalRuns
from training_assets.orchestration.vocabulary import IN_FLIGHT, PARTITION_TAG, TERMINAL

META = """fragment Meta on MetadataEntry { label __typename
  ... on TextMetadataEntry { text } ... on IntMetadataEntry { intRepr } ... on FloatMetadataEntry { floatRepr }
  ... on BoolMetadataEntry { boolValue } ... on PathMetadataEntry { path } ... on JsonMetadataEntry { jsonString }
  ... on MarkdownMetadataEntry { mdStr } ... on UrlMetadataEntry { url } }"""
RUN_FIELDS = "runId status tags { key value } assetSelection { path } creationTime startTime endTime"
ASSETS_QUERY = META + """
query($keys: [AssetKeyInput!]) { assetNodes(assetKeys: $keys) {
  assetKey { path } isPartitioned partitionKeys dataVersion staleStatus
  staleCauses { key { path } reason dependency { path } }
  assetPartitionStatuses { __typename ... on DefaultPartitionStatuses { materializedPartitions } }
  assetMaterializations(limit: 1) { runId timestamp partition tags { key value } metadataEntries { ...Meta } }
  assetChecksOrError { __typename ... on AssetChecks { checks { name
    executionForLatestMaterialization { runId status evaluation { success description metadataEntries { ...Meta } } } } } }
} }"""
RUN_QUERY = f"""query($id: ID!) {{ runOrError(runId: $id) {{ __typename ... on Run {{ {RUN_FIELDS} }}
  ... on RunNotFoundError {{ message }} ... on PythonError {{ message }} }} }}"""
RUNS_QUERY = f"""query($filter: RunsFilter) {{ runsOrError(filter: $filter, limit: 500) {{ __typename
  ... on Runs {{ results {{ {RUN_FIELDS} }} }} ... on PythonError {{ message }} }} }}"""
LOGS_QUERY = META + """
query($id: ID!, $cursor: String) { logsForRun(runId: $id, afterCursor: $cursor, limit: 2000) { __typename
  ... on EventConnection { cursor hasMore events { __typename
    ... on MessageEvent { message timestamp level stepKey eventType }
    ... on MaterializationEvent { assetKey { path } partition tags { key value } metadataEntries { ...Meta } }
    ... on AssetCheckEvaluationEvent { evaluation { checkName assetKey { path } success description
                                                    metadataEntries { ...Meta } } }
    ... on ExecutionStepFailureEvent { error { message cause { message } } }
    ... on RunFailureEvent { error { message } } } }
  ... on RunNotFoundError { message } ... on PythonError { message } } }"""


def _value(entry: Mapping[str, Any]) -> Any:
    kind = entry["__typename"]
    if kind == "IntMetadataEntry":
        return int(entry["intRepr"])
    if kind == "FloatMetadataEntry":
        return float(entry["floatRepr"])
    if kind == "JsonMetadataEntry":
        return json.loads(entry["jsonString"])
    for key in ("text", "boolValue", "path", "mdStr", "url"):
        if key in entry:
            return entry[key]
    return None


def _metadata(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out = {}
    for entry in entries or ():
        value = _value(entry)
        if isinstance(value, str) and (len(value) > 1500 or "data:image" in value):
            continue  # plots and long tables stay in the UI
        out[entry["label"]] = value
    return out


def _iso(seconds: float | str | None) -> str | None:
    if seconds in (None, ""):
        return None
    value = float(seconds)
    value = value / 1000 if value > 1e11 else value  # event timestamps are milliseconds
    return dt.datetime.fromtimestamp(value, dt.timezone.utc).isoformat()


def _key(node: Mapping[str, Any] | None) -> str:
    return "/".join(node["path"]) if node else ""


def _run(node: Mapping[str, Any]) -> dict[str, Any]:
    tags = {t["key"]: t["value"] for t in node["tags"]}
    return {"run_id": node["runId"], "status": node["status"], "tags": tags,
            "assets": sorted(_key(k) for k in node.get("assetSelection") or []), "partition": tags.get(PARTITION_TAG),
            "created_at": _iso(node.get("creationTime")), "started_at": _iso(node.get("startTime")),
            "ended_at": _iso(node.get("endTime"))}


class GraphQLRuns:
    """A Dagster webserver at ``url`` (``http://host:port``); see the module docstring."""

    name = "graphql"

    def __init__(self, url: str, timeout_s: float = 60.0) -> None:
        parsed = urllib.parse.urlparse(url if "://" in url else f"http://{url}")
        if not parsed.hostname:
            raise ValueError(f"--dagster-url {url!r}: expected http://HOST:PORT")
        self.url, self.timeout_s = f"{parsed.scheme}://{parsed.netloc}{parsed.path.rstrip('/')}", timeout_s
        self._parsed = parsed
        self._local = LocalRuns()  # the static graph: the same Definitions the webserver's code location loads

    @cached_property
    def client(self) -> Any:
        from dagster_graphql import DagsterGraphQLClient  # dagster: seconds; the MCP server starts without it

        return DagsterGraphQLClient(self._parsed.hostname, port_number=self._parsed.port,
                                    use_https=self._parsed.scheme == "https", timeout=int(self.timeout_s))

    def query(self, text: str, **variables: Any) -> dict[str, Any]:
        import requests  # ~0.1 s, only when a webserver is queried

        response = requests.post(f"{self.url}/graphql", json={"query": text, "variables": variables},
                                 timeout=self.timeout_s)
        response.raise_for_status()
        body = response.json()
        if body.get("errors"):
            raise RuntimeError(f"Dagster GraphQL at {self.url}: {body['errors'][0].get('message')}")
        return body["data"]

    def graph(self) -> dict[str, dict[str, Any]]:
        return self._local.graph()

    def config_class(self, asset: str) -> type | None:
        return self._local.config_class(asset)

    def warm_up(self) -> None:
        self.graph()

    def asset_states(self, keys: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
        graph = self.graph()
        wanted = list(keys) if keys is not None else list(graph)
        nodes = self.query(ASSETS_QUERY, keys=[{"path": k.split("/")} for k in wanted])["assetNodes"]
        out = {}
        for node in nodes:
            key = _key(node["assetKey"])
            latest = (node.get("assetMaterializations") or [None])[0]
            checks = []
            for check in (node["assetChecksOrError"].get("checks") or []):
                execution = check.get("executionForLatestMaterialization") or {}
                evaluation = execution.get("evaluation") or {}
                checks.append({"name": check["name"], "status": execution.get("status", "NOT_EVALUATED"),
                               "passed": evaluation.get("success"), "description": evaluation.get("description") or "",
                               "run_id": execution.get("runId"), "metadata": _metadata(evaluation.get("metadataEntries"))})
            state = {"asset": key, "materialized": latest is not None, "run_id": latest["runId"] if latest else None,
                     "last_materialized_at": _iso(latest["timestamp"]) if latest else None,
                     "data_version": node.get("dataVersion"), "metadata": _metadata(latest["metadataEntries"]) if latest else {},
                     "partitions": None, "checks": checks, "stale_status": node.get("staleStatus") or "MISSING",
                     "stale_causes": [f"{_key(c['key'])}: {c['reason']}" + (f" ({_key(c['dependency'])})"
                                      if c.get("dependency") else "") for c in node.get("staleCauses") or []]}
            if node["isPartitioned"]:
                known = node.get("partitionKeys") or []
                done = set((node.get("assetPartitionStatuses") or {}).get("materializedPartitions") or [])
                missing = sorted(set(known) - done)
                state["partitions"] = {"total": len(known), "materialized": len(known) - len(missing),
                                       "missing": missing, "known": sorted(known)}
                state["stale_status"] = "MISSING" if missing or not known else "FRESH"
                state["stale_causes"] = [f"{len(missing)} partition(s) not materialised"] if missing else []
            out[key] = state
        return out

    def launch(self, assets: Sequence[str], run_config: Mapping[str, Any], tags: Mapping[str, str],
               partition: str | None = None, wait: bool = False) -> str:
        from dagster_graphql import DagsterGraphQLClientError  # dagster: seconds; the MCP server starts without it

        run_tags = {**tags, **({PARTITION_TAG: partition} if partition else {})}
        try:
            run_id = self.client.submit_job_execution("__ASSET_JOB", run_config=dict(run_config), tags=run_tags,
                                                      asset_selection=list(assets))
        except DagsterGraphQLClientError as exc:
            raise RuntimeError(f"the webserver at {self.url} refused the run: {exc}; {exc.body or ''}") from None
        while wait:
            if (self.get_run(run_id) or {}).get("status") in TERMINAL:
                break
            time.sleep(2.0)
        return run_id

    def launch_sequence(self, runs: Sequence[dict[str, Any]]) -> list[str]:
        raise RuntimeError("several dependent runs cannot be submitted at once to a webserver; "
                           "the daemon's trace_batch_sensor ingests new batches")

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        node = self.query(RUN_QUERY, id=run_id)["runOrError"]
        return _run(node) if node["__typename"] == "Run" else None

    def run_events(self, run_id: str, max_lines: int = 20) -> dict[str, Any]:
        events, cursor = [], None
        while True:
            page = self.query(LOGS_QUERY, id=run_id, cursor=cursor)["logsForRun"]
            if page["__typename"] != "EventConnection":
                break
            events += page["events"]
            cursor = page["cursor"]
            if not page["hasMore"]:
                break
        lines, materializations, checks, failures = [], [], [], []
        for e in events:
            kind = e["__typename"]
            line = {"time": _iso(e.get("timestamp")), "level": e.get("level") or "INFO", "step": e.get("stepKey"),
                    "event": e.get("eventType") or "LOG", "message": (e.get("message") or "").strip()}
            lines.append(line)
            if kind == "MaterializationEvent":
                tags = {t["key"]: t["value"] for t in e.get("tags") or []}
                materializations.append({"asset": _key(e["assetKey"]), "partition": e.get("partition"),
                                         "data_version": tags.get("dagster/data_version"),
                                         "metadata": _metadata(e.get("metadataEntries"))})
            elif kind == "AssetCheckEvaluationEvent":
                ev = e["evaluation"]
                checks.append({"asset": _key(ev["assetKey"]), "check": ev["checkName"], "passed": ev["success"],
                               "description": ev.get("description") or "", "metadata": _metadata(ev.get("metadataEntries"))})
            elif kind in ("ExecutionStepFailureEvent", "RunFailureEvent"):
                error = e.get("error") or {}
                while error.get("cause"):
                    error = error["cause"]
                failures.append({"step": e.get("stepKey"), "message": line["message"],
                                 "error": (error.get("message") or "").strip() or None})
        return {"log_lines": lines[-max_lines:],
                "messages": [(ln["step"], ln["message"]) for ln in lines if ln["event"] == "LOG"],
                "materializations": materializations, "checks": checks, "failures": failures}

    def find_runs(self, tags: Mapping[str, str]) -> list[dict[str, Any]]:
        data = self.query(RUNS_QUERY, filter={"tags": [{"key": k, "value": v} for k, v in tags.items()]})["runsOrError"]
        return [_run(r) for r in data.get("results", [])]

    def in_flight(self, assets: Iterable[str]) -> list[dict[str, Any]]:
        data = self.query(RUNS_QUERY, filter={"statuses": list(IN_FLIGHT)})["runsOrError"]
        wanted = set(assets)
        return [r for r in (_run(n) for n in data.get("results", [])) if wanted & set(r["assets"])]

    def cancel(self, run_id: str) -> str:
        from dagster_graphql import DagsterGraphQLClientError  # dagster: seconds; the MCP server starts without it

        run = self.get_run(run_id)
        if run is None:
            raise KeyError(run_id)
        if run["status"] in TERMINAL:
            raise ValueError(f"run {run_id} already finished with {run['status']}: nothing to cancel")
        try:
            self.client.terminate_run(run_id)
        except DagsterGraphQLClientError as exc:
            raise RuntimeError(f"the webserver at {self.url} could not terminate run {run_id}: {exc}") from None
        return (self.get_run(run_id) or {}).get("status", "CANCELING")

    def register_new_batches(self) -> list[str]:
        return []  # the daemon's trace_batch_sensor registers new batches in production
