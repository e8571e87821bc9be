"""The ``train_model`` workflow: its declaration (``workflows/train_model.yaml``), a task's stages, the plan.

    spec = load_workflow("train_model")
    task = parse_task(spec, {"train": "sft", "config": {"sft_checkpoint": {"max_steps": 4}}}, graph)
    plan = plan_workflow(spec, task, backend, root)     # per stage: what runs, what is reused, the gate

Each stage is one Dagster run of the stage's assets (``prepare_corpus``: one run per trace batch);
its gate is the blocking asset check named in the YAML. Executing is ``workflow_driver``'s job.
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from training_assets import kinds
from training_assets.agent import graph_map
from training_assets.agent.errors import ToolInputError
from training_assets.agent.models import GateVerdict, StageReport, Task, WorkflowReport
from training_assets.agent.planning import decide, pending_inbox_batches, training_plan

WORKFLOW_DIR = Path(__file__).resolve().parent / "workflows"


class Gate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    asset: str
    check: str


class Variant(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    tool: str | None = None
    assets: tuple[str, ...]
    force: tuple[str, ...] = ()
    gates: tuple[Gate, ...] = ()


class Stage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    owner: str
    tool: str | None = None
    assets: tuple[str, ...] = ()
    gates: tuple[Gate, ...] = ()
    help: str = ""
    choose: str | None = Field(None, description="The task key whose value picks the variant(s).")
    variants: dict[str, Variant] = Field(default_factory=dict)


class TaskKey(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    choices: tuple[str, ...] = ()
    default: Any = None
    multiple: bool = False
    help: str = ""


class WorkflowSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    team: str
    description: str
    task: dict[str, TaskKey]
    stages: tuple[Stage, ...]


class ResolvedStage(BaseModel):
    """A stage for one task: the tools, assets, forced assets and gates of the chosen variant(s)."""

    name: str
    owner: str
    tools: list[str]
    assets: list[str]
    force: list[str] = Field(default_factory=list)
    gates: list[Gate] = Field(default_factory=list)


def _fill(template: Any, kind: kinds.TrainingKind, where: str) -> Any:
    """``template`` with ``{attr}`` replaced by the kind's names (``{checkpoint}`` -> ``dpo_checkpoint``)."""
    if isinstance(template, dict):
        return {k: _fill(v, kind, where) for k, v in template.items()}
    if isinstance(template, list):
        return [_fill(v, kind, where) for v in template]
    if not isinstance(template, str):
        return template
    names = {f.name: getattr(kind, f.name) for f in dataclasses.fields(kind)}
    missing = [n for n in string.Formatter().parse(template) if n[1] and names.get(n[1]) is None]
    if missing:
        raise ValueError(f"{where}: kind {kind.name} has no {missing[0][1]}; leave it out of the choices")
    return template.format(**names)


def _expand_kinds(raw: dict[str, Any]) -> dict[str, Any]:
    """Task keys with ``kinds_except`` choose among the kinds table's kinds; stages with ``each_kind``
    get one variant per choice of their ``choose`` key, filled from the kind's row."""
    task = {key: dict(meta) for key, meta in (raw.get("task") or {}).items()}
    for meta in task.values():
        if "kinds_except" in meta:
            left_out = meta.pop("kinds_except")
            meta["choices"] = [k for k in kinds.KIND_NAMES if k not in left_out]
    stages = []
    for stage in raw.get("stages") or ():
        stage = dict(stage)
        if "each_kind" in stage:
            template = stage.pop("each_kind")
            choices = task.get(stage.get("choose") or "", {}).get("choices", ())
            stage["variants"] = {c: _fill(template, kinds.kind(c), f"stage {stage['name']}") for c in choices}
        stages.append(stage)
    return {**raw, "task": task, "stages": stages}


@lru_cache(maxsize=None)
def load_workflow(name: str = "train_model") -> WorkflowSpec:
    path = WORKFLOW_DIR / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in WORKFLOW_DIR.glob("*.yaml"))
        raise ToolInputError("name", f"unknown workflow {name!r}; choose one of {known}")
    return WorkflowSpec(**_expand_kinds(yaml.safe_load(path.read_text(encoding="utf-8"))))


def parse_task(spec: WorkflowSpec, task: dict[str, Any] | None, graph: dict[str, Any]) -> Task:
    """Validate a task against the workflow's task keys and each asset's config fields."""
    task = dict(task or {})
    unknown = sorted(set(task) - set(spec.task))
    if unknown:
        raise ToolInputError(f"task.{unknown[0]}", f"unknown task key; {spec.name} takes {sorted(spec.task)}")
    values: dict[str, Any] = {}
    for key, meta in spec.task.items():
        if key == "config":
            continue
        value = task.get(key, meta.default)
        chosen = value if isinstance(value, list) else [value]
        if meta.multiple is False and isinstance(value, list):
            raise ToolInputError(f"task.{key}", f"one of {list(meta.choices)}, not a list")
        bad = [v for v in chosen if v not in meta.choices]
        if bad or not chosen:
            raise ToolInputError(f"task.{key}", f"{bad or value!r} is not one of {list(meta.choices)}")
        values[key] = sorted(set(chosen)) if meta.multiple else value
    config = task.get("config") or {}
    if not isinstance(config, dict):
        raise ToolInputError("task.config", "an object mapping an asset key to its config")
    per_asset = {}
    for asset, fields in config.items():
        if asset not in graph:
            raise ToolInputError(f"task.config.{asset}", f"unknown asset; one of {sorted(graph)}")
        per_asset[asset] = graph_map.asset_run_config(asset, fields, graph, f"task.config.{asset}")
        graph_map.check_reach(per_asset[asset], f"task.config.{asset}")
    return Task(train=values["train"], align=values["align"], config=per_asset)


def resolve_stages(spec: WorkflowSpec, task: Task) -> list[ResolvedStage]:
    out = []
    for stage in spec.stages:
        if not stage.variants:
            out.append(ResolvedStage(name=stage.name, owner=stage.owner, tools=[stage.tool] if stage.tool else [],
                                     assets=list(stage.assets), gates=list(stage.gates)))
            continue
        picked = getattr(task, stage.choose or "")
        variants = [stage.variants[v] for v in (picked if isinstance(picked, list) else [picked])]
        out.append(ResolvedStage(
            name=stage.name, owner=stage.owner,
            tools=sorted({v.tool or stage.tool for v in variants if v.tool or stage.tool}),
            assets=[a for v in variants for a in v.assets], force=[a for v in variants for a in v.force],
            gates=[g for v in variants for g in v.gates]))
    return out


def forced_assets(stage: ResolvedStage, task: Task) -> dict[str, str]:
    forced = {a: "forced by the task (train=pretrain)" for a in stage.force}
    forced.update({a: "config given" for a in stage.assets if a in task.config})
    return forced


def check_merge_inputs(task: Task, states: dict[str, Any]) -> None:
    """The TIES merge needs both adapters: one left out of ``align`` must already exist."""
    for kind in ("dpo", "grpo"):
        asset = f"{kind}_checkpoint"
        if kind not in task.align and not states.get(asset, {}).get("materialized"):
            raise ToolInputError("task.align", f"merge_adapters needs {asset}, which align={task.align} does not "
                                               f"train and was never materialised; add {kind!r} to task.align")


def gate_thresholds(effective: dict[str, Any]) -> dict[str, Any]:
    """The eval report's gate thresholds out of its effective config."""
    names = ("min_pass_rate", "min_category_pass_rate", "max_bpb_vs_uniform", "max_bits_per_byte", "max_regression")
    return {k: effective[k] for k in names if k in effective}


def stored_verdict(gate: Gate, state: Mapping[str, Any]) -> GateVerdict:
    """The gate's latest evaluation as the instance recorded it, with the thresholds it was judged against."""
    for check in state.get("checks", []):
        if check["name"] == gate.check:
            reasons = [r.strip() for r in (check.get("description") or "").split(";") if r.strip()]
            return GateVerdict(report=gate.asset, check=gate.check, passed=check.get("passed"), reasons=reasons,
                               run_id=check.get("run_id"), thresholds=(check.get("metadata") or {}).get("thresholds") or {})
    return GateVerdict(report=gate.asset, check=gate.check, passed=None, reasons=["the gate was never evaluated"])


def _shown(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def reevaluation(gate: Gate, state: Mapping[str, Any], thresholds: Mapping[str, Any]) -> str | None:
    """Why a stored verdict no longer holds: it was reached against other thresholds than ``thresholds``
    (those in force now), e.g. ``failed at min_pass_rate 0.500 (pass rate 0.250); now min_pass_rate
    0.000 -> will re-evaluate``; None when it still holds or was never reached.

    Dagster's staleness ignores config, so a report judged at another threshold looks fresh: its
    verdict would stick (a gate failed at 0.5 would stop every later run at 0.0) without this.
    """
    stored = stored_verdict(gate, state)
    if stored.passed is None:
        return None
    changed = [k for k, v in thresholds.items() if k in stored.thresholds and stored.thresholds[k] != v]
    if not changed:
        return None
    rate = (state.get("metadata") or {}).get("pass_rate")
    measured = f" (pass rate {rate:.3f})" if isinstance(rate, int | float) else ""
    was = ", ".join(f"{k} {_shown(stored.thresholds[k])}" for k in changed)
    now = ", ".join(f"{k} {_shown(thresholds[k])}" for k in changed)
    return f"{'passed' if stored.passed else 'failed'} at {was}{measured}; now {now} -> will re-evaluate"


def gate_reevaluations(stage: ResolvedStage, task: Task, states: Mapping[str, Any],
                       graph: Mapping[str, Any]) -> dict[str, str]:
    """The stage's eval reports whose stored verdict was reached under other thresholds than the
    task's: asset -> why it runs again (``reevaluation``)."""
    out = {}
    for gate in (g for g in stage.gates if g.asset in stage.assets):
        effective = graph_map.effective_config(gate.asset, task.config.get(gate.asset, {}), graph)
        why = reevaluation(gate, states.get(gate.asset, {}), gate_thresholds(effective))
        if why is not None:
            out[gate.asset] = why
    return out


def plan_workflow(spec: WorkflowSpec, task: Task, backend: Any, root: Path) -> WorkflowReport:
    """Per stage: what would run and why, what is reused, the gate and its thresholds, training plans."""
    graph = backend.graph()
    states = backend.asset_states()
    check_merge_inputs(task, states)
    will_run: set[str] = set()
    stages, steps, unknown = [], 0, False
    for stage in resolve_stages(spec, task):
        regate = gate_reevaluations(stage, task, states, graph)
        decision = decide(graph, states, stage.assets, forced_assets(stage, task) | regate, will_run)
        report = StageReport(name=stage.name, owner=stage.owner, tools=stage.tools, materialize=decision.materialize,
                             reused=decision.reused)
        if any(graph[a]["partitioned"] for a in stage.assets):
            known = (states.get("raw_traces", {}).get("partitions") or {}).get("known", [])
            missing = {m for a in stage.assets if graph[a]["partitioned"]
                       for m in (states.get(a, {}).get("partitions") or {}).get("missing", [])}
            pending = pending_inbox_batches(root, known)
            report.partitions = sorted(missing | set(pending))
            if report.partitions:
                will_run.update(a for a in stage.assets if graph[a]["partitioned"])
                report.notes.append(f"{len(pending)} new inbox batch(es) to register; "
                                    f"{len(report.partitions)} batch(es) to ingest, one run each")
        for step in report.materialize:
            if step.asset in graph_map.CHECKPOINT_ASSETS:
                effective = graph_map.effective_config(step.asset, task.config.get(step.asset, {}), graph)
                plan, notes = training_plan(step.asset, graph_map.train_config_fields(step.asset, effective), root,
                                            effective.get("limit_examples") or None, effective.get("num_processes", 1))
                report.notes.extend(notes)
                if plan is not None:
                    steps += plan.planned_steps
                    report.training_plan = plan
                elif effective.get("max_steps", 0) > 0:
                    steps += effective["max_steps"]
                else:  # epochs over a dataset not built yet: its size, so the steps, are not known
                    unknown = True
        for gate in stage.gates:
            report.gates.append(_planned_verdict(gate, task, states.get(gate.asset, {}), decision.assets, regate, graph))
        stages.append(report)
    return WorkflowReport(name=spec.name, executed=False, status="PLANNED", task=task, stages=stages,
                          estimated_steps=None if unknown else steps)


def _planned_verdict(gate: Gate, task: Task, state: Mapping[str, Any], runs: list[str], regate: Mapping[str, str],
                     graph: Mapping[str, Any]) -> GateVerdict:
    """What the plan says of a gate: pending when its report runs (and why, when it runs again
    because the thresholds changed), else the stored verdict the workflow will stop or go on by."""
    thresholds = gate_thresholds(graph_map.effective_config(gate.asset, task.config.get(gate.asset, {}), graph))
    if gate.asset in runs:
        return GateVerdict(report=gate.asset, check=gate.check, passed=None, thresholds=thresholds,
                           reasons=[regate[gate.asset]] if gate.asset in regate else [])
    stored = stored_verdict(gate, state)
    return stored.model_copy(update={"thresholds": stored.thresholds or thresholds})
