"""The tool registry and what every tool shares: errors as one line, the runtime, blocking work off the loop.

    @tool("plan", "Train an SFT checkpoint")
    async def train_sft(ctx: Context, config: config_arg("train_sft") = None, options: OptionsArg = None
                        ) -> ActionResult: ...

``kind`` is ``read`` (annotated read-only), ``plan`` (materialises assets when executed, plans by
default; the same inputs give the same data versions) or ``operate`` (registers, rolls back, runs
the whole workflow or cancels: changes what serves traffic or what runs, not repeatable). A tool raises :class:`AgentError`; the wrapper turns it, and any library error, into
an MCP tool error (``isError``) whose text is one line naming the input and the fix.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from training_assets.agent.errors import AgentError
from training_assets.agent.models import Options
from training_assets.agent.runtime import Runtime
from training_assets.agent.tools.schemas import input_model

log = logging.getLogger("training_assets.agent")
ToolKind = Literal["read", "plan", "operate"]
T = TypeVar("T")

CONFIG_HELP = ("Config fields of the asset(s) this tool materialises (training tools: TrainConfig fields such as "
               "max_steps, batch_size, lr, lora {r, alpha}); a field left out keeps its default. A plan lists every "
               "accepted field with the default it runs with under config_fields.")


def config_arg(tool_name: str) -> Any:
    """The ``config`` parameter's type for ``tool_name``: its typed input model (``schemas.INPUTS``), optional."""
    return Annotated[input_model(tool_name) | None, Field(description=CONFIG_HELP)]


OptionsArg = Annotated[Options | None, Field(description='{"execute": false} by default: plan only. '
                                                         '{"execute": true, "wait_s": 0} launches the run(s).')]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    kind: ToolKind
    title: str
    fn: Callable[..., Awaitable[Any]]


TOOLS: dict[str, ToolSpec] = {}


def one_line(text: str, limit: int = 600) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _message(exc: BaseException) -> str:
    if isinstance(exc, AgentError):
        return str(exc)
    if type(exc).__name__ == "DagsterInvalidConfigError":  # the run config the assets rejected
        errors = getattr(exc, "errors", None) or []
        return "config: " + "; ".join(one_line(e.message) for e in errors[:3]) if errors else one_line(str(exc))
    if isinstance(exc, (FileNotFoundError, ValueError, KeyError, RuntimeError)):
        return one_line(exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc))
    return f"internal error ({type(exc).__name__}: {one_line(str(exc), 200)}); the server log has the traceback"


def tool(kind: ToolKind, title: str) -> Callable[[Callable[..., Awaitable[T]]], Callable[..., Awaitable[T]]]:
    """Register an async tool function (its docstring is the description MCP clients show)."""

    def register(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> T:
            try:
                return await fn(*args, **kwargs)
            except ToolError:
                raise
            except Exception as exc:
                if not isinstance(exc, (AgentError, FileNotFoundError, ValueError, KeyError)):
                    log.exception("tool %s failed", fn.__name__)
                raise ToolError(_message(exc)) from None

        TOOLS[fn.__name__] = ToolSpec(fn.__name__, kind, title, wrapper)
        return wrapper

    return register


def runtime(ctx: Context) -> Runtime:
    return ctx.mcp_server.runtime


async def blocking(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Dagster, MLflow and file reads block: run them in a worker thread so progress keeps flowing."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))
