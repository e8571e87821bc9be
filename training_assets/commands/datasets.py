"""Verbs: ``train-tokenizer``, ``build-dataset {sft,dpo,grpo,pretrain}``.

    training-assets train-tokenizer --vocab-size 2048 --json
    training-assets build-dataset sft --max-tokens 1024
    training-assets build-dataset grpo --scale-rewards none

Both read what the upstream assets wrote under the data root (``--root``, default
``$TRAINING_ASSETS_DATA``) and write what the matching asset writes; exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
from typing import Any

from training_assets import paths
from training_assets.commands import emit, fail

KINDS = {"sft": "sft_dataset", "dpo": "preference_pairs", "grpo": "grpo_groups", "pretrain": "pretrain_windows"}


def _train_tokenizer(args: argparse.Namespace) -> int:
    from training_assets import data_engine, tokenizer_trainer

    root = paths.data_root(args.root)
    try:
        config = tokenizer_trainer.TokenizerConfig(args.vocab_size, args.min_frequency, args.max_chars,
                                                   args.held_back_fraction, args.seed)
        rows = data_engine.load_curated_corpus(root).select(["id", "text"]).to_pylist()
        report = tokenizer_trainer.build_tokenizer(rows, data_engine.corpus_version(root), config,
                                                   tokenizer_trainer.tokenizer_dir(root))
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
    from training_assets.training_data import pipeline

    if kind == "sft":
        return pipeline.build_sft_dataset(root, pipeline.SftConfig(args.max_tokens))
    if kind == "dpo":
        return pipeline.build_preference_dataset(root, pipeline.PreferenceConfig(args.max_pairs_per_task, not args.allow_failed_chosen))
    if kind == "grpo":
        return pipeline.build_grpo_dataset(root, pipeline.GrpoConfig(scale_rewards=args.scale_rewards,
                                                                     min_pass_rate=args.min_pass_rate, max_pass_rate=args.max_pass_rate))
    return pipeline.build_pretrain_dataset(root, pipeline.PretrainConfig(args.window))


def _build_dataset(args: argparse.Namespace) -> int:
    root = paths.data_root(args.root)
    try:
        report = _build(args.kind, root, args)
    except (ValueError, FileNotFoundError) as exc:
        return fail(f"build-dataset {args.kind}: {exc}")
    info = report.info
    payload = {"dataset": KINDS[args.kind], "uri": str(info.path), "rows": info.rows, "data_version": info.data_version,
               "reused": report.reused, "key": info.key, "stats": info.stats,
               "checks": {c.name: {"passed": c.passed, "description": c.description} for c in report.checks}}
    lines = [f"{KINDS[args.kind]} {info.data_version}: {info.rows} rows -> {info.path} ({'reused' if report.reused else 'built'})"]
    lines += [f"  check {c.name}: {'ok' if c.passed else 'FAILED'} - {c.description}" for c in report.checks]
    emit(args, payload, "\n".join(lines))
    return 0 if all(c.passed for c in report.checks) else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train-tokenizer", help="train the byte-level BPE tokenizer on the curated corpus")
    p.add_argument("--root", default=None, help="data root (default $TRAINING_ASSETS_DATA or ./data)")
    p.add_argument("--vocab-size", type=int, default=2048, help="vocabulary size (>= 512)")
    p.add_argument("--min-frequency", type=int, default=2, help="pairs seen fewer times are never merged")
    p.add_argument("--max-chars", type=int, default=50_000_000, help="training text is cut after this many characters")
    p.add_argument("--held-back-fraction", type=float, default=0.05, help="share of rows kept out for the round-trip check")
    p.add_argument("--seed", type=int, default=0, help="picks the held-back rows")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.set_defaults(handler=_train_tokenizer)

    p = subparsers.add_parser("build-dataset", help="build a training dataset: sft, dpo, grpo or pretrain")
    p.add_argument("kind", choices=sorted(KINDS), help="which dataset (sft_dataset, preference_pairs, grpo_groups, pretrain_windows)")
    p.add_argument("--root", default=None, help="data root (default $TRAINING_ASSETS_DATA or ./data)")
    p.add_argument("--max-tokens", type=int, default=1024, help="sft: longer conversations are skipped")
    p.add_argument("--max-pairs-per-task", type=int, default=4, help="dpo: at most this many pairs per task")
    p.add_argument("--allow-failed-chosen", action="store_true", help="dpo: a higher score suffices for chosen")
    p.add_argument("--scale-rewards", choices=["group", "none"], default="group", help="grpo: 'none' is Dr. GRPO")
    p.add_argument("--min-pass-rate", type=float, default=0.0, help="grpo: drop groups passing less often")
    p.add_argument("--max-pass-rate", type=float, default=1.0, help="grpo: drop groups passing more often")
    p.add_argument("--window", type=int, default=256, help="pretrain: tokens per packed window")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.set_defaults(handler=_build_dataset)
