"""Verb: ``gc``: free training run folders nothing refers to any more (a dry run unless ``--execute``).

    training-assets gc                     # prints what it would free, deletes nothing
    training-assets gc --execute --json    # deletes, prints what it freed

A checkpoint asset trains in ``<root>/<asset>/runs/<fingerprint>/`` and its manifest points into
it; training never deletes an older run folder (a registry version, a resumed run or a manifest
elsewhere may still need it). ``gc`` keeps a run folder when

- a manifest under the data root names a path inside it (the asset's own ``manifest.json``, an
  adapter's ``base_model_dir`` in the SFT run, a CLI run's manifest),
- a model version in the registry (MLflow) names a path inside it,
- a queued or running Dagster run may be training that asset (``$DAGSTER_HOME``'s instance),
- or it changed less than ``--min-age-s`` ago (a run that is starting now);

everything else is listed with its size and, with ``--execute``, deleted (renamed aside first, so a
folder is never left half-deleted under its own name).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training_assets import paths
from training_assets.commands import emit, fail
from training_assets.kinds import CHECKPOINTS
from training_assets.registry import ModelRegistry
from training_assets.trainers.run_guards import run_dir_holder



@dataclass
class GcPlan:
    """Run folders to free (path, bytes) and to keep (path, reason)."""

    free: list[tuple[Path, int]] = field(default_factory=list)
    keep: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def bytes_to_free(self) -> int:
        return sum(size for _, size in self.free)

    def to_dict(self) -> dict[str, Any]:
        return {"free": [{"path": str(p), "bytes": b} for p, b in self.free],
                "keep": [{"path": str(p), "reason": r} for p, r in self.keep], "bytes_to_free": self.bytes_to_free}


def run_folders(root: Path) -> list[tuple[str, Path]]:
    """(asset, run folder) for every training run folder under the data root."""
    from training_assets.trainers.jobs import RUNS_DIR  # dagster_pipes: ~0.15 s on every --help, only when gc runs

    out = []
    for asset in CHECKPOINTS:  # merged_adapter merges in place, without run folders
        runs = paths.asset_dir(asset, root) / RUNS_DIR
        if runs.is_dir():
            out.extend((asset, d) for d in sorted(runs.iterdir()) if d.is_dir() and not d.name.startswith("."))
    return out


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def _inside(text: str, folder: Path) -> bool:
    candidate = text.removeprefix("file://")
    if not candidate.startswith("/"):
        return False
    try:
        return Path(candidate).resolve().is_relative_to(folder.resolve())
    except (OSError, ValueError):
        return False


def manifest_references(root: Path) -> list[tuple[Path, list[str]]]:
    """Every manifest.json under the data root with the strings it holds (paths among them)."""
    refs = []
    for manifest in sorted(root.rglob("manifest.json")):
        try:
            data = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{manifest} is not readable JSON ({exc}); fix or remove it before gc") from None
        refs.append((manifest, list(_strings(data))))
    return refs


def registry_references(tracking_uri: str | None, root: Path) -> list[tuple[str, list[str]]]:
    """(version label, strings of its definition) for every registered model version."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        store = root / "mlflow" / "mlflow.db"
        if not store.is_file():
            return []  # no registry was ever written under this root
        uri = f"sqlite:///{store}"
    registry = ModelRegistry(uri)
    return [(f"registry version {row['version']}", list(_strings(registry.get(row["version"]).to_dict())))
            for row in registry.list()]


def plan_gc(root: Path, manifests: Iterable[tuple[Path, list[str]]], registry: Iterable[tuple[str, list[str]]],
            active: list[dict[str, Any]], min_age_s: float, now: float | None = None) -> GcPlan:
    """Decide, for each run folder, free or keep (with the reason). Pure: the inputs are read by the caller."""
    now = time.time() if now is None else now
    manifests, registry = list(manifests), list(registry)
    busy = {a: r for r in active for a in r["assets"]}
    plan = GcPlan()
    for asset, folder in run_folders(root):
        reason = None
        holder = run_dir_holder(folder)
        if holder is not None:
            reason = f"a training run (pid {holder}) holds it"
        elif asset in busy:
            reason = f"Dagster run {busy[asset]['run_id']} ({busy[asset]['status']}) may be training {asset}"
        if reason is None:
            for manifest, strings in manifests:
                if not manifest.resolve().is_relative_to(folder.resolve()) and any(_inside(s, folder) for s in strings):
                    reason = f"referenced by {manifest}"
                    break
        if reason is None:
            for label, strings in registry:
                if any(_inside(s, folder) for s in strings):
                    reason = f"referenced by {label}"
                    break
        if reason is None:
            newest = max((p.stat().st_mtime for p in [folder, *folder.rglob("*")]), default=0.0)
            if now - newest < min_age_s:
                reason = f"changed {now - newest:.0f} s ago (< --min-age-s {min_age_s:.0f})"
        if reason is None:
            plan.free.append((folder, sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())))
        else:
            plan.keep.append((folder, reason))
    return plan


def execute(plan: GcPlan) -> None:
    """Delete the folders to free: each is renamed aside first, then removed."""
    for folder, _ in plan.free:
        aside = folder.with_name(f".gc-{folder.name}")
        os.replace(folder, aside)
        shutil.rmtree(aside)


def _active_runs() -> list[dict[str, Any]]:
    from training_assets.orchestration.active_runs import in_progress_runs  # dagster: only when gc asks the instance

    return in_progress_runs(set(CHECKPOINTS))


def _gc(args: argparse.Namespace) -> int:
    root = paths.data_root(args.root)
    if not os.environ.get("DAGSTER_HOME") and not args.no_dagster:
        return fail("DAGSTER_HOME is not set: gc must ask the Dagster instance which training runs are queued or "
                    "running; set DAGSTER_HOME (or pass --no-dagster when no Dagster instance uses this data root)")
    try:
        active = [] if args.no_dagster else _active_runs()
        plan = plan_gc(root, manifest_references(root), registry_references(args.tracking_uri, root), active,
                       args.min_age_s)
    except (ValueError, OSError) as exc:
        return fail(str(exc))
    if args.execute:
        execute(plan)
    verb = "freed" if args.execute else "would free"
    lines = [f"{verb} {plan.bytes_to_free / 2**20:.1f} MiB in {len(plan.free)} run folder(s) under {root}"]
    lines += [f"  {'freed' if args.execute else 'free'} {p} ({b / 2**20:.1f} MiB)" for p, b in plan.free]
    lines += [f"  keep {p}: {r}" for p, r in plan.keep]
    if not args.execute and plan.free:
        lines.append("dry run: nothing deleted; run again with --execute to delete them")
    emit(args, {**plan.to_dict(), "executed": args.execute, "root": str(root)}, "\n".join(lines))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("gc", help="free training run folders nothing refers to (dry run unless --execute)")
    p.add_argument("--root", default=None, help="data root (default: $TRAINING_ASSETS_DATA or ./data)")
    p.add_argument("--execute", action="store_true", help="delete them (default: only print what would be freed)")
    p.add_argument("--min-age-s", type=float, default=3600.0,
                   help="keep run folders changed more recently than this (default 3600: a run may be starting)")
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow registry to read (default: $MLFLOW_TRACKING_URI, else <root>/mlflow/mlflow.db)")
    p.add_argument("--no-dagster", action="store_true", help="no Dagster instance uses this root: skip the run check")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=_gc)
