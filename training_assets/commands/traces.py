"""Verbs: ``ingest``.

    training-assets ingest data/inbox/traces-0001.jsonl --json
    training-assets ingest big.jsonl.gz --max-batch-bytes 1000000000 --max-batch-lines 100000
"""

from __future__ import annotations

import argparse

from training_assets.commands import emit, fail
from training_assets.traces import (
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_BATCH_LINES,
    DEFAULT_MAX_LINE_BYTES,
    BatchCaps,
    BatchError,
    summarise_batch,
)


def _ingest(args: argparse.Namespace) -> int:
    try:
        caps = BatchCaps(args.max_line_bytes, args.max_batch_bytes, args.max_batch_lines)
        summary = summarise_batch(args.file, caps=caps)  # streams: memory does not grow with the batch
    except (BatchError, ValueError) as exc:
        return fail(str(exc))
    report = summary.report()
    lines = [f"{report['path']}: {report['lines']} lines, {report['valid']} valid, "
             f"{report['quarantined']} quarantined ({report['quarantine_rate']:.1%})"]
    lines += [f"  {reason}: {count}" for reason, count in report["reasons"].items()]
    lines += [f"  line {q['line_no']}: {q['reason']}: {q['detail']}" for q in report["examples"]]
    emit(args, report, "\n".join(lines))
    return 1 if args.strict and summary.quarantined else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("ingest", help="validate a trace batch (.jsonl / .jsonl.gz) and print the report")
    p.add_argument("file", help="batch file to validate")
    p.add_argument("--max-line-bytes", type=int, default=DEFAULT_MAX_LINE_BYTES, help="longer lines are quarantined")
    p.add_argument("--max-batch-bytes", type=int, default=DEFAULT_MAX_BATCH_BYTES,
                   help="more decompressed bytes: the batch is refused")
    p.add_argument("--max-batch-lines", type=int, default=DEFAULT_MAX_BATCH_LINES, help="more lines: the batch is refused")
    p.add_argument("--strict", action="store_true", help="exit 1 when any line is quarantined")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.set_defaults(handler=_ingest)
