"""The ``training-assets`` console script.

    training-assets ingest data/inbox/traces-0001.jsonl --json
    training-assets demo

Verbs live in ``training_assets/commands/<area>.py``; each module defines
``register(subparsers)`` that adds its verbs with ``set_defaults(handler=fn)``. A handler takes the
parsed arguments and returns the process exit code. ``--json`` (on every verb) asks for
machine-readable output on stdout.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from training_assets import commands


def build_parser(modules: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser with every verb, or only those of the given ``commands`` modules."""
    parser = argparse.ArgumentParser(prog="training-assets", description="Train in-house LLMs from agent traces.")
    subparsers = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    names = (sorted(i.name for i in pkgutil.iter_modules(commands.__path__) if not i.name.startswith("_"))
             if modules is None else modules)  # _helpers.py: shared by verbs, not one
    for name in names:
        importlib.import_module(f"{commands.__name__}.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # An MCP client launches `training-assets mcp` and waits for tools/list: build only that verb
    # (other verbs' modules import numba and pyarrow at import time, about 1 s here).
    args = build_parser(["mcp"] if argv[:1] == ["mcp"] else None).parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
