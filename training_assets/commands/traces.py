"""Verbs: ``ingest``."""

from __future__ import annotations

import argparse

from training_assets.commands import emit, fail
from training_assets.traces import DEFAULT_MAX_LINE_BYTES, BatchError, read_batch


def _ingest(args: argparse.Namespace) -> int:
    try:
        result = read_batch(args.file, max_line_bytes=args.max_line_bytes)
    except BatchError as exc:
        return fail(str(exc))
    report = result.report()
    lines = [f"{report['path']}: {report['lines']} lines, {report['valid']} valid, "
             f"{report['quarantined']} quarantined ({report['quarantine_rate']:.1%})"]
    lines += [f"  {reason}: {count}" for reason, count in report["reasons"].items()]
    lines += [f"  line {q['line_no']}: {q['reason']}: {q['detail']}" for q in report["examples"]]
    emit(args, report, "\n".join(lines))
    return 1 if args.strict and result.quarantined else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("ingest", help="validate a trace batch (.jsonl / .jsonl.gz) and print the report")
    p.add_argument("file", help="batch file to validate")
    p.add_argument("--max-line-bytes", type=int, default=DEFAULT_MAX_LINE_BYTES, help="longer lines are quarantined")
    p.add_argument("--strict", action="store_true", help="exit 1 when any line is quarantined")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.set_defaults(handler=_ingest)
