"""Verb: ``agent run`` — an OpenAI-compatible chat model drives the four personas through a workflow.

    training-assets agent run train_model --model-url http://127.0.0.1:8000/v1 --model agent-generator
    training-assets agent run train_model --model-url https://api.example.com/v1 --model m --api-key-env API_KEY

Any chat-completions endpoint that supports tool calls works (for example the model this
platform serves through vLLM). Each stage's owner persona sees only its own tools, through its
own MCP client session; the run stops at a failed gate, at a stage that ran out of turns, and at
one whose assets were neither materialised in it nor fresh. Exit 0 only when every stage finished
with its assets done; 1 otherwise, with the stage and the reason in the report.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

import anyio

from training_assets.agent.errors import AgentError
from training_assets.commands import emit, fail


def _run(args: argparse.Namespace) -> int:
    # The in-process MCP servers configure logging at INFO on first use (and Dagster's SQLite storage
    # logs every schema check at INFO): a handler installed first keeps the output to the report,
    # with warnings and errors still on stderr.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")

    from training_assets.agent.driver import ChatEndpoint, api_key_from_env, run_agent  # mcp: ~0.7 s, only when the agent runs

    try:
        task = json.loads(args.task) if args.task else None
    except ValueError as exc:
        return fail(f"--task is not JSON ({exc}); pass an object such as '{{\"train\": \"sft\"}}'")
    try:
        endpoint = ChatEndpoint(args.model_url, args.model, api_key_from_env(args.api_key_env))
        report = anyio.run(lambda: run_agent(args.workflow, endpoint, task, args.dagster_url, args.max_turns,
                                             log=(lambda _m: None) if args.json else print))
    except (AgentError, ValueError) as exc:
        return fail(str(exc))
    emit(args, report.model_dump(mode="json"), f"{args.workflow}: {report.status}"
                                               + (f" at {report.stopped_at}: {report.reason}" if report.stopped_at else ""))
    return 0 if report.status == "SUCCESS" else 1


def positive_turns(value: str) -> int:
    """``--max-turns``: a whole number of model turns, at least 1 (0 would end every stage unstarted)."""
    try:
        turns = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if turns < 1:
        raise argparse.ArgumentTypeError(f"{turns} is not allowed: a stage needs at least 1 model turn")
    return turns


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("agent", help="drive the personas through a workflow with an OpenAI-compatible model")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    r = actions.add_parser("run", help="run a workflow, one persona per stage, with a tool-calling chat model")
    r.add_argument("workflow", help="workflow name (train_model)")
    r.add_argument("--model-url", required=True, help="OpenAI-compatible base URL (…/v1) serving chat completions with tools")
    r.add_argument("--model", default="agent-generator", help="model name sent to the endpoint")
    r.add_argument("--api-key-env", default=None, help="environment variable holding the endpoint's API key")
    r.add_argument("--task", default=None, help="task JSON (train, align, config), as execute_workflow takes")
    r.add_argument("--max-turns", type=positive_turns, default=8,
                   help="model turns per stage (at least 1); a stage still calling tools after them fails")
    r.add_argument("--dagster-url", default=None, help="launch runs through this Dagster webserver")
    r.add_argument("--json", action="store_true", help="machine-readable report")
    r.set_defaults(handler=_run)
