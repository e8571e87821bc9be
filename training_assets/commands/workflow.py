"""Verbs: ``workflow run`` (plan by default; ``--execute`` runs it) and ``workflow status``.

    training-assets workflow run train_model                                   # the plan: stages, reuse, steps
    training-assets workflow run train_model --execute                         # run it, print each stage
    training-assets workflow run train_model --execute --detach --json         # the workflow id at once
    training-assets workflow run train_model --set sft_checkpoint.max_steps=4 --task '{"train": "pretrain"}'
    training-assets workflow status wf-3f2a9c1b7d4e

The same planner and driver as the MCP tool ``execute_workflow``; runs are tagged
``training_assets/launched_by = cli:workflow`` (``--dagster-url`` sends them to a webserver).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from training_assets import paths
from training_assets.agent.errors import AgentError
from training_assets.commands import emit, fail
from training_assets.commands.training import _parse_sets


def _task(args: argparse.Namespace) -> dict[str, Any]:
    task = json.loads(args.task) if args.task else {}
    for key, value in _parse_sets(args.set or []).items():  # asset.field=value
        if not isinstance(value, dict):
            raise ValueError(f"--set {key}={value!r}: expected ASSET.FIELD=VALUE (e.g. sft_checkpoint.max_steps=4)")
        task.setdefault("config", {}).setdefault(key, {}).update(value)
    return task


def _lines(report: Any) -> list[str]:
    steps = "unknown" if report.estimated_steps is None else report.estimated_steps
    out = [f"{report.name} {report.workflow_id or ''} {report.status} (estimated training steps: {steps})"]
    for stage in report.stages:
        runs = f" runs {', '.join(r[:8] for r in stage.run_ids)}" if stage.run_ids else ""
        todo = ", ".join(f"{s.asset} ({s.reason})" for s in stage.materialize) or "-"
        out.append(f"  {stage.name:<16} {stage.owner:<18} {stage.status:<11} run: {todo}{runs}")
        out += [f"      gate {g.report}.{g.check}: {'passed' if g.passed else 'FAILED' if g.passed is False else 'pending'}"
                f"{' - ' + '; '.join(g.reasons) if g.reasons else ''}" for g in stage.gates]
    if report.reason:
        out.append(f"  stopped at {report.stopped_at}: {report.reason}")
    if report.registry_version is not None:
        out.append(f"  registry version: {report.registry_version}")
    return out


def _run(args: argparse.Namespace) -> int:
    from training_assets.agent import workflow, workflow_driver  # the agent package: ~0.2 s on every --help
    from training_assets.agent.runs import make_backend  # the agent package
    from training_assets.agent.runtime import Runtime  # the agent package

    rt = Runtime(backend=make_backend(args.dagster_url), dagster_url=args.dagster_url)
    try:
        spec = workflow.load_workflow(args.name)
        task = workflow.parse_task(spec, _task(args), rt.backend.graph())
        plan = workflow.plan_workflow(spec, task, rt.backend, rt.root)
        if not args.execute:
            emit(args, plan.model_dump(mode="json"), "\n".join(_lines(plan) + ["(plan only; add --execute to run it)"]))
            return 0
        if workflow_driver.running_workflows(rt.root):
            return fail("a workflow is still running (training-assets workflow status ID); wait for it first")
        report = workflow_driver.start(spec, task, args.dagster_url, "cli:workflow", rt.root, plan.estimated_steps)
    except (AgentError, ValueError, FileNotFoundError) as exc:
        return fail(str(exc))
    if args.detach:
        emit(args, report.model_dump(mode="json"), f"started {report.workflow_id}; follow it with "
                                                    f"`training-assets workflow status {report.workflow_id}`")
        return 0
    seen: dict[str, str] = {}
    while True:
        time.sleep(2.0)
        report = workflow_driver.read_report(rt.root, report.workflow_id or "")
        for stage in report.stages:
            if seen.get(stage.name) != stage.status and stage.status != "PENDING" and not args.json:
                print(f"{stage.name}: {stage.status}", flush=True)
            seen[stage.name] = stage.status
        if report.status != "RUNNING":
            break
    emit(args, report.model_dump(mode="json"), "\n".join(_lines(report)))
    return 0 if report.status == "SUCCESS" else 1


def _status(args: argparse.Namespace) -> int:
    from training_assets.agent import workflow_driver  # the agent package: ~0.2 s on every --help

    report = workflow_driver.read_report(paths.data_root(), args.workflow_id)
    if report is None:
        return fail(f"no workflow {args.workflow_id} under {paths.data_root() / 'workflows'}")
    emit(args, report.model_dump(mode="json"), "\n".join(_lines(report)))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("workflow", help="plan (default) or run the train_model workflow")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    r = actions.add_parser("run", help="plan the workflow; --execute runs it stage by stage")
    r.add_argument("name", help="workflow name (train_model)")
    r.add_argument("--execute", action="store_true", help="run it (without it only the plan is printed)")
    r.add_argument("--task", default=None, help='task JSON: {"train": "sft"|"pretrain", "align": [...], "config": {...}}')
    r.add_argument("--set", action="append", metavar="ASSET.FIELD=VALUE", help="config of one asset (repeatable)")
    r.add_argument("--detach", action="store_true", help="with --execute: print the workflow id and return")
    r.add_argument("--dagster-url", default=None, help="launch runs through this Dagster webserver")
    r.add_argument("--json", action="store_true", help="machine-readable report")
    r.set_defaults(handler=_run)
    s = actions.add_parser("status", help="a workflow's report")
    s.add_argument("workflow_id", help="wf-... (printed by workflow run --execute)")
    s.add_argument("--json", action="store_true", help="machine-readable report")
    s.set_defaults(handler=_status)
