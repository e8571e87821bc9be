"""Pydantic models of the agent surface: tool options and every tool's structured output.

Each tool returns one of these, so the MCP server publishes an output schema per tool. Nothing
here imports dagster or torch (the server must start fast).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

StaleStatus = Literal["FRESH", "STALE", "MISSING"]


class Options(BaseModel):
    """How a mutating tool runs. Without ``execute: true`` it only plans and changes nothing."""

    # strict: "yes" or 1 is not `true` (lax pydantic would launch a run on a string)
    model_config = ConfigDict(extra="forbid", strict=True)

    execute: bool = Field(False, description="false (default): return the plan; nothing is written, no run starts. "
                                             "true: launch the Dagster run(s) and return the run id at once.")
    wait_s: float = Field(0.0, ge=0.0, le=7200.0, description=(
        "With execute: wait up to this many seconds for the run(s) to finish, sending progress notifications "
        "when the caller asked for progress; 0 returns at once (then poll get_run)."))


class ConfigField(BaseModel):
    default: Any = None
    description: str = ""
    asset: str = Field(description="The asset whose Dagster config this field sets.")


class AssetStep(BaseModel):
    asset: str
    reason: str = Field(description="Why it would run (missing | stale: ... | config given | upstream will run | "
                                    "requested) or why it is reused (fresh).")
    data_version: str | None = None


class TrainingPlan(BaseModel):
    """The trainer's own plan (``trainer.plan(examples)``), computed without training."""

    kind: str
    examples: int
    planned_steps: int
    effective_batch: int
    tokens_per_step: int
    n_params: int | None = None
    trainable_params: int | None = None
    est_memory_mb: float | None = None
    train_flops: float | None = None
    notes: list[str] = Field(default_factory=list)


class LogLine(BaseModel):
    time: str | None = None
    level: str = "INFO"
    step: str | None = None
    event: str = "LOG"
    message: str = ""


class StepMetrics(BaseModel):
    """The latest ``step N loss X ... tok/s eta Ys`` line a training step logged through Pipes."""

    asset: str | None = None
    step: int
    total_steps: int | None = None
    loss: float
    tokens_per_s: float | None = None
    eta_s: float | None = None


class CheckResult(BaseModel):
    asset: str
    check: str
    passed: bool | None = None
    description: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)


class AssetOutput(BaseModel):
    asset: str
    partition: str | None = None
    data_version: str | None = None
    uri: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class GateVerdict(BaseModel):
    """A blocking eval gate's decision, with the failing metrics against their thresholds."""

    report: str = Field(description="The eval report asset whose blocking check is the gate.")
    check: str = "eval_gate"
    passed: bool | None = Field(description="None: the gate has not been evaluated.")
    reasons: list[str] = Field(default_factory=list, description="Every failed condition (metric vs threshold), "
                                                                 "or what was checked when it passed.")
    run_id: str | None = None
    thresholds: dict[str, Any] = Field(default_factory=dict)


class RunReport(BaseModel):
    """A Dagster run as ``get_run`` sees it; ``status`` is Dagster's word for it."""

    run_id: str
    status: str = Field(description="NOT_STARTED | QUEUED | STARTING | STARTED | SUCCESS | FAILURE | CANCELING | CANCELED")
    assets: list[str] = Field(default_factory=list)
    partition: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    created_at: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    log_lines: list[LogLine] = Field(default_factory=list)
    metrics: list[StepMetrics] = Field(default_factory=list)
    outputs: list[AssetOutput] = Field(default_factory=list)
    checks: list[CheckResult] = Field(default_factory=list)
    failures: list[str] = Field(default_factory=list)
    registry_version: int | None = None


class ActionResult(BaseModel):
    """What a plan-by-default tool answers: the plan, or (executed) the runs it launched."""

    tool: str
    executed: bool
    targets: list[str] = Field(description="The assets this tool materialises.")
    materialize: list[AssetStep] = Field(default_factory=list, description="Assets the run(s) (would) materialise, in order.")
    reused: list[AssetStep] = Field(default_factory=list, description="Upstream assets reused as they are, with data versions.")
    blocked: list[str] = Field(default_factory=list, description="What keeps this from running now, and the fix.")
    run_config: dict[str, Any] = Field(default_factory=dict, description="The Dagster run config (ops.<asset>.config).")
    config_fields: dict[str, ConfigField] = Field(default_factory=dict, description="Every config field this tool accepts.")
    training_plan: TrainingPlan | None = None
    details: dict[str, Any] = Field(default_factory=dict, description="Tool-specific facts (current stats, previews).")
    verdict: GateVerdict | None = None
    run_id: str | None = Field(None, description="The run materialising the target (executed).")
    run_ids: list[str] = Field(default_factory=list, description="Every run launched, in execution order.")
    status: str | None = None
    run: RunReport | None = Field(None, description="The target run, when options.wait_s waited for it.")
    next_step: str = ""


class AssetState(BaseModel):
    asset: str
    group: str | None = None
    description: str = ""
    materialized: bool
    last_materialized_at: str | None = None
    run_id: str | None = None
    data_version: str | None = None
    stale_status: StaleStatus
    stale_causes: list[str] = Field(default_factory=list)
    partitions: dict[str, Any] | None = None
    checks: list[CheckResult] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)


class AssetList(BaseModel):
    assets: list[AssetState]


class RegistryVersion(BaseModel):
    version: int
    checkpoint_id: str | None = None
    roles: list[str] = Field(default_factory=list)
    role: str | None = None
    served_model_name: str | None = None
    checkpoint_uri: str | None = None
    trace_partitions: str | None = None


class RegistryList(BaseModel):
    model_name: str
    versions: list[RegistryVersion]


class ModelEntry(BaseModel):
    """A registered model version and what trained it."""

    role: str
    version: int | None
    checkpoint_id: str
    served_model_name: str
    checkpoint_uri: str
    lineage: dict[str, Any] = Field(default_factory=dict)
    deployment: dict[str, Any] = Field(default_factory=dict)


class RollbackResult(BaseModel):
    executed: bool
    role: str
    from_version: int | None
    to_version: int | None
    reason: str
    entry: ModelEntry | None = None


class LineageResult(BaseModel):
    record: dict[str, Any] | None = Field(None, description="Why a record was kept or dropped (and duplicate of what).")
    asset: AssetState | None = None
    upstream: list[AssetStep] = Field(default_factory=list, description="The asset's ancestors with their data versions.")


class CancelResult(BaseModel):
    run_id: str
    status: str


StageStatus = Literal["PENDING", "RUNNING", "SUCCESS", "REUSED", "FAILURE", "GATE_FAILED", "SKIPPED", "CANCELED"]
WorkflowStatus = Literal["PLANNED", "RUNNING", "SUCCESS", "FAILURE", "STOPPED_AT_GATE", "CANCELED"]


class Task(BaseModel):
    """A workflow task: which trainers run and the config per asset."""

    train: str
    align: list[str]
    config: dict[str, dict[str, Any]] = Field(default_factory=dict, description="asset -> Dagster config values")


class StageReport(BaseModel):
    name: str
    owner: str = Field(description="The persona that owns the stage.")
    status: StageStatus = "PENDING"
    tools: list[str] = Field(default_factory=list, description="The tools the owner calls for this stage.")
    materialize: list[AssetStep] = Field(default_factory=list)
    reused: list[AssetStep] = Field(default_factory=list)
    partitions: list[str] = Field(default_factory=list, description="Trace batches this stage ingests (one run each).")
    run_ids: list[str] = Field(default_factory=list)
    metrics: dict[str, Any] = Field(default_factory=dict)
    gates: list[GateVerdict] = Field(default_factory=list)
    training_plan: TrainingPlan | None = None
    notes: list[str] = Field(default_factory=list)


class WorkflowReport(BaseModel):
    name: str
    workflow_id: str | None = None
    executed: bool
    status: WorkflowStatus
    task: Task
    stages: list[StageReport]
    estimated_steps: int | None = Field(None, description=(
        "Optimizer steps the training stages that will run plan for; None: unknown (a stage trains for epochs "
        "over a dataset not built yet)."))
    registry_version: int | None = None
    stopped_at: str | None = Field(None, description="The stage (and gate) that stopped the workflow.")
    reason: str = ""
    launched_by: str = ""
    driver_pid: int | None = None
    current_run: RunReport | None = None
    next_step: str = ""


class RunLookup(RunReport):
    """What ``get_run`` answers: a Dagster run, or a workflow (``run_id`` wf-...) with its report."""

    workflow: WorkflowReport | None = Field(None, description="Set when run_id is a workflow id (wf-...).")
