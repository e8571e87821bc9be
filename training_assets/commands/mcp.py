"""Verb: ``mcp`` — serve the platform's tools to MCP clients.

    training-assets mcp                                          # stdio: what an MCP client launches
    training-assets mcp --persona eval_judge                     # only that persona's tools
    training-assets mcp --dagster-url http://127.0.0.1:3000      # runs go to a running webserver
    TRAINING_ASSETS_MCP_TOKEN=... training-assets mcp --transport streamable-http --host 0.0.0.0 --port 8765
    training-assets mcp --list-tools --json                      # the tool table, without serving

Over HTTP the server binds 127.0.0.1 by default. It refuses a non-loopback address unless a bearer
token is configured in ``$TRAINING_ASSETS_MCP_TOKEN``; when one is, every request must carry
``Authorization: Bearer <token>`` (on loopback too).
"""

from __future__ import annotations

import argparse
import logging
import os

from training_assets.agent import personas
from training_assets.agent.http import TOKEN_ENV, serve_http
from training_assets.commands import emit, fail
from training_assets.paths import is_loopback

def _mcp(args: argparse.Namespace) -> int:
    token = os.environ.get(TOKEN_ENV) or None
    if args.transport == "streamable-http" and not is_loopback(args.host) and not token:
        return fail(f"refusing to serve on {args.host}, which is not a loopback address, without a bearer token: "
                    f"set {TOKEN_ENV} (every request must then send it), or bind 127.0.0.1")
    if args.persona and args.persona not in personas.persona_names():
        return fail(f"--persona {args.persona!r}: choose one of {', '.join(personas.persona_names())}")
    if args.list_tools:
        from training_assets.agent.server import describe_tools  # mcp: ~0.7 s, not on --help

        rows = describe_tools()
        if args.persona:
            allowed = set(personas.load_persona(args.persona).tools)
            rows = [r for r in rows if r["name"] in allowed]
        emit(args, rows, "\n".join(f"{r['name']:<24} {r['kind']:<12} {r['title']}" for r in rows))
        return 0
    from training_assets.agent.server import build_server  # mcp: ~0.7 s, not on --help

    # Dagster's SQLite storage logs every schema check at INFO; on stdio that all lands on stderr
    logging.getLogger("alembic").setLevel(logging.WARNING)
    server = build_server(persona=args.persona, dagster_url=args.dagster_url)
    if args.transport == "stdio":
        server.run("stdio")
    else:
        serve_http(server, args.host, args.port, token)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("mcp", help="serve the platform's tools over MCP (stdio by default)")
    p.add_argument("--persona", default=None, help="expose only this persona's tools "
                                                   "(data_curator, training_engineer, eval_judge, ml_orchestrator)")
    p.add_argument("--dagster-url", default=None, help="launch runs through this Dagster webserver (GraphQL) "
                                                       "instead of the local instance at $DAGSTER_HOME")
    p.add_argument("--transport", choices=("stdio", "streamable-http"), default="stdio", help="how clients connect")
    p.add_argument("--host", default="127.0.0.1", help=f"HTTP bind address (non-loopback needs ${TOKEN_ENV})")
    p.add_argument("--port", type=int, default=8765, help="HTTP port")
    p.add_argument("--list-tools", action="store_true", help="print the tools (name, kind, title) and exit")
    p.add_argument("--json", action="store_true", help="with --list-tools: machine-readable")
    p.set_defaults(handler=_mcp)
