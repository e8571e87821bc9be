"""Verbs: ``train {pretrain,sft,dpo,grpo}`` (prints the plan; ``--execute`` trains) and ``merge-adapters``.

    training-assets train sft --set max_steps=50 --set lora.r=16          # plan only
    training-assets train sft --execute --output-dir runs/sft             # train in this process
    training-assets train pretrain --execute --num-processes 2            # torchrun, 2 CPU processes
    training-assets merge-adapters data/dpo_checkpoint/runs/*/final data/grpo_checkpoint/runs/*/final -o merged/

Examples come from the dataset assets under the data root (``--root``), or from a JSONL file
(``--examples``). A stage's base model defaults to its upstream checkpoint asset (sft ← base,
dpo/grpo ← sft), as in the Dagster graph. Everything goes through ``trainers.jobs.run_training``
as the assets do: the plan is made once and printed; ``--execute`` trains and writes
``<output-dir>/manifest.json``. Nested options: ``--set dpo.beta=0.2 --set grpo.rollout=dataset``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from training_assets import paths
from training_assets.commands import emit, fail
from training_assets.kinds import KINDS
from training_assets.peft_manager import merge_lora_adapters


def _parse_sets(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` (value parsed as JSON when it can be; ``lora.r=8`` sets a nested field)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"--set {pair!r}: expected key=value")
        key, raw = pair.split("=", 1)
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        if "." in key:
            outer, inner = key.split(".", 1)
            out.setdefault(outer, {})[inner] = value
        else:
            out[key] = value
    return out


def _train(args: argparse.Namespace) -> int:
    from training_assets.trainers.jobs import prepare_job, run_training, subprocess_launcher  # dagster_pipes: ~0.15 s on every --help

    try:
        fields = _parse_sets(args.set or [])
        if args.config:
            fields = {**json.loads(Path(args.config).read_text()), **fields}
        if "lora" in fields and isinstance(fields["lora"], dict):
            fields["lora"] = {"r": 16, "alpha": 32, **fields["lora"]}
        output_dir = args.output_dir or Path(paths.data_root(args.root)) / "cli_runs" / args.kind
        job = prepare_job(KINDS[args.kind].checkpoint, args.root, fields, output_dir=output_dir,
                          examples_jsonl=args.examples, limit=args.limit or None)
        launcher = subprocess_launcher() if args.num_processes > 1 else None
        run = run_training(job, execute=args.execute, num_processes=args.num_processes, launcher=launcher,
                           log=None if args.json else print)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        return fail(str(exc), code=1 if isinstance(exc, RuntimeError) else 2)
    plan = run.plan.to_dict()
    if run.manifest is None:
        text = "\n".join(f"{k}: {v}" for k, v in plan.items())
        emit(args, {"plan": plan, "config": job.config.to_dict()}, text + "\n(plan only; add --execute to train)")
        return 0
    train = run.manifest.train
    emit(args, {"plan": plan, "manifest": run.manifest.to_dict(), "checkpoint_dir": run.manifest.checkpoint_dir},
         f"trained {train.steps} steps, final loss {train.final_loss:.4f}, {train.tokens_per_s:.0f} tokens/s, "
         f"peak RSS {train.peak_rss_mb:.0f} MB\ncheckpoint: {run.manifest.checkpoint_dir}\n"
         f"manifest: {job.manifest_dir / 'manifest.json'}")
    return 0


def _merge(args: argparse.Namespace) -> int:
    try:
        summary = merge_lora_adapters(args.adapters, args.output, weights=args.weights, density=args.density,
                                      majority_sign_method=args.sign_method)
    except (ValueError, FileNotFoundError) as exc:
        return fail(str(exc))
    emit(args, summary, f"merged {len(args.adapters)} adapters ({summary['tensors']} tensors, rank {summary['rank']}, "
                        f"{summary['nonzero_fraction']:.1%} non-zero) -> {args.output}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help=f"plan (default) or run a training stage: {', '.join(KINDS)}")
    p.add_argument("kind", choices=list(KINDS), help="; ".join(f"{k.name}: {k.summary}" for k in KINDS.values()))
    p.add_argument("--execute", action="store_true", help="train (without it only the plan is printed)")
    p.add_argument("--root", help="data root (default $TRAINING_ASSETS_DATA or ./data)")
    p.add_argument("--examples", help="JSONL file of examples instead of the dataset asset")
    p.add_argument("--limit", type=int, default=0, help="use only the first N examples")
    p.add_argument("--config", help="JSON file of TrainConfig fields")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="TrainConfig field (repeatable; lora.r=8)")
    p.add_argument("--output-dir", help="run directory (default <root>/cli_runs/<kind>)")
    p.add_argument("--num-processes", type=int, default=1, help="processes (torchrun on CPU, accelerate on GPU)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=_train)

    m = subparsers.add_parser("merge-adapters", help="TIES-merge LoRA adapters (same base and rank) into one")
    m.add_argument("adapters", nargs="+", help="PEFT adapter dirs")
    m.add_argument("-o", "--output", required=True, help="output adapter dir")
    m.add_argument("--weights", type=float, nargs="+", help="one weight per adapter (default 1.0 each)")
    m.add_argument("--density", type=float, default=0.5, help="share of each task vector kept")
    m.add_argument("--sign-method", default="total", choices=["total", "frequency"], help="sign election")
    m.add_argument("--json", action="store_true", help="machine-readable output")
    m.set_defaults(handler=_merge)
