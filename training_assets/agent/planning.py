"""Plans: what a tool or a workflow stage would materialise, what it reuses, and the trainer's own plan.

    steps = decide(graph, states, scope=["tokenizer", "sft_dataset", "sft_checkpoint"], forced={"sft_checkpoint"})
    plan = training_plan("sft_checkpoint", effective_config, root)    # planned_steps, effective_batch, ...

Everything here only reads (the instance's asset states, the datasets under the data root): a
plan never writes a file or starts a run. An asset runs when it was asked for (or given config),
is missing, is stale in Dagster's sense, or sits below an asset that will run; otherwise it is
reused with its data version.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training_assets import kinds
from training_assets.agent.models import AssetStep, TrainingPlan


@dataclass
class Decision:
    materialize: list[AssetStep] = field(default_factory=list)
    reused: list[AssetStep] = field(default_factory=list)
    partitions: list[AssetStep] = field(default_factory=list)  # partitioned assets with missing partitions

    @property
    def assets(self) -> list[str]:
        return [s.asset for s in self.materialize]


def ancestors(graph: Mapping[str, Mapping[str, Any]], targets: Iterable[str]) -> list[str]:
    """``targets`` and every asset upstream of them, in dependency order."""
    wanted, stack = set(), list(targets)
    while stack:
        key = stack.pop()
        if key not in wanted:
            wanted.add(key)
            stack.extend(graph[key]["parents"])
    return [k for k in graph if k in wanted]


def decide(graph: Mapping[str, Mapping[str, Any]], states: Mapping[str, Mapping[str, Any]], scope: Iterable[str],
           forced: Mapping[str, str], will_run: set[str] | None = None) -> Decision:
    """Walk ``scope`` in dependency order and decide, per asset, run or reuse (with the reason).

    ``forced`` maps assets that run whatever their state to the reason (requested, config given);
    ``will_run`` carries assets earlier stages will (re)materialise, so their descendants run too.
    Partitioned assets are never selected here: their missing partitions are reported apart
    (one run per partition materialises them).
    """
    will_run = set() if will_run is None else will_run
    out = Decision()
    for asset in [k for k in graph if k in set(scope)]:
        state = states.get(asset, {})
        if graph[asset]["partitioned"]:
            missing = (state.get("partitions") or {}).get("missing") or []
            if missing:
                out.partitions.append(AssetStep(asset=asset, reason=f"{len(missing)} trace batch(es) not materialised: "
                                                                      f"{', '.join(missing[:5])}"))
            else:
                out.reused.append(AssetStep(asset=asset, reason=f"all {(state.get('partitions') or {}).get('total', 0)} "
                                                                 "partitions materialised"))
            continue
        upstream = sorted(set(graph[asset]["parents"]) & will_run)
        if asset in forced:
            reason = forced[asset]
        elif state.get("stale_status") == "MISSING":
            reason = "missing"
        elif state.get("stale_status") == "STALE":
            reason = "stale: " + "; ".join(state.get("stale_causes") or ["upstream changed"])
        elif upstream:
            reason = f"upstream will run ({', '.join(upstream)})"
        else:
            out.reused.append(AssetStep(asset=asset, reason="fresh", data_version=state.get("data_version")))
            continue
        will_run.add(asset)
        out.materialize.append(AssetStep(asset=asset, reason=reason, data_version=state.get("data_version")))
    return out


def pending_inbox_batches(root: Path, known: Iterable[str]) -> list[str]:
    """Inbox files the sensor would register as new batches (a read-only preview: nothing is moved or staged)."""
    from training_assets.inbox import scan_inbox  # pyarrow: ~0.3 s, the server builds without it

    return [b.batch_id for b in scan_inbox(known_batch_ids=known, root=root, reject=False).new]


def training_plan(asset: str, train_fields: Mapping[str, Any], root: Path, limit: int | None,
                  num_processes: int = 1) -> tuple[TrainingPlan | None, list[str]]:
    """The trainer's plan for a checkpoint asset from its TrainConfig fields, or the reasons it
    cannot be computed yet (the dataset is not built). The same ``prepare_job`` → ``run_training``
    path the asset takes, with ``execute=False``: it reads the dataset and the upstream manifest and
    writes nothing."""
    # the trainers and datasets import pyarrow (~0.4 s): the server builds without them
    from training_assets.checkpoint_manifest import read_manifest  # pyarrow
    from training_assets.trainers.jobs import prepare_job, run_training  # pyarrow, dagster_pipes
    from training_assets.training_data import read_dataset_info  # pyarrow

    training = kinds.kind_of_checkpoint(asset)
    dataset, upstream = training.dataset, training.upstream
    notes: list[str] = []
    fields = dict(train_fields)
    if upstream is not None:
        try:
            read_manifest(root, upstream)
        except FileNotFoundError:
            notes.append(f"{upstream} is not materialised yet: parameter counts come from the default PretrainSpec")
            fields["base_model"] = None
    if read_dataset_info(dataset, root) is None:
        notes.append(f"{dataset} is not built yet: examples and steps are known once it is")
        return None, notes
    job = prepare_job(asset, root, fields, limit=limit)
    plan = run_training(job, execute=False, num_processes=num_processes).plan.to_dict()
    return TrainingPlan(**plan), notes
