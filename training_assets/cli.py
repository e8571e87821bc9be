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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="training-assets", description="Train in-house LLMs from agent traces.")
    subparsers = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        importlib.import_module(f"{commands.__name__}.{info.name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
