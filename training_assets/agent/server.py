"""The MCP server: the platform's tools (all, or one persona's), resources and persona prompts.

    server = build_server(persona="eval_judge")          # only the eval judge's tools
    server.run()                                         # stdio (what an MCP client launches)
    training-assets mcp [--persona NAME] [--dagster-url URL] [--transport streamable-http]

Building and starting the server imports neither dagster nor torch (tools/list answers within a
couple of seconds of launch, see benchmarks/mcp_startup.py); the Definitions load in a background
thread once the server is serving, and on the first tool call that needs them otherwise.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool
from mcp_types import ToolAnnotations
from pydantic import ValidationError

from training_assets.agent import graph_map, personas
from training_assets.agent.graph_map import EVAL_REPORTS
from training_assets.agent.runs import make_backend
from training_assets.agent.runtime import Runtime
from training_assets.agent.tools import TOOLS
from training_assets.agent.tools import observe as observe_tools, registry as registry_tools
from training_assets.agent.tools.base import blocking
from training_assets.agent.tools.schemas import fields_at, input_model

SKILL_PATH = Path(__file__).resolve().parent / "skills" / "train_model" / "SKILL.md"
WORKFLOW_PATH = Path(__file__).resolve().parent / "workflows" / "train_model.yaml"
INSTRUCTIONS = (
    "Train in-house LLMs from agent traces on a Dagster asset graph. Every tool that writes data, trains or "
    "registers plans by default (nothing written, no run); pass options {\"execute\": true} to launch a Dagster "
    "run, whose run_id returns at once: follow it with get_run (wait_s waits with progress). execute_workflow "
    "runs the whole train_model loop; each gate is a blocking asset check and a failed gate stops it.")


def _annotations(kind: str, title: str) -> ToolAnnotations:
    if kind == "read":
        return ToolAnnotations(title=title, read_only_hint=True, open_world_hint=False)
    # Executed, every mutating tool replaces what an asset holds (or what serves a role): destructive.
    # Materialising tools are idempotent (the same inputs give the same data versions); registering
    # moves an alias, rolling back pops its history, the workflow and cancel are not repeatable.
    return ToolAnnotations(title=title, read_only_hint=False, destructive_hint=True,
                           idempotent_hint=kind == "plan", open_world_hint=False)


def _validation_line(tool: str, error: ValidationError) -> str:
    err = error.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or "arguments"
    if err["type"] == "extra_forbidden":
        if err["loc"][:1] == ("config",) and len(err["loc"]) >= 2:
            where, name = [str(p) for p in err["loc"][1:-1]], str(err["loc"][-1])
            return f"{field}: {graph_map.unknown_field_reason(tool, name, fields_at(input_model(tool), where))}"
        return f"{field}: unknown field of {tool}'s arguments; remove it (the tool's input schema lists the fields)"
    got = f" (got {err['input']!r})" if "input" in err and not isinstance(err["input"], dict) else ""
    return f"{field}: {err['msg']}{got}; fix it and call {tool} again"


def _sdk_tool(name: str) -> Tool:
    """The SDK's Tool for one of ours: its typed signature is the input schema, its return model the
    output schema (structured output, as the SDK derives it)."""
    spec = TOOLS[name]
    return Tool.from_function(spec.fn, name=name, title=spec.title, annotations=_annotations(spec.kind, spec.title),
                              structured_output=True)


class TrainingAssetsServer(MCPServer):
    """An MCPServer that refuses other personas' tools and reports bad arguments in one line."""

    def __init__(self, runtime: Runtime, tool_names: tuple[str, ...], **kwargs: Any) -> None:
        super().__init__(tools=[_sdk_tool(n) for n in tool_names], **kwargs)
        self.runtime = runtime
        self.exposed = tool_names
        self._params = {n: {p for p in inspect.signature(TOOLS[n].fn).parameters if p != "ctx"} for n in tool_names}

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        if name not in self.exposed:
            if name in TOOLS:
                owners = personas.owners_of(name)
                raise ToolError(f"{name} is not available to persona {self.runtime.persona}: it belongs to "
                                f"{', '.join(owners) or 'no persona'}; this persona's tools: {', '.join(self.exposed)}")
            raise ToolError(f"unknown tool {name!r}; available: {', '.join(self.exposed)}")
        unknown = sorted(set(arguments) - self._params[name])
        if unknown:
            raise ToolError(f"{unknown[0]}: unknown argument of {name}; it takes {sorted(self._params[name])}")
        try:
            return await super().call_tool(name, arguments, context)
        except UnexpectedToolError as exc:  # stays Unexpected: the SDK logs its traceback
            raise UnexpectedToolError(f"internal error in {name}; the server log has the traceback") from exc
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                raise ToolError(_validation_line(name, exc.__cause__)) from None
            # The SDK prefixes what a tool raised with "Error executing tool <name>: "; the errors
            # raised here do not carry it, so every tool error reads the same: "<input>: <fix>".
            raise ToolError(str(exc).removeprefix(f"Error executing tool {name}: ")) from None


def _warm_up(runtime: Runtime) -> None:
    warm = getattr(runtime.backend, "warm_up", None)
    if warm is None:
        return
    try:
        warm()
    except Exception:  # the first tool call loads the Definitions again and reports what is wrong
        pass


@asynccontextmanager
async def _lifespan(server: TrainingAssetsServer) -> AsyncIterator[dict[str, Any]]:
    threading.Timer(0.5, _warm_up, args=(server.runtime,)).start()
    yield {}


def _register_resources(server: TrainingAssetsServer) -> None:
    rt = server.runtime

    @server.resource("training-assets://assets", name="asset_catalog", mime_type="application/json",
                     description="Every asset: last materialisation, data version, stale status, check results.")
    async def asset_catalog() -> str:
        return (await blocking(observe_tools._list, rt, None, None)).model_dump_json(indent=2)

    @server.resource("training-assets://eval-reports/{report}", name="eval_report", mime_type="application/json",
                     description="An eval report (sft_eval_report, dpo_eval_report, grpo_eval_report, merged_eval_report).")
    async def eval_report(report: str) -> str:
        if report not in EVAL_REPORTS.values():
            raise ResourceError(f"unknown eval report {report!r}; one of {sorted(EVAL_REPORTS.values())}")
        path = rt.root / report / "report.json"
        if not path.is_file():
            raise ResourceError(f"{report} was never materialised (evaluate_checkpoint materialises it)")
        return path.read_text(encoding="utf-8")

    @server.resource("training-assets://registry", name="registry_versions", mime_type="application/json",
                     description="Every registered model version and the roles it serves.")
    async def registry_versions() -> str:
        return (await blocking(registry_tools._list, rt, "agent-model")).model_dump_json(indent=2)

    @server.resource("training-assets://workflows/train_model", name="train_model_workflow", mime_type="text/yaml",
                     description="The train_model workflow: stages, owners, assets and gates.")
    def workflow_text() -> str:
        return WORKFLOW_PATH.read_text(encoding="utf-8")

    @server.resource("training-assets://skills/train_model", name="train_model_skill", mime_type="text/markdown",
                     description="The Agent Skill telling an agent how to run the train_model loop with these tools.")
    def skill_text() -> str:
        return SKILL_PATH.read_text(encoding="utf-8")


def _persona_prompt(persona: personas.Persona) -> Any:
    def prompt(task: str = "") -> list[dict[str, Any]]:
        text = persona.system_prompt() + (f"\n\nYour task: {task}" if task else "")
        return [{"role": "user", "content": {"type": "text", "text": text}}]

    prompt.__name__ = persona.name
    return prompt


def _register_prompts(server: TrainingAssetsServer) -> None:
    for name in personas.persona_names():
        persona = personas.load_persona(name)
        server.prompt(name=name, title=persona.role, description=f"{persona.role}: {persona.goal}")(_persona_prompt(persona))


def build_server(persona: str | None = None, dagster_url: str | None = None,
                 runtime: Runtime | None = None) -> TrainingAssetsServer:
    """The server for one persona (only its tools) or for every tool (``persona=None``)."""
    tools = tuple(TOOLS) if persona is None else personas.load_persona(persona).tools
    if runtime is None:
        runtime = Runtime(backend=make_backend(dagster_url), persona=persona, dagster_url=dagster_url)
    instructions = INSTRUCTIONS
    if persona is not None:
        instructions = personas.load_persona(persona).system_prompt() + "\n\n" + INSTRUCTIONS
    server = TrainingAssetsServer(runtime, tools, name="training-assets", version="0.1.0", instructions=instructions,
                                  lifespan=_lifespan)
    _register_resources(server)
    _register_prompts(server)
    return server


def describe_tools() -> list[dict[str, Any]]:
    """Name, kind and first docstring line of every tool (for docs and `training-assets mcp --list-tools`)."""
    return [{"name": n, "kind": TOOLS[n].kind, "title": TOOLS[n].title,
             "summary": " ".join((TOOLS[n].fn.__doc__ or "").split())} for n in TOOLS]
