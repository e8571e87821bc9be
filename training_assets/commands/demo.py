"""Verb: ``demo`` (what ``make demo`` runs)."""

from __future__ import annotations

import argparse
import os

from training_assets.commands import emit, fail


def _demo(args: argparse.Namespace) -> int:
    if not os.environ.get("DAGSTER_HOME"):
        return fail("DAGSTER_HOME is not set; run `make demo`, or export DAGSTER_HOME=$PWD/dagster_home")
    # The demo prints one line per step; progress bars from the libraries it drives only add noise.
    for name, value in (("TQDM_DISABLE", "1"), ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
                        ("TRANSFORMERS_VERBOSITY", "error"), ("DATASETS_VERBOSITY", "error")):
        os.environ.setdefault(name, value)
    from training_assets.orchestration.demo import run_demo  # dagster and the Definitions: seconds, only for demo

    summary = run_demo(log=(lambda _msg: None) if args.json else print)
    emit(args, summary, f"demo finished in {summary['elapsed_s']} s; failures: {summary['failures'] or 'none'}")
    return 1 if summary["failures"] else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="materialise every asset on the bundled sample traces ($DAGSTER_HOME)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(handler=_demo)
