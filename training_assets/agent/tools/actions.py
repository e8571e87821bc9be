"""Plan-by-default for every mutating tool: the plan, the launch, the wait with progress.

    result = await run_action(ctx, "train_sft", config, options)

Plan (``options.execute`` false): the tool's config is mapped onto its assets and validated, the
asset states are read, and the result says what would run (and why), what is reused (with data
versions) and, for training, the trainer's own plan. Nothing is written and no run starts.
Execute: the same plan, then one Dagster run of what it said (preceded by one run per trace batch
not ingested yet, on the local instance); refused while a run of any of those assets is in flight.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import anyio
from mcp.server.mcpserver import Context
from pydantic import BaseModel, ValidationError

from training_assets.agent import graph_map
from training_assets.agent.errors import AgentError, ToolInputError
from training_assets.agent.models import ActionResult, ConfigField, Options, RunReport
from training_assets.agent.planning import ancestors, decide, pending_inbox_batches, training_plan
from training_assets.agent.runs import run_report
from training_assets.agent.runtime import Runtime
from training_assets.agent.tools.base import blocking, runtime
from training_assets.agent.tools.schemas import overrides
from training_assets.orchestration.vocabulary import LAUNCHED_BY_TAG, PLANNED_STEPS_TAG, TERMINAL

Scope = Literal["ancestors", "target"]
POLL_S = 2.0
TOOL_TAG = "training_assets/tool"


def validate_config(rt: Runtime, per_asset: dict[str, dict[str, Any]], where: str = "config") -> None:
    """Type and range checks by each asset's own ``dg.Config`` class, before anything launches."""
    for asset, values in per_asset.items():
        cls = rt.backend.config_class(asset)
        if cls is None:
            continue
        try:
            cls(**values)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"])
            raise ToolInputError(f"{where}.{field}", f"{err['msg']} (got {err.get('input')!r})") from None


def _config_fields(tool: str, assets: tuple[str, ...], graph: dict[str, Any]) -> dict[str, ConfigField]:
    accepted = graph_map.accepted_fields(tool, assets, graph)
    return {name: ConfigField(default=graph[asset]["config"][name]["default"],
                              description=graph[asset]["config"][name]["description"], asset=asset)
            for name, asset in sorted(accepted.items())}


def plan_action(rt: Runtime, tool: str, config: BaseModel | Mapping[str, Any] | None,
                assets: tuple[str, ...] | None = None, scope: Scope = "ancestors") -> ActionResult:
    """What ``tool`` would materialise with ``config`` (its typed input: only the fields set override)."""
    config = overrides(config)
    graph = rt.backend.graph()
    assets = assets or graph_map.tool_target(tool)
    per_asset = graph_map.to_run_config(tool, config, graph, assets)
    validate_config(rt, per_asset)
    for values in per_asset.values():
        graph_map.check_reach(values, "config")
    target = assets[-1]
    forced = {a: "config given" for a in per_asset}
    forced[target] = "config given" if target in per_asset else "requested"
    if scope == "ancestors":
        in_scope = ancestors(graph, list(forced))
    else:
        in_scope = [a for a in graph if a in forced]
    parents = {p for a in in_scope for p in graph[a]["parents"]}
    states = rt.backend.asset_states([a for a in graph if a in set(in_scope) | parents])
    if scope == "target":
        for parent in sorted(graph[target]["parents"]):
            if not states[parent]["materialized"]:
                raise AgentError(f"{parent} was never materialised, and {tool} does not build it: "
                                 f"{producer_hint(parent)} first")
    decision = decide(graph, states, in_scope, forced)
    result = ActionResult(
        tool=tool, executed=False, targets=[target], materialize=decision.materialize, reused=decision.reused,
        run_config=graph_map.dagster_run_config({a: per_asset.get(a, {}) for a in decision.assets}),
        config_fields=_config_fields(tool, assets, graph))
    partitioned = [a for a in in_scope if graph[a]["partitioned"]]
    if partitioned:
        info = (states["raw_traces"].get("partitions") or {}) if "raw_traces" in states else {}
        pending = pending_inbox_batches(rt.root, info.get("known", []))
        missing = sorted({m for a in partitioned for m in (states[a].get("partitions") or {}).get("missing", [])})
        result.details["trace_batches"] = {"known": info.get("total", 0), "not_ingested": missing,
                                           "new_in_inbox": pending}
        if (missing or pending) and rt.dagster_url:
            result.blocked.append(f"{len(missing) + len(pending)} trace batch(es) are not ingested yet; the daemon's "
                                  "trace_batch_sensor ingests them (one run per batch): wait for those runs")
        elif missing or pending:
            result.details["ingest_first"] = f"{len(missing) + len(pending)} trace batch(es) get one run each first"
        elif not info.get("total"):
            result.blocked.append(f"no trace batches: drop .jsonl(.gz) batches into {rt.root / 'inbox'} first")
    for step in decision.materialize:
        if step.asset in graph_map.CHECKPOINT_ASSETS and step.asset == target:
            effective = graph_map.effective_config(target, per_asset.get(target, {}), graph)
            plan, notes = training_plan(target, graph_map.train_config_fields(target, effective), rt.root,
                                        effective.get("limit_examples") or None, effective.get("num_processes", 1))
            result.training_plan = plan
            result.details["training_plan_notes"] = notes
    return result


def producer_hint(asset: str) -> str:
    """Which tool materialises ``asset``, as advice."""
    tools = [t for t, a in graph_map.TOOL_ASSETS.items() if a[-1] == asset]
    tools += [f"build_training_dataset(kind={k!r})" for k, a in graph_map.DATASET_KINDS.items() if a == asset]
    return f"materialise it with {tools[0]}" if tools else "materialise it with execute_workflow"


def launch_action(rt: Runtime, result: ActionResult) -> ActionResult:
    if result.blocked:
        raise AgentError(f"{result.tool} cannot run now: {result.blocked[0]}")
    assets = [s.asset for s in result.materialize]
    graph = rt.backend.graph()
    batches = result.details.get("trace_batches") or {}
    partitioned = [a for a in graph if graph[a]["partitioned"]] if batches else []
    busy = rt.backend.in_flight(assets + partitioned)
    if busy:
        run = busy[0]
        clash = sorted(set(run["assets"]) & set(assets + partitioned))
        raise AgentError(f"{clash[0]} is already being materialised by run {run['run_id']} ({run['status']}); "
                         "wait for it (get_run) or cancel it (cancel_run), then call again")
    tags = {LAUNCHED_BY_TAG: rt.launched_by, TOOL_TAG: result.tool}
    if result.training_plan is not None:
        tags[PLANNED_STEPS_TAG] = json.dumps({result.targets[-1]: result.training_plan.planned_steps})
    runs: list[dict[str, Any]] = []
    if batches.get("not_ingested") or batches.get("new_in_inbox"):
        rt.backend.register_new_batches()
        states = rt.backend.asset_states(partitioned)
        missing = sorted({m for a in partitioned for m in (states[a].get("partitions") or {}).get("missing", [])})
        runs = [{"assets": partitioned, "run_config": {}, "tags": tags, "partition": b} for b in missing]
    main = {"assets": assets, "run_config": result.run_config, "tags": tags}
    run_ids = rt.backend.launch_sequence(runs + [main]) if runs else [rt.backend.launch(assets, result.run_config, tags)]
    status = (rt.backend.get_run(run_ids[-1]) or {}).get("status")
    return result.model_copy(update={
        "executed": True, "run_id": run_ids[-1], "run_ids": run_ids, "status": status,
        "next_step": f"follow it with get_run(run_id={run_ids[-1]!r}) (wait_s waits with progress notifications)"})


def _progress_message(report: RunReport) -> str:
    head = f"run {report.run_id[:8]} {report.status}"
    if report.metrics:
        m = report.metrics[-1]
        total = f"/{m.total_steps}" if m.total_steps else ""
        extra = (f" {m.tokens_per_s:.0f} tok/s" if m.tokens_per_s else "") + (f" eta {m.eta_s:.0f}s" if m.eta_s else "")
        return f"{head}: {m.asset} step {m.step}{total} loss {m.loss:.4f}{extra}"
    return f"{head}: {report.log_lines[-1].message[:160]}" if report.log_lines else head


async def wait_runs(ctx: Context, rt: Runtime, run_ids: Sequence[str], wait_s: float,
                    reports: Callable[[], list[RunReport]] | None = None) -> list[RunReport]:
    """Poll until every run is terminal or ``wait_s`` passes, reporting progress (runs done, plus
    the current training run's step fraction) to a caller that sent a progress token."""
    fetch = reports or (lambda: [r for r in (run_report(rt.backend, i) for i in run_ids) if r is not None])
    deadline, best = time.monotonic() + wait_s, 0.0
    while True:
        current = await blocking(fetch)
        done = [r for r in current if r.status in TERMINAL]
        running = next((r for r in current if r.status not in TERMINAL), current[-1] if current else None)
        progress = float(len(done))
        if running is not None and running.status not in TERMINAL and running.metrics:
            m = running.metrics[-1]
            progress += min(m.step / m.total_steps, 0.99) if m.total_steps else 0.0
        best = max(best, progress)
        await ctx.report_progress(best, float(len(run_ids)), _progress_message(running) if running else None)
        if len(done) == len(current) or time.monotonic() >= deadline:
            return current
        await anyio.sleep(min(POLL_S, max(0.1, deadline - time.monotonic())))


async def finish(ctx: Context, rt: Runtime, result: ActionResult, options: Options) -> ActionResult:
    """Plan only, or launch and (with wait_s) wait; the result of the target run goes in ``run``."""
    if not options.execute:
        if result.blocked:
            result.next_step = f"cannot run yet: {result.blocked[0]}"
        else:
            result.next_step = 'plan only: nothing was written; call again with options {"execute": true} to run it'
        return result
    result = await blocking(launch_action, rt, result)
    if options.wait_s > 0:
        reports = await wait_runs(ctx, rt, result.run_ids, options.wait_s)
        target = next((r for r in reports if r.run_id == result.run_id), None)
        first_bad = next((r for r in reports if r.status in TERMINAL and r.status != "SUCCESS"), None)
        result.run = target
        result.status = (first_bad or target).status if (first_bad or target) else result.status
    return result


async def run_action(ctx: Context, tool: str, config: BaseModel | Mapping[str, Any] | None, options: Options | None,
                     assets: tuple[str, ...] | None = None, scope: Scope = "ancestors",
                     details: Callable[[Runtime, ActionResult], dict[str, Any]] | None = None) -> ActionResult:
    rt = runtime(ctx)
    options = options or Options()
    result = await blocking(plan_action, rt, tool, config, assets, scope)
    if details is not None:
        result.details.update(await blocking(details, rt, result))
    return await finish(ctx, rt, result, options)
