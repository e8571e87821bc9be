"""Verbs: ``train {pretrain,sft,dpo,grpo}`` (prints the plan; ``--execute`` trains) and ``merge-adapters``.

    training-assets train sft --set max_steps=50 --set lora.r=16          # plan only
    training-assets train sft --execute --output-dir runs/sft             # train in this process
    training-assets train pretrain --execute --num-processes 2            # torchrun, 2 CPU processes
    training-assets merge-adapters data/dpo_checkpoint/runs/*/final data/grpo_checkpoint/runs/*/final -o merged/

Examples come from the dataset assets under the data root (``--root``), or from a JSONL file
(``--examples``). A stage's base model defaults to its upstream checkpoint asset (sft ← base,
dpo/grpo ← sft), as in the Dagster graph.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from training_assets.commands import emit, fail

KIND_ASSET = {"pretrain": "base_checkpoint", "sft": "sft_checkpoint", "dpo": "dpo_checkpoint", "grpo": "grpo_checkpoint"}


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
    from training_assets import paths
    from training_assets.trainers import TrainConfig, get_trainer
    from training_assets.trainers.accelerate_launch import load_examples, run_job, write_job
    from training_assets.trainers.checkpoints import read_manifest
    from training_assets.trainers.jobs import CHECKPOINT_ASSETS

    root = paths.data_root(args.root)
    asset = KIND_ASSET[args.kind]
    _, dataset, upstream = CHECKPOINT_ASSETS[asset]
    try:
        fields = _parse_sets(args.set or [])
        if args.config:
            fields = {**json.loads(Path(args.config).read_text()), **fields}
        if "lora" in fields and isinstance(fields["lora"], dict):
            fields["lora"] = {"r": 16, "alpha": 32, **fields["lora"]}
        if "tokenizer" not in fields and (root / "tokenizer" / "tokenizer.json").is_file():
            fields["tokenizer"] = str(root / "tokenizer")
        if upstream is not None and "base_model" not in fields:
            fields["base_model"] = read_manifest(root, upstream)["checkpoint_dir"]
        fields["output_dir"] = str(Path(args.output_dir or root / "cli_runs" / args.kind).resolve())
        config = TrainConfig.from_dict(fields)
        spec = {"jsonl": args.examples} if args.examples else {"dataset": dataset, "root": str(root)}
        spec["limit"] = args.limit or None
        examples = load_examples(spec)
        trainer = get_trainer(args.kind, config)
        if config.tokenizer or config.base_model:
            trainer.load_tokenizer()
        plan = trainer.plan(examples, world_size=args.num_processes)
    except (ValueError, FileNotFoundError) as exc:
        return fail(str(exc))
    text = "\n".join(f"{k}: {v}" for k, v in plan.to_dict().items())
    if not args.execute:
        emit(args, {"plan": plan.to_dict(), "config": config.to_dict()}, text + "\n(plan only; add --execute to train)")
        return 0
    result_path = Path(config.output_dir) / "result.json"
    job = write_job(Path(config.output_dir) / "job.json", args.kind, config.to_dict(), spec, str(result_path))
    if args.num_processes > 1:
        from training_assets.launch import build_launch_command

        import torch

        cmd = build_launch_command(job, num_processes=args.num_processes, cpu=not torch.cuda.is_available(),
                                   python=sys.executable)
        done = subprocess.run(cmd)
        if done.returncode != 0:
            return fail(f"training failed ({done.returncode}): {' '.join(cmd)}", code=1)
        result = json.loads(result_path.read_text())
    else:
        result = run_job(json.loads(job.read_text()))
    train = result["train"]
    emit(args, result, f"{text}\ntrained {train['steps']} steps, final loss {train['final_loss']:.4f}, "
                       f"{train['tokens_per_s']:.0f} tokens/s, peak RSS {train['peak_rss_mb']:.0f} MB\n"
                       f"checkpoint: {result['checkpoint_dir']}")
    return 0


def _merge(args: argparse.Namespace) -> int:
    from training_assets.peft_manager import merge_lora_adapters

    try:
        summary = merge_lora_adapters(args.adapters, args.output, weights=args.weights, density=args.density,
                                      majority_sign_method=args.sign_method)
    except (ValueError, FileNotFoundError) as exc:
        return fail(str(exc))
    emit(args, summary, f"merged {len(args.adapters)} adapters ({summary['tensors']} tensors, rank {summary['rank']}, "
                        f"{summary['nonzero_fraction']:.1%} non-zero) -> {args.output}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="plan (default) or run a training stage: pretrain, sft, dpo, grpo")
    p.add_argument("kind", choices=sorted(KIND_ASSET), help="trainer")
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
