"""Verbs: ``select-traces``, ``train-tokenizer``, ``build-dataset {sft,dpo,grpo,pretrain}``.

    training-assets select-traces --json                       # the per-trace selection SFT/DPO/GRPO read
    training-assets train-tokenizer --vocab-size 2048          # plan only: what would be trained
    training-assets train-tokenizer --vocab-size 2048 --execute
    training-assets build-dataset sft --max-tokens 1024
    training-assets build-dataset grpo --scale-rewards none

Each reads what the upstream assets wrote under the data root (``--root``, default
``$TRAINING_ASSETS_DATA``) and writes what the matching asset writes; exit 1 when a check fails,
2 on a missing input (the message names what to materialise).
"""

from __future__ import annotations

import argparse
from typing import Any

from training_assets import data_engine, paths, tokenizer_trainer
from training_assets.commands import emit, fail
from training_assets.commands._options import add_model_options, model_from_args
from training_assets.kinds import KINDS
from training_assets.settings import DATASET_SETTINGS
from training_assets.tokenizer_trainer import TokenizerConfig


def _select_traces(args: argparse.Namespace) -> int:
    from training_assets.training_data import selection  # polars: ~0.3 s on every --help, only when selecting

    root = paths.data_root(args.root)
    try:
        report = selection.select_traces(root, selection.SelectionConfig(args.near_duplicates))
    except (ValueError, FileNotFoundError) as exc:
        return fail(f"select-traces: {exc}")
    payload = {"uri": str(report.output_dir), "data_version": report.data_version, "counts": report.counts,
               "by_reason": report.by_reason, "by_batch": report.by_batch, "not_curated": report.not_curated}
    lines = [f"selected_traces {report.data_version}: {report.counts['kept']} of {report.counts['traces']} traces kept "
             f"-> {report.output_dir}"]
    lines += [f"  {reason}: {n}" for reason, n in report.by_reason.items()]
    if report.not_curated:
        lines.append(f"  not curated yet (run `training-assets curate`): {', '.join(report.not_curated)}")
    emit(args, payload, "\n".join(lines))
    return 1 if report.not_curated else 0


def _train_tokenizer(args: argparse.Namespace) -> int:
    root = paths.data_root(args.root)
    try:
        config = model_from_args(TokenizerConfig, args)
        rows = data_engine.load_curated_corpus(root).select(["id", "text"]).to_pylist()
        version, folder = data_engine.corpus_version(root), tokenizer_trainer.tokenizer_dir(root)
        if not args.execute:
            plan = tokenizer_trainer.plan_tokenizer(rows, version, config, folder)
            emit(args, {"plan": plan}, "\n".join(f"{k}: {v}" for k, v in plan.items() if k != "key")
                 + f"\n({'the existing tokenizer would be reused' if plan['would_reuse'] else 'would train'}; "
                   "plan only, add --execute to train)")
            return 0
        report = tokenizer_trainer.build_tokenizer(rows, version, config, folder)
    except (ValueError, FileNotFoundError) as exc:
        return fail(f"{exc} (data root {root}; run `training-assets curate` first if the corpus is missing)")
    checks = {
        "round_trip_lossless": not report.round_trip_failures,
        "round_trip_hard_text": not report.hard_text_failures,
        "special_tokens_single_id": not report.special_token_failures,
        "end_of_turn_in_assistant_mask": report.end_of_turn_masked[0],
    }
    payload = {"uri": str(report.output_dir), "tokenizer_hash": report.tokenizer_hash, "chat_template_hash": report.chat_template_hash,
               "vocab_size": report.vocab_size, "bytes_per_token": report.bytes_per_token, "reused": report.reused,
               "train_rows": report.n_train_rows, "held_back_rows": report.n_held_back_rows, "checks": checks,
               "failures": {"round_trip": report.round_trip_failures[:5], "hard_text": report.hard_text_failures[:5],
                            "special_tokens": report.special_token_failures, "end_of_turn": report.end_of_turn_masked[1]}}
    lines = [f"tokenizer {report.tokenizer_hash} -> {report.output_dir} ({'reused' if report.reused else 'trained'})",
             f"  vocab {report.vocab_size}, {report.bytes_per_token} bytes/token, {report.n_train_rows} training rows"]
    lines += [f"  check {name}: {'ok' if ok else 'FAILED'}" for name, ok in checks.items()]
    emit(args, payload, "\n".join(lines))
    return 0 if all(checks.values()) else 1


def _build(kind: str, root: Any, args: argparse.Namespace) -> Any:
    from training_assets.training_data import builders  # polars, pyarrow, the tokenizer stack: ~4 s, only to build

    dataset = KINDS[kind].dataset
    return builders.BUILDERS[dataset].build(root, model_from_args(DATASET_SETTINGS[dataset], args))


def _build_dataset(args: argparse.Namespace) -> int:
    root = paths.data_root(args.root)
    try:
        report = _build(args.kind, root, args)
    except (ValueError, FileNotFoundError) as exc:
        hint = " (training-assets select-traces)" if "selected_traces" in str(exc) else ""
        return fail(f"build-dataset {args.kind}: {exc}{hint}")
    info = report.info
    payload = {"dataset": KINDS[args.kind].dataset, "uri": str(info.path), "rows": info.rows, "data_version": info.data_version,
               "reused": report.reused, "key": info.key, "stats": info.stats,
               "checks": {c.name: {"passed": c.passed, "description": c.description} for c in report.checks}}
    lines = [f"{KINDS[args.kind].dataset} {info.data_version}: {info.rows} rows -> {info.path} ({'reused' if report.reused else 'built'})"]
    lines += [f"  check {c.name}: {'ok' if c.passed else 'FAILED'} - {c.description}" for c in report.checks]
    emit(args, payload, "\n".join(lines))
    return 0 if all(c.passed for c in report.checks) else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("select-traces", help="decide every trace for training (kept or dropped, with the reason)")
    p.add_argument("--root", default=None, help="data root (default $TRAINING_ASSETS_DATA or ./data)")
    p.add_argument("--near-duplicates", choices=["keep_within_task", "drop", "keep"], default="keep_within_task",
                   help="corpus near duplicates: keep attempts at the same task (default), drop all, keep all")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.set_defaults(handler=_select_traces)

    p = subparsers.add_parser("train-tokenizer", help="plan (default) or train the byte-level BPE tokenizer on the corpus")
    p.add_argument("--execute", action="store_true", help="train (without it only the plan is printed)")
    p.add_argument("--root", default=None, help="data root (default $TRAINING_ASSETS_DATA or ./data)")
    add_model_options(p, TokenizerConfig)  # --vocab-size, --min-frequency, ...: the asset's config fields
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.set_defaults(handler=_train_tokenizer)

    p = subparsers.add_parser("build-dataset", help=f"build a training dataset: {', '.join(KINDS)}")
    by_kind = p.add_subparsers(dest="kind", required=True, metavar="KIND",
                               help="; ".join(f"{k.name}: {k.dataset}" for k in KINDS.values()))
    for kind in KINDS.values():  # one sub-command per training kind; its options are its builder's settings
        settings = DATASET_SETTINGS[kind.dataset]
        q = by_kind.add_parser(kind.name, help=f"build {kind.dataset}", description=(settings.__doc__ or "").strip().replace("``", ""))
        q.add_argument("--root", default=None, help="data root (default $TRAINING_ASSETS_DATA or ./data)")
        add_model_options(q, settings)
        q.add_argument("--json", action="store_true", help="machine-readable report")
        q.set_defaults(handler=_build_dataset)
