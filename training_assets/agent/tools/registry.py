"""Evaluation and registry tools: the gate verdict (eval judge), registration and rollback
(ML orchestrator), and reading the registry.

The registry is the MLflow Model Registry behind ``training_assets.registry`` (one alias per role).
Registering is a Dagster run of ``registry_entry``; a rollback moves the role's alias directly
(there is no asset to materialise for it). Reads never create the MLflow store.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from pydantic import Field

from training_assets import paths
from training_assets.agent import graph_map
from training_assets.agent.errors import AgentError, ToolInputError
from training_assets.agent.models import ActionResult, GateVerdict, ModelEntry, Options, RegistryList, RegistryVersion, RollbackResult
from training_assets.agent.runtime import Runtime, tracking_uri
from training_assets.agent.tools.actions import finish, plan_action
from training_assets.agent.tools.base import OptionsArg, blocking, config_arg, runtime, tool

Checkpoint = Literal[tuple(graph_map.EVAL_REPORTS)]  # every gated checkpoint: one per kind with a gate, and the merge
EvalConfig = config_arg("evaluate_checkpoint")
RegisterConfig = config_arg("register_model")
ModelNameArg = Annotated[str, Field(description="MLflow registered model holding the role aliases.")]


def _verdict(rt: Runtime, report: str, state: dict[str, Any]) -> GateVerdict:
    """The latest evaluation of the report's gate, as the instance recorded it."""
    effective = graph_map.effective_config(report, {}, rt.backend.graph())
    for check in state.get("checks", []):
        if check["name"] == "eval_gate":
            reasons = [r.strip() for r in (check.get("description") or "").split(";") if r.strip()]
            return GateVerdict(report=report, passed=check.get("passed"), reasons=reasons, run_id=check.get("run_id"),
                               thresholds=(check.get("metadata") or {}).get("thresholds") or effective)
    return GateVerdict(report=report, passed=None, reasons=["not evaluated yet"])


@tool("plan", "Evaluate a checkpoint (gate verdict)")
async def evaluate_checkpoint(ctx: Context, checkpoint: Annotated[Checkpoint, Field(description=(
                                  "The checkpoint asset to evaluate; its eval report's blocking check is the gate."))],
                              config: EvalConfig = None, options: OptionsArg = None) -> ActionResult:
    """Materialise the checkpoint's eval report (reliability suite + lm-eval offline) and return the
    gate verdict: passed, or every failing metric against its threshold. Thresholds are config fields
    (min_pass_rate, min_category_pass_rate, max_bpb_vs_uniform, max_bits_per_byte, max_regression).
    The plan shows the latest verdict; the checkpoint itself is evaluated as it is (never retrained)."""
    rt, options = runtime(ctx), options or Options()
    report = graph_map.EVAL_REPORTS[checkpoint]
    result = await blocking(plan_action, rt, "evaluate_checkpoint", config, (report,), "target")
    state = (await blocking(rt.backend.asset_states, [report, checkpoint]))
    result.verdict = _verdict(rt, report, state[report])
    if state[checkpoint]["stale_status"] == "STALE":
        result.details["checkpoint_stale"] = state[checkpoint]["stale_causes"]
    result = await finish(ctx, rt, result, options)
    if result.run is not None and result.run.status in ("SUCCESS", "FAILURE"):
        for check in result.run.checks:
            if check.asset == report and check.check == "eval_gate":
                result.verdict = GateVerdict(report=report, passed=check.passed, run_id=result.run.run_id,
                                             reasons=[r.strip() for r in check.description.split(";") if r.strip()],
                                             thresholds=check.metadata.get("thresholds") or {})
    return result


def _registry(rt: Runtime, model_name: str) -> Any:
    from training_assets.registry import ModelRegistry  # pyarrow: ~0.3 s, the server builds without it

    uri = tracking_uri(rt.root)
    return None if uri is None else ModelRegistry(uri, model_name)


def _promotion(rt: Runtime, result: ActionResult) -> dict[str, Any]:
    # pyarrow (~0.3 s) under each: the server builds without them
    from training_assets.checkpoint_manifest import read_manifest  # pyarrow
    from training_assets.evaluation.report import load_eval_report  # pyarrow
    from training_assets.registry import promotion_verdict  # pyarrow

    manifest = read_manifest(rt.root, "merged_adapter")
    ok, reason = promotion_verdict(load_eval_report(paths.asset_dir("merged_eval_report", rt.root)), manifest)
    given = result.run_config.get("ops", {}).get("registry_entry", {}).get("config", {})
    values = graph_map.effective_config("registry_entry", given, rt.backend.graph())
    checkpoint_id = f"merged_adapter-{manifest.data_version}"
    registry = _registry(rt, values["model_name"])
    facts: dict[str, Any] = {"promotion_allowed": ok, "promotion_reason": reason, "checkpoint_id": checkpoint_id}
    if registry is not None:
        current = registry.serving(values["role"])
        facts["serving_now"] = {"version": current.version, "checkpoint_id": current.checkpoint_id} if current else None
        existing = registry.find(checkpoint_id)
        facts["already_registered_as"] = existing.version if existing else None
    return facts


@tool("operate", "Register the merged model for its role")
async def register_model(ctx: Context, config: RegisterConfig = None, options: OptionsArg = None) -> ActionResult:
    """Materialise registry_entry: register merged_adapter in the MLflow registry for its role (role,
    served_model_name, base_url, model_name) once merged_eval_report's promotion gate passed for this
    very checkpoint; moves the role's alias (what serves traffic). Idempotent per checkpoint.
    Plans by default: the plan shows the gate's verdict and what serves the role now."""
    rt, options = runtime(ctx), options or Options()
    result = await blocking(plan_action, rt, "register_model", config, None, "target")
    result.details.update(await blocking(_promotion, rt, result))
    if options.execute and not result.details["promotion_allowed"]:
        raise AgentError(f"not registering merged_adapter: {result.details['promotion_reason']}")
    return await finish(ctx, rt, result, options)


def _list(rt: Runtime, model_name: str) -> RegistryList:
    registry = _registry(rt, model_name)
    rows = registry.list() if registry is not None else []
    return RegistryList(model_name=model_name, versions=[RegistryVersion(**r) for r in rows])


@tool("read", "List registered model versions")
async def registry_list(ctx: Context, model_name: ModelNameArg = "agent-model") -> RegistryList:
    """Every completely registered version: checkpoint id, the roles it serves, its snapshot URI and
    the trace batches behind it."""
    return await blocking(_list, runtime(ctx), model_name)


def _entry(definition: Any) -> ModelEntry:
    d = definition.to_dict()
    return ModelEntry(role=d["role"], version=d["version"], checkpoint_id=d["checkpoint_id"],
                      served_model_name=d["served_model_name"], checkpoint_uri=d["checkpoint_uri"],
                      lineage=d["lineage"], deployment=dict(d["deployment"]))


def _pick(rt: Runtime, role: str, model_name: str) -> ModelEntry:
    from training_assets.registry import RegistryError  # pyarrow: ~0.3 s, the server builds without it

    registry = _registry(rt, model_name)
    if registry is None:
        raise ToolInputError("role", f"no model registered for {role!r}: nothing was ever registered "
                                     "(register_model, or execute_workflow)")
    try:
        return _entry(registry.pick_for_role(role))
    except RegistryError as exc:
        raise ToolInputError("role", str(exc)) from None


@tool("read", "The model serving a role")
async def pick_for_role(ctx: Context, role: Annotated[str, Field(description="A role, e.g. generator.")],
                        model_name: ModelNameArg = "agent-model") -> ModelEntry:
    """The version a role's alias points at, with its lineage (trace batches, dataset versions,
    training runs, eval summary) and its deployment."""
    return await blocking(_pick, runtime(ctx), role, model_name)


def _rollback(rt: Runtime, role: str, to_version: int | None, model_name: str, execute: bool) -> RollbackResult:
    from training_assets.registry import RegistryError  # pyarrow: ~0.3 s, the server builds without it

    registry = _registry(rt, model_name)
    if registry is None:
        raise ToolInputError("role", f"nothing was ever registered, so {role!r} cannot be rolled back")
    try:
        current = registry.pick_for_role(role)
        history = registry.history(role)
        target = to_version if to_version is not None else (history[-2] if len(history) >= 2 else None)
        if target is None:
            raise ToolInputError("role", f"role {role!r} has only version {current.version} in its history: "
                                         "nothing to roll back to (pass to_version to promote another)")
        if not execute:
            registry.get(target)  # an unknown version is refused in the plan too
            return RollbackResult(executed=False, role=role, from_version=current.version, to_version=target,
                                  reason=f"would move {role!r} from version {current.version} to {target}",
                                  entry=_entry(current))
        chosen, reason = registry.rollback(role, to_version)
    except RegistryError as exc:
        raise ToolInputError("to_version" if "version" in str(exc) else "role", str(exc)) from None
    return RollbackResult(executed=True, role=role, from_version=current.version, to_version=chosen.version,
                          reason=reason, entry=_entry(chosen))


@tool("operate", "Roll a role back")
async def rollback_role(ctx: Context, role: Annotated[str, Field(description="The role whose alias moves back.")],
                        to_version: Annotated[int | None, Field(description=(
                            "Promote this version; default: the previously promoted one."))] = None,
                        model_name: ModelNameArg = "agent-model", options: OptionsArg = None) -> RollbackResult:
    """Move a role's alias back to the previously promoted version (or to_version): what serves
    traffic changes. Plans by default (which version would serve); executed, the alias moves."""
    options = options or Options()
    return await blocking(_rollback, runtime(ctx), role, to_version, model_name, options.execute)
