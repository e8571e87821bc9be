"""The agent loop: an OpenAI-compatible chat model drives the four personas through a workflow.

    report = anyio.run(run_agent, "train_model", ChatEndpoint("http://127.0.0.1:8000/v1", "my-model"))
    training-assets agent run train_model --model-url http://127.0.0.1:8000/v1 --model agent-generator

For each stage of the workflow, the stage's owner persona gets its own MCP client session to a
server that exposes only that persona's tools; the model sees those tools (as chat-completions
``tools``), its persona's system prompt and the stage's brief, and calls tools until it answers
without a tool call. Tool calls go through the MCP session, so a persona asking for another's
tool is refused by the server and the model reads the refusal. After a stage with a gate the loop
reads the verdict of the evaluation run the persona executed in that stage (waiting for it if
needed); a failed gate, or a gate nobody evaluated, stops the workflow.

A stage is done only when its assets are: after the model's last turn the loop waits for the
runs the stage launched and asks the run backend about each target asset, which must have been
materialised by one of those runs or be fresh (``stale_targets``). A model that answers without
doing the work, or one still calling tools when ``max_turns`` runs out, fails the stage and stops
the workflow (``FAILURE``, naming the stage and the asset or the turn limit), since a report of
SUCCESS over a stale ``registry_entry`` would be a lie.
"""

from __future__ import annotations

import json
import os
from typing import Any

import anyio
from mcp import Client
from pydantic import BaseModel, Field

from training_assets.agent import personas, workflow
from training_assets.agent.errors import AgentError
from training_assets.agent.models import GateVerdict
from training_assets.agent.runs import make_backend
from training_assets.agent.runtime import Runtime
from training_assets.agent.server import build_server
from training_assets.harness.client import ChatError, chat_client, chat_message
from training_assets.harness.errors import HarnessError
from training_assets.orchestration.backends import RunBackend

RUN_WAIT_S = 3600  # how long the loop waits for a run a stage launched (get_run's wait_s)


class ChatEndpoint:
    """POST ``<url>/chat/completions`` (OpenAI format, with tools); returns the assistant message.

    The request carries the API key, so it goes through ``harness.client``: the OpenAI client over an
    httpx client that never follows a redirect (nor a proxy variable), with a timeout and retries.
    Every failure is one line naming the URL.
    """

    def __init__(self, url: str, model: str, api_key: str | None = None, timeout_s: float = 300.0,
                 max_retries: int = 2) -> None:
        self.url = url.rstrip("/") + "/chat/completions"
        try:
            self.client = chat_client(url, api_key=api_key, timeout_s=timeout_s, max_retries=max_retries)
        except HarnessError as exc:
            raise AgentError(f"--model-url: {exc}") from None
        self.model, self.timeout_s = model, timeout_s

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        try:
            return chat_message(self.client, model=self.model, messages=messages, tools=tools, tool_choice="auto")
        except ChatError as exc:
            raise AgentError(f"model endpoint {exc}") from None


class ToolCallRecord(BaseModel):
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    is_error: bool
    result: str = Field(description="The tool's text answer (errors) or a short summary of its structured output.")
    structured: dict[str, Any] | None = None


class AgentStage(BaseModel):
    name: str
    persona: str
    status: str = Field("PENDING", description=(
        "PENDING | RUNNING | DONE | GATE_FAILED | OUT_OF_TURNS | NOT_MATERIALISED"))
    tools_offered: list[str] = Field(default_factory=list)
    calls: list[ToolCallRecord] = Field(default_factory=list)
    answer: str = ""
    turns: int = Field(0, description="Model turns the stage used.")
    out_of_turns: bool = Field(False, description="The model was still calling tools when max_turns ran out.")
    gates: list[GateVerdict] = Field(default_factory=list)
    stale_assets: dict[str, str] = Field(default_factory=dict, description=(
        "The stage's assets that neither a run of this stage materialised nor are fresh, each with why."))


class AgentRunReport(BaseModel):
    workflow: str
    status: str = Field(description="SUCCESS | STOPPED_AT_GATE | FAILURE")
    stages: list[AgentStage]
    stopped_at: str | None = None
    reason: str = ""


def openai_tool(tool: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": tool.name, "description": tool.description or "",
                                             "parameters": tool.input_schema}}


def stage_brief(spec: workflow.WorkflowSpec, stage: workflow.ResolvedStage, task: Any) -> str:
    config = {a: task.config[a] for a in stage.assets if a in task.config}
    lines = [f"Workflow {spec.name}, stage {stage.name}. Materialise {', '.join(stage.assets)} "
             f"with {', '.join(stage.tools) or 'your tools'}."]
    if config:
        lines.append(f"Use this config (asset -> fields): {json.dumps(config)}.")
    for gate in stage.gates:
        lines.append(f"This stage ends with the gate {gate.asset}.{gate.check}: evaluate it (execute, with wait_s) "
                     "and report the verdict with every reason.")
    lines.append("Plan first, then execute with options {\"execute\": true, \"wait_s\": 900}. When the stage is done, "
                 "or cannot be done, answer with a short summary and no tool call.")
    return "\n".join(lines)


def _summary(result: Any) -> tuple[str, dict[str, Any] | None]:
    if result.is_error:
        return (result.content[0].text if result.content else "error"), None
    data = result.structured_content or {}
    keep = {k: data[k] for k in ("tool", "executed", "run_id", "status", "targets", "blocked", "next_step") if k in data}
    if data.get("verdict"):
        keep["verdict"] = data["verdict"]
    return json.dumps(keep or data, default=str)[:4000], data


async def _gate_verdicts(session: Any, stage: workflow.ResolvedStage, record: AgentStage) -> list[GateVerdict]:
    """The verdict of each gate from the evaluation this stage executed; none executed -> not evaluated."""
    out = []
    for gate in stage.gates:
        run_id = next((c.structured["run_id"] for c in reversed(record.calls)
                       if c.tool == "evaluate_checkpoint" and c.structured and c.structured.get("executed")
                       and gate.asset in c.structured.get("targets", [])), None)
        if run_id is None:
            out.append(GateVerdict(report=gate.asset, check=gate.check, passed=None,
                                   reasons=[f"{record.persona} did not execute an evaluation of {gate.asset} in this stage"]))
            continue
        result = await session.call_tool("get_run", {"run_id": run_id, "wait_s": RUN_WAIT_S})
        checks = [] if result.is_error else (result.structured_content or {}).get("checks", [])
        check = next((c for c in checks if c["asset"] == gate.asset and c["check"] == gate.check), None)
        if check is None:
            out.append(GateVerdict(report=gate.asset, check=gate.check, passed=None, run_id=run_id,
                                   reasons=[f"run {run_id} ended without evaluating the gate"]))
        else:
            out.append(GateVerdict(report=gate.asset, check=gate.check, passed=check["passed"], run_id=run_id,
                                   reasons=[r.strip() for r in check["description"].split(";") if r.strip()],
                                   thresholds=(check.get("metadata") or {}).get("thresholds") or {}))
    return out


def stale_targets(assets: list[str], states: dict[str, dict[str, Any]], stage_runs: set[str],
                  forced: dict[str, str]) -> dict[str, str]:
    """The stage's assets that are not done, each with why: done is materialised by a run of this
    stage, or fresh (Dagster's staleness; a partitioned asset: every partition materialised).

    An asset the task forces or configures must be materialised in this stage: its older
    materialisation was made with other settings, so being fresh is not enough.
    """
    out = {}
    for asset in assets:
        state = states.get(asset) or {}
        made_here = state.get("run_id") in stage_runs
        if asset in forced and not made_here:
            out[asset] = f"{forced[asset]}, but no run of this stage materialised it"
        elif state.get("stale_status") != "FRESH" and not (made_here and not state.get("partitions")):
            causes = "; ".join(state.get("stale_causes") or [])
            out[asset] = (state.get("stale_status") or "MISSING").lower() + (f" ({causes})" if causes else "")
    return out


def _stage_runs(record: AgentStage) -> list[str]:
    """Every run (or workflow) a tool call of this stage executed."""
    runs: list[str] = []
    for call in record.calls:
        data = call.structured or {}
        if data.get("executed"):
            runs.extend(data.get("run_ids") or ([data["run_id"]] if data.get("run_id") else []))
    return list(dict.fromkeys(runs))


async def _drive_stage(endpoint: ChatEndpoint, backend: RunBackend, dagster_url: str | None,
                       spec: workflow.WorkflowSpec, stage: workflow.ResolvedStage, task: Any,
                       max_turns: int) -> AgentStage:
    persona = personas.load_persona(stage.owner)
    server = build_server(persona=persona.name, runtime=Runtime(backend=backend, persona=persona.name,
                                                                dagster_url=dagster_url))
    record = AgentStage(name=stage.name, persona=persona.name, status="RUNNING")
    async with Client(server) as session:
        tools = (await session.list_tools()).tools
        record.tools_offered = [t.name for t in tools]
        offered = [openai_tool(t) for t in tools]
        messages: list[dict[str, Any]] = [{"role": "system", "content": persona.system_prompt()},
                                          {"role": "user", "content": stage_brief(spec, stage, task)}]
        for turn in range(1, max_turns + 1):
            record.turns = turn
            reply = await anyio.to_thread.run_sync(endpoint.complete, messages, offered)
            messages.append({k: v for k, v in reply.items() if k in ("role", "content", "tool_calls")} | {"role": "assistant"})
            calls = reply.get("tool_calls") or []
            if not calls:
                record.answer = reply.get("content") or ""
                break
            for call in calls:
                name = call.get("function", {}).get("name", "")
                try:
                    arguments = json.loads(call.get("function", {}).get("arguments") or "{}")
                except ValueError:
                    text, data, is_error, arguments = "arguments are not JSON; send a JSON object", None, True, {}
                else:
                    result = await session.call_tool(name, arguments)
                    (text, data), is_error = _summary(result), result.is_error
                record.calls.append(ToolCallRecord(tool=name, arguments=arguments, is_error=is_error, result=text,
                                                   structured=data))
                messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": text})
        else:
            record.out_of_turns = True
        runs = _stage_runs(record)
        for run_id in runs:  # the asset check below reads what they materialised: let them finish
            await session.call_tool("get_run", {"run_id": run_id, "wait_s": RUN_WAIT_S})
        record.gates = await _gate_verdicts(session, stage, record)
    states = await anyio.to_thread.run_sync(backend.asset_states, stage.assets)
    record.stale_assets = stale_targets(stage.assets, states, set(runs), workflow.forced_assets(stage, task))
    record.status = ("GATE_FAILED" if any(g.passed is not True for g in record.gates) else
                     "OUT_OF_TURNS" if record.out_of_turns else
                     "NOT_MATERIALISED" if record.stale_assets else "DONE")
    return record


def stage_failure(record: AgentStage, max_turns: int) -> str | None:
    """Why a stage without a failed gate still failed (out of turns, assets not done); None: it did not."""
    reasons = []
    if record.out_of_turns:
        reasons.append(f"the model was still calling tools after {max_turns} turn(s) (--max-turns); raise it, or "
                       "check why the model does not finish")
    if record.stale_assets:
        reasons.append("not materialised in this stage and not fresh: "
                       + "; ".join(f"{a} ({why})" for a, why in record.stale_assets.items()))
    return f"stage {record.name}: {'; '.join(reasons)}" if reasons else None


async def run_agent(workflow_name: str, endpoint: ChatEndpoint, task: dict[str, Any] | None = None,
                    dagster_url: str | None = None, max_turns: int = 8, log: Any = print) -> AgentRunReport:
    """Drive every stage of ``workflow_name`` with its owner persona; stop at a failed gate, at a
    stage that ran out of turns, or at one whose assets neither materialised nor are fresh."""
    if max_turns < 1:
        raise AgentError(f"max_turns must be at least 1, not {max_turns}")
    backend = make_backend(dagster_url)
    spec = workflow.load_workflow(workflow_name)
    parsed = workflow.parse_task(spec, task, backend.graph())
    report = AgentRunReport(workflow=workflow_name, status="SUCCESS", stages=[])
    for stage in workflow.resolve_stages(spec, parsed):
        log(f"stage {stage.name} ({stage.owner})")
        try:
            record = await _drive_stage(endpoint, backend, dagster_url, spec, stage, parsed, max_turns)
        except BaseExceptionGroup as group:  # the MCP session's task group wraps what the loop raised
            raise _first_leaf(group) from None
        report.stages.append(record)
        for call in record.calls:
            log(f"  {call.tool}: {'refused/error: ' if call.is_error else ''}{call.result[:200]}")
        failed = next((g for g in record.gates if g.passed is not True), None)
        problem = stage_failure(record, max_turns)
        if failed is not None:
            report.status, report.stopped_at = "STOPPED_AT_GATE", f"{stage.name} ({failed.report}.{failed.check})"
            report.reason = f"{failed.report} gate {'failed' if failed.passed is False else 'not evaluated'}: " \
                            f"{'; '.join(failed.reasons)}" + (f"; {problem}" if problem else "")
        elif problem is not None:
            report.status, report.stopped_at, report.reason = "FAILURE", stage.name, problem
        else:
            continue
        log(f"stopped: {report.reason}")
        break
    return report


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


def api_key_from_env(var: str | None) -> str | None:
    if var is None:
        return None
    if not os.environ.get(var):
        raise AgentError(f"--api-key-env {var}: the variable is not set")
    return os.environ[var]
