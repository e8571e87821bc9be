"""Verb: ``loop``: the self-training loop on a real pretrained model (what ``make loop`` runs).

    training-assets loop --generations 2                      # SmolLM2-135M-Instruct, the README's CPU run
    training-assets loop --generations 1 --collect-tasks 12 --held-out-tasks 30 --sft-steps 8 --json

Every option comes from ``settings.LoopSettings`` (its defaults and help). Runs against
``$DAGSTER_HOME`` like ``demo``: each step is a run the UI shows. The base model must be fetched
first (``training-assets models fetch smollm2-135m-instruct``); the summary (held-out success per
generation, per family, with 95% intervals) is printed and kept in ``<data root>/loop/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from training_assets.base_model.fetch import FetchError
from training_assets.commands import emit, fail
from training_assets.commands._options import add_model_options, model_from_args
from training_assets.harness.errors import HarnessError
from training_assets.serving.server import ServeError
from training_assets.settings import LoopSettings


def _table(summary: dict) -> str:
    lines = [f"{'gen':<4} {'model':<12} {'overall':<22} families"]
    for row in summary["generations"]:
        o = row["overall"]
        fams = ", ".join(f"{f} {s['rate']:.2f}" for f, s in row["families"].items())
        lines.append(f"{row['generation']:<4} {row['label'][:12]:<12} {o['rate']:.3f} [{o['low']:.3f}, {o['high']:.3f}]  {fams}"
                     + ("" if row["promoted"] else "  (not promoted)"))
    return "\n".join(lines)


def _loop(args: argparse.Namespace) -> int:
    if not os.environ.get("DAGSTER_HOME"):
        return fail("DAGSTER_HOME is not set; run `make loop`, or export DAGSTER_HOME=$PWD/dagster_home")
    settings = model_from_args(LoopSettings, args)
    for name, value in (("TQDM_DISABLE", "1"), ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
                        ("TRANSFORMERS_VERBOSITY", "error"), ("DATASETS_VERBOSITY", "error")):
        os.environ.setdefault(name, value)
    from training_assets.orchestration.self_training import LoopError, run_loop  # dagster: seconds, only here

    # a model server runs in a session of its own (so a terminal's ^C reaches the loop first): SIGTERM
    # becomes SystemExit, so the server's context manager stops it rather than leaving it running
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        summary = run_loop(settings, log=(lambda _msg: None) if args.json else print)
    except (LoopError, FetchError, HarnessError, ServeError) as exc:
        return fail(str(exc))
    emit(args, summary, _table(summary) + f"\nloop finished in {summary['elapsed_s']} s; plot {summary['plot']}")
    if not args.json:
        print("RESULT " + json.dumps({k: summary[k] for k in ("generations", "targets", "elapsed_s", "machine")}))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("loop", help="self-training loop: serve, act with tools, train on the traces, gate, "
                                           "register, serve the next version ($DAGSTER_HOME)")
    add_model_options(p, LoopSettings)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(handler=_loop)
