"""Reading the platform and stopping runs: list_assets, get_run (with progress while it waits), cancel_run."""

from __future__ import annotations

import time
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import Context
from pydantic import Field

from training_assets.agent.errors import ToolInputError
from training_assets.agent.models import AssetList, AssetState, CancelResult, CheckResult, RunLookup, WorkflowReport
from training_assets.agent.runs import run_report
from training_assets.agent.runtime import Runtime
from training_assets.agent.tools.actions import wait_runs
from training_assets.agent.tools.base import blocking, runtime, tool
from training_assets.agent import workflow_driver
from training_assets.orchestration.vocabulary import TERMINAL

RunIdArg = Annotated[str, Field(description="A Dagster run id a tool returned, or a workflow id (wf-...).")]


def asset_state(graph: dict[str, Any], key: str, state: dict[str, Any]) -> AssetState:
    """An asset's state as tools answer it: the backend's plain dict, its checks as CheckResults."""
    checks = [CheckResult(asset=key, check=c["name"], passed=c.get("passed"), description=c.get("description") or "",
                          metadata=c.get("metadata") or {}) for c in state.get("checks", [])]
    return AssetState(**{**state, "checks": checks, "group": graph[key]["group"], "description": graph[key]["description"]})


def _list(rt: Runtime, keys: list[str] | None, group: str | None) -> AssetList:
    graph = rt.backend.graph()
    unknown = sorted(set(keys or ()) - set(graph))
    if unknown:
        raise ToolInputError("keys", f"unknown asset {unknown[0]!r}; one of {sorted(graph)}")
    groups = sorted({v["group"] for v in graph.values()})
    if group is not None and group not in groups:
        raise ToolInputError("group", f"unknown group {group!r}; one of {groups}")
    wanted = [k for k in graph if (not keys or k in keys) and (group is None or graph[k]["group"] == group)]
    states = rt.backend.asset_states(wanted)
    return AssetList(assets=[asset_state(graph, key, states[key]) for key in wanted])


@tool("read", "List assets and their state")
async def list_assets(ctx: Context,
                      keys: Annotated[list[str] | None, Field(description="Only these asset keys.")] = None,
                      group: Annotated[str | None, Field(description="Only this group (traces, corpus, ...).")] = None
                      ) -> AssetList:
    """Every asset with its last materialisation (time, run), data version, stale status (FRESH,
    STALE with its causes, MISSING), partitions and the latest result of each of its checks."""
    return await blocking(_list, runtime(ctx), keys, group)


def _workflow(rt: Runtime, workflow_id: str) -> RunLookup:
    report = workflow_driver.read_report(rt.root, workflow_id)
    if report is None:
        raise ToolInputError("run_id", f"no workflow {workflow_id!r} under {rt.root / 'workflows'}; "
                                       "pass the workflow_id execute_workflow returned")
    current = next((s.run_ids[-1] for s in report.stages if s.status == "RUNNING" and s.run_ids), None)
    if current is not None:
        report.current_run = run_report(rt.backend, current)
    status = {"PLANNED": "NOT_STARTED", "RUNNING": "STARTED", "SUCCESS": "SUCCESS", "CANCELED": "CANCELED"}
    return RunLookup(run_id=workflow_id, status=status.get(report.status, "FAILURE"), workflow=report,
                     registry_version=report.registry_version,
                     failures=[report.reason] if report.status not in ("RUNNING", "SUCCESS") and report.reason else [])


def _run(rt: Runtime, run_id: str, max_lines: int) -> RunLookup:
    if run_id.startswith("wf-"):
        return _workflow(rt, run_id)
    report = run_report(rt.backend, run_id, max_lines)
    if report is None:
        raise ToolInputError("run_id", f"no run {run_id!r} in {rt.where()}; pass a run_id a tool returned "
                                       "(list_assets shows each asset's last run)")
    return RunLookup(**report.model_dump())


@tool("read", "A run's status, logs, metrics and outputs")
async def get_run(ctx: Context, run_id: RunIdArg,
                  wait_s: Annotated[float, Field(ge=0, le=7200, description=(
                      "Wait up to this long for the run to finish, with progress notifications; 0: answer now."))] = 0,
                  max_log_lines: Annotated[int, Field(ge=1, le=500, description="Log lines to return.")] = 20
                  ) -> RunLookup:
    """A Dagster run: status in Dagster's words (QUEUED, STARTED, SUCCESS, FAILURE, CANCELED, ...), the
    last log lines, training step metrics (loss, tokens/s, ETA), check results and, when done, the
    outputs (checkpoint URI, report, registry version). A workflow id gives the workflow's report."""
    rt = runtime(ctx)
    report = await blocking(_run, rt, run_id, max_log_lines)
    if wait_s > 0 and report.status not in TERMINAL:
        if run_id.startswith("wf-"):
            return await wait_workflow(ctx, rt, run_id, wait_s)
        reports = await wait_runs(ctx, rt, [run_id], wait_s, lambda: [_run(rt, run_id, max_log_lines)])
        report = reports[-1]
    return report


async def wait_workflow(ctx: Context, rt: Runtime, workflow_id: str, wait_s: float) -> RunLookup:
    """Wait for a workflow, one progress unit per stage (plus the current run's step fraction)."""
    deadline, best = time.monotonic() + wait_s, 0.0
    while True:
        report = await blocking(_workflow, rt, workflow_id)
        wf: WorkflowReport = report.workflow
        done = sum(s.status not in ("PENDING", "RUNNING") for s in wf.stages)
        current = next((s for s in wf.stages if s.status == "RUNNING"), None)
        progress, message = float(done), f"workflow {wf.status}"
        if current is not None:
            message = f"stage {current.name} ({current.owner})"
            run = wf.current_run
            if run is not None and run.metrics and run.metrics[-1].total_steps:
                progress += min(run.metrics[-1].step / run.metrics[-1].total_steps, 0.99)
                message += f": {run.metrics[-1].asset} step {run.metrics[-1].step}/{run.metrics[-1].total_steps}"
            elif run is not None and run.log_lines:
                message += f": {run.log_lines[-1].message[:120]}"
        best = max(best, progress)
        await ctx.report_progress(best, float(len(wf.stages)), message)
        if wf.status != "RUNNING" or time.monotonic() >= deadline:
            return report
        await anyio.sleep(2.0)


def _cancel(rt: Runtime, run_id: str) -> CancelResult:
    if run_id.startswith("wf-"):
        report = workflow_driver.read_report(rt.root, run_id)
        if report is None:
            raise ToolInputError("run_id", f"no workflow {run_id!r}")
        if report.status != "RUNNING":
            raise ToolInputError("run_id", f"workflow {run_id} already ended {report.status}: nothing to cancel")
        workflow_driver.request_cancel(rt.root, run_id)
        for stage in report.stages:
            if stage.status == "RUNNING" and stage.run_ids:
                run = rt.backend.get_run(stage.run_ids[-1])
                if run is not None and run["status"] not in TERMINAL:
                    rt.backend.cancel(stage.run_ids[-1])
        return CancelResult(run_id=run_id, status="CANCELING")
    if rt.backend.get_run(run_id) is None:
        raise ToolInputError("run_id", f"no run {run_id!r} in {rt.where()}")
    return CancelResult(run_id=run_id, status=rt.backend.cancel(run_id))


@tool("operate", "Cancel a run")
async def cancel_run(ctx: Context, run_id: RunIdArg) -> CancelResult:
    """Cancel a run (not started: CANCELED at once; running: CANCELING, then CANCELED) or a workflow
    (its current run is canceled and no later stage starts)."""
    return await blocking(_cancel, runtime(ctx), run_id)
