"""execute_workflow: the train_model workflow, planned by default, executed by a detached driver."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import Field

from training_assets.agent import workflow
from training_assets.agent.errors import AgentError
from training_assets.agent.models import Options, WorkflowReport
from training_assets.agent.runtime import Runtime
from training_assets.agent.tools.base import OptionsArg, blocking, runtime, tool
from training_assets.agent.tools.observe import wait_workflow
from training_assets.agent import workflow_driver


def _plan(rt: Runtime, name: str, task: dict[str, Any] | None) -> tuple[Any, Any, WorkflowReport]:
    spec = workflow.load_workflow(name)
    parsed = workflow.parse_task(spec, task, rt.backend.graph())
    return spec, parsed, workflow.plan_workflow(spec, parsed, rt.backend, rt.root)


def _start(rt: Runtime, spec: Any, task: Any, plan: WorkflowReport) -> WorkflowReport:
    running = workflow_driver.running_workflows(rt.root)
    if running:
        raise AgentError(f"workflow {running[0].workflow_id} is still running; follow it with get_run or stop it "
                         "with cancel_run, then call again")
    assets = sorted({s.asset for st in plan.stages for s in st.materialize})
    graph = rt.backend.graph()
    busy = rt.backend.in_flight(assets + [a for a in graph if graph[a]["partitioned"]])
    if busy:
        raise AgentError(f"{sorted(busy[0]['assets'])[0]} is already being materialised by run {busy[0]['run_id']} "
                         f"({busy[0]['status']}); wait for it (get_run) or cancel it (cancel_run), then call again")
    return workflow_driver.start(spec, task, rt.dagster_url, rt.launched_by, rt.root, plan.estimated_steps)


@tool("operate", "Run the train_model workflow")
async def execute_workflow(ctx: Context,
                           name: Annotated[str, Field(description="The workflow: train_model.")] = "train_model",
                           task: Annotated[dict[str, Any] | None, Field(description=(
                               'train: "sft" | "pretrain"; align: ["dpo", "grpo"]; config: asset key -> config '
                               '(e.g. {"sft_checkpoint": {"max_steps": 4}, "sft_eval_report": {"min_pass_rate": 0.5}}).'))] = None,
                           options: OptionsArg = None) -> WorkflowReport:
    """The train_model workflow: prepare_corpus -> curate -> train_tokenizer -> build_datasets -> train
    (sft | pretrain) -> eval + gate -> align (dpo, grpo) -> eval + gate -> merge_adapters -> final_eval
    + gate -> register_model. Plans by default (per stage: what runs and why, what is reused, the gate
    and its thresholds, the estimated training steps). Executed, a driver runs each stage as a Dagster
    run and stops at a failed gate (nothing is registered); the workflow id returns at once and get_run
    (or options.wait_s) follows it to the final report: per stage status, run ids, metrics, verdicts,
    and the registry version."""
    rt, options = runtime(ctx), options or Options()
    spec, task_model, plan = await blocking(_plan, rt, name, task)
    if not options.execute:
        plan.next_step = 'plan only: nothing was written; call again with options {"execute": true} to run it'
        return plan
    report = await blocking(_start, rt, spec, task_model, plan)
    if options.wait_s > 0:
        waited = await wait_workflow(ctx, rt, report.workflow_id or "", options.wait_s)
        report = waited.workflow or report
    report.next_step = (f"follow it with get_run(run_id={report.workflow_id!r}); cancel_run stops it"
                        if report.status == "RUNNING" else f"workflow {report.status}")
    return report
