"""Verbs: ``evaluate``, ``register`` and ``registry {list,pick,rollback}``.

    training-assets evaluate merged_adapter                      # asset key under the data root, or a path
    training-assets evaluate runs/sft/final --cases my_cases.jsonl --no-benchmarks --json
    training-assets evaluate merged_adapter --device cuda:0 --dtype bfloat16 --batch-size 64   # auto: GPU + bf16 if any
    training-assets evaluate merged_adapter --benchmark-limit 30 --min-pass-rate 0.8 \\
        --min-category-pass-rate '{"safety": 1.0}'               # settings: evaluation.EvalSettings
    training-assets register merged_adapter --role generator --served-model-name agent \\
        --eval-report data/merged_eval_report                    # refuses when that report's gate failed
    training-assets registry list
    training-assets registry pick generator --json               # what serves the role, and its lineage
    training-assets registry rollback generator [--to-version 3] [--base-url http://127.0.0.1:8000]

The tracking URI is ``--tracking-uri``, else ``$MLFLOW_TRACKING_URI``, else the SQLite store
under the data root (``--root``, default ``$TRAINING_ASSETS_DATA``), as in the Dagster assets.

``evaluate``'s setting options derive from ``evaluation.EvalSettings`` and ``GateThresholds``
(``commands._options``): the eval report assets' run config fields, with the same names, help and
library defaults.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from training_assets import evaluation, paths
from training_assets.checkpoint_loading import resolve_checkpoint
from training_assets.checkpoint_manifest import MANIFEST_FILE, folder_manifest, read_manifest_file
from training_assets.commands import emit, fail
from training_assets.commands._options import add_model_options, model_from_args
from training_assets.deploy import DeploymentError, DeploymentTarget
from training_assets.evaluation import DEFAULT_CASES, load_eval_report
from training_assets.evaluation.settings import RUN_FIELDS, EvalSettings, GateThresholds
from training_assets.lineage import Lineage, LineageError, collect_lineage
from training_assets.registry import ModelRegistry, RegistryError, promotion_verdict
from training_assets.settings import fields_model
from training_assets.tracking import default_tracking_uri

EVAL_RUN_FIELDS = fields_model(EvalSettings, RUN_FIELDS)


def _checkpoint(arg: str, root: str | None) -> tuple[Path, str | None]:
    """A path as given, else an asset key under the data root; returns (folder, asset key or None)."""
    path = Path(arg)
    if path.exists():
        return path, None
    folder = paths.asset_dir(arg, root)
    if (folder / "manifest.json").is_file():
        return folder, arg
    raise FileNotFoundError(f"{arg}: no such path, and no checkpoint asset {folder}/manifest.json; "
                            "pass a checkpoint folder or an asset key such as merged_adapter")


def _registry(args: argparse.Namespace) -> Any:
    return ModelRegistry(args.tracking_uri or default_tracking_uri(args.root), args.model_name)


def _evaluate(args: argparse.Namespace) -> int:
    try:
        run = model_from_args(EVAL_RUN_FIELDS, args).model_dump()
        if args.no_benchmarks:
            run["benchmark_tasks"] = ()
        settings = EvalSettings(gate=model_from_args(GateThresholds, args), **run)
        folder, _ = _checkpoint(args.checkpoint, args.root)
        cases = evaluation.load_cases(args.cases)
        evaluation.resolve_device(settings.device, settings.dtype)  # a bad --device fails before the model loads
    except (FileNotFoundError, ValueError) as exc:
        return fail(str(exc))
    payload = evaluation.run_eval_report(folder, cases, settings.gate, benchmark_tasks=settings.benchmark_tasks,
                                         benchmark_limit=settings.benchmark_limit or None,
                                         max_new_tokens=settings.max_new_tokens, device=settings.device,
                                         dtype=settings.dtype, batch_size=settings.batch_size)
    if args.out:
        evaluation.write_eval_report(args.out, payload)
    lines = [f"{folder}: pass rate {payload['metrics']['pass_rate']:.3f} over {payload['summary']['n_cases']} cases"]
    lines += [f"  {cat}: {v['passed']}/{v['n']}" for cat, v in payload["report"]["by_category"].items()]
    if payload["benchmarks"].get("skipped"):
        lines.append(f"  lm-eval skipped: {payload['benchmarks']['skipped']}")
    lines += [f"  {task}: {metrics}" for task, metrics in payload["benchmarks"]["tasks"].items()]
    lines.append(f"gate {'passed' if payload['gate']['passed'] else 'FAILED'}: " + "; ".join(payload["gate"]["reasons"]))
    emit(args, payload, "\n".join(lines))
    return 0 if payload["gate"]["passed"] else 1


def _register(args: argparse.Namespace) -> int:
    try:
        folder, asset = _checkpoint(args.checkpoint, args.root)
        if (folder / MANIFEST_FILE).is_file():
            manifest = read_manifest_file(folder)
        else:
            dirs = resolve_checkpoint(folder)
            manifest = folder_manifest(dirs.checkpoint_dir, dirs.tokenizer_dir, dirs.base_model_dir, folder.name)
        summary: dict[str, Any] = {}
        if args.eval_report:
            report = load_eval_report(args.eval_report)
            ok, reason = promotion_verdict(report, manifest)
            if not ok:
                return fail(f"not registering {folder}: {reason}", code=1)
            summary = {"metrics": report["metrics"], "gate": report["gate"], "eval_config": report.get("eval_config")}
        lineage = collect_lineage(args.root, asset, summary) if asset else Lineage(eval_summary=summary)
        checkpoint_id = args.checkpoint_id or f"{asset or folder.name}-{manifest.data_version}"
        target = DeploymentTarget(args.role, args.served_model_name, args.base_url)
        entry = _registry(args).register(folder, target, checkpoint_id, lineage)
    except (FileNotFoundError, ValueError, RegistryError, LineageError, DeploymentError) as exc:
        return fail(str(exc))
    emit(args, entry.to_dict(), f"{entry.note}\n  serve: {entry.deployment['serve_command']}")
    return 0


def _describe(entry: Any) -> str:
    lineage = entry.lineage
    return (f"{entry.role}: v{entry.version} {entry.checkpoint_id} ({entry.served_model_name})\n"
            f"  checkpoint: {entry.checkpoint_uri}\n  trace batches: {', '.join(lineage.trace_partitions) or '-'}\n"
            f"  corpus: {lineage.corpus_version}  tokenizer: {lineage.tokenizer_hash}\n"
            f"  datasets: {dict(lineage.dataset_versions)}\n  runs: {dict(lineage.training_run_ids)}\n"
            f"  serve: {entry.deployment.get('serve_command')}")


def _registry_verb(args: argparse.Namespace) -> int:
    registry = _registry(args)
    try:
        if args.action == "list":
            rows = registry.list()
            text = "\n".join(f"v{r['version']} {r['checkpoint_id']} roles={r['roles']} {r['trace_partitions']}"
                             for r in rows) or f"no versions registered in {registry.model_name}"
            emit(args, rows, text)
        elif args.action == "pick":
            entry = registry.pick_for_role(args.role)
            emit(args, entry.to_dict(), _describe(entry))
        else:
            target = None
            if args.base_url:
                if not args.served_model_name:
                    return fail("--base-url needs --served-model-name (the adapter name to load)")
                target = DeploymentTarget(args.role, args.served_model_name, args.base_url)
            entry, reason = registry.rollback(args.role, args.to_version, target)
            emit(args, {"reason": reason, "entry": entry.to_dict()}, f"{reason}\n{_describe(entry)}")
    except (RegistryError, DeploymentError) as exc:
        return fail(str(exc))
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default=None, help="data root (default $TRAINING_ASSETS_DATA or ./data)")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: the data root's SQLite store)")
    p.add_argument("--model-name", default="agent-model", help="MLflow registered model holding the role aliases")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("evaluate", help="reliability suite (+ lm-eval offline) on a checkpoint; exit 1 if the gate fails")
    p.add_argument("checkpoint", help="checkpoint asset key (e.g. merged_adapter) or folder (manifest, HF or PEFT dir)")
    p.add_argument("--cases", default=str(DEFAULT_CASES), help="eval cases JSONL (default: the shipped suite)")
    p.add_argument("--no-benchmarks", action="store_true", help="skip lm-eval (as --benchmark-tasks '[]')")
    add_model_options(p, EVAL_RUN_FIELDS)
    add_model_options(p, GateThresholds)
    p.add_argument("--out", default=None, help="folder to write report.json into")
    _common(p)
    p.set_defaults(handler=_evaluate)

    p = subparsers.add_parser("register", help="register a checkpoint for a role (MLflow alias) and deploy or record it")
    p.add_argument("checkpoint", help="checkpoint asset key (e.g. merged_adapter) or folder")
    p.add_argument("--role", required=True, help="role the model serves (becomes the MLflow alias)")
    p.add_argument("--served-model-name", required=True, help="name clients request")
    p.add_argument("--base-url", default=None, help="vLLM server to load the adapter into; omitted: record the command")
    p.add_argument("--checkpoint-id", default=None, help="idempotency key (default: <asset>-<data version>)")
    p.add_argument("--eval-report", default=None, help="eval report folder whose gate must have passed")
    _common(p)
    p.set_defaults(handler=_register)

    p = subparsers.add_parser("registry", help="list versions, show the model for a role, roll a role back")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    a = actions.add_parser("list", help="every registered version and the roles it serves")
    _common(a)
    a = actions.add_parser("pick", help="the model serving a role, with its lineage")
    a.add_argument("role")
    _common(a)
    a = actions.add_parser("rollback", help="move the role's alias to the previous version (or --to-version)")
    a.add_argument("role")
    a.add_argument("--to-version", type=int, default=None, help="promote this version instead of the previous one")
    a.add_argument("--base-url", default=None, help="also load that version's adapter into this vLLM server")
    a.add_argument("--served-model-name", default=None, help="adapter name on the server (with --base-url)")
    _common(a)
    p.set_defaults(handler=_registry_verb)
