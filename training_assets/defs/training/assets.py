"""Checkpoint assets: each trains through ``trainers.jobs.run_training``, in a subprocess (Dagster Pipes) or in the run's process.

``run_training`` plans once in the asset's process (the plan goes into the job spec and the run
log). With a GPU, several processes or a distributed mode (``launcher: auto``, or ``subprocess``)
it launches ``trainers.accelerate_launch`` on the job spec — with ``num_processes > 1`` under
``torchrun`` (CPU, gloo) or ``accelerate launch`` (GPU), the asset code does not change — and the
subprocess reports its result as a Pipes custom message, from which the manifest is written. One
CPU process (the embedded default) trains in the run's own process: a new interpreter spent ~5 s
importing torch, transformers and MLflow and opening the tracking store for a demo training of
0.4 s, which the run's process, already holding them for the evaluations, pays once. Every
training step is in the ``training`` pool (dagster.yaml: one step of the pool at a time, across
runs) and runs when the retraining policy of ``defs/automation.py`` says so. Metadata: plan, steps,
final loss, tokens/s, peak memory, the tracker run, the checkpoint URI and a loss-curve plot.
dpo/grpo depend on ``sft_eval_report`` and ``merged_adapter`` on the DPO and GRPO eval reports:
their blocking gates stop what comes after a checkpoint that fails.
"""

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pydantic
from pydantic import Field

from training_assets import kinds, launch, paths, tracking
from training_assets.defs.automation import POLICY, TRAINING_POOL, base_model_condition, training_condition
from training_assets.defs.metadata import md_table, png_markdown
from training_assets.defs.resources import DataRoot, MlflowTracking
from training_assets.defs.settings import nested, spec_config
from training_assets.defs.training.config import TRAIN_FIELDS, overrides, training_config
from training_assets.trainers import TrainConfig, jobs
from training_assets.trainers.accelerate_launch import RESULT_MESSAGE
from training_assets.slots import hold_slot
from training_assets.checkpoint_manifest import CheckpointManifest
from training_assets.base_model.selection import adopt_checkpoint, current_base_model
from training_assets.tokenizer_trainer import tokenizer_dir, tokenizer_hash

TRAINING_CODE_VERSION = "trainers-2"  # nested DPO/GRPO specs, constant lr by default, one run_training path

# Demo defaults: a tiny model trained for seconds on CPU (hence the high lr). One torch thread per
# training process: dpo and grpo can train at the same time, and two processes spinning two OpenMP
# threads each on 2 shared cores ran ~20x slower here. MLflow tracking into the `mlflow` resource's store.
DEMO = {"max_steps": 8, "batch_size": 8, "lr": 3e-3, "save_steps": 4, "torch_threads": 1, "tracker": "mlflow"}
DEMO_LORA = {"r": 8, "alpha": 16}  # adapter kinds on the demo: a small adapter, scale alpha/r = 2 as LoraSpec's default
# Per-kind changes to the demo defaults (a kind not listed trains with DEMO as it is; an adapter kind with DEMO_LORA).
DEMO_CHANGES: dict[str, dict] = {
    "sft": {"max_steps": 6, "batch_size": 4, "packing": True},
    "grpo": {"max_steps": 3, "batch_size": 2},
}
EXTRA_FIELDS = {"sft": ("packing",)}  # TrainConfig fields only some kinds expose
SPEC_DEFAULTS = {"grpo": {"rollout": "mixed", "max_new_tokens": 16}}
SPEC_HELP = {"grpo": "rollout=mixed on the demo: a tiny policy's own samples tie, the logged attempts do not."}


def demo_defaults(kind: kinds.TrainingKind) -> dict:
    """Where ``kind``'s run config departs from TrainConfig's defaults on the demo."""
    return {**DEMO, **({"lora": DEMO_LORA} if kind.adapter else {}), **DEMO_CHANGES.get(kind.name, {})}


def checkpoint_config(kind: kinds.TrainingKind) -> type[dg.Config]:
    """The run config of ``kind``'s checkpoint asset, derived from TrainConfig and the kind's own spec."""
    defaults = demo_defaults(kind)
    spec = {}
    if kind.spec is not None:
        spec_class = TrainConfig.model_fields[kind.spec].annotation
        options = spec_config(f"{kind.name.title()}Options", spec_class, defaults=SPEC_DEFAULTS.get(kind.name))
        spec[kind.spec] = nested(options, f"{kind.name} options ({spec_class.__name__}). {SPEC_HELP.get(kind.name, '')}".strip())
    return training_config(f"{kind.name.title()}CheckpointConfig", defaults,
                           fields=(*TRAIN_FIELDS, *EXTRA_FIELDS.get(kind.name, ())), **spec)


def _pipes_launcher(context: dg.AssetExecutionContext) -> jobs.Launcher:
    """Run the training command under Dagster Pipes and return the result it reported."""

    def run(argv: list[str]) -> dict:
        context.log.info(f"training: {launch.format_command(argv)}")
        completed = dg.PipesSubprocessClient().run(command=argv, context=context, env=dict(os.environ))
        results = [m[RESULT_MESSAGE] for m in completed.get_custom_messages()
                   if isinstance(m, dict) and RESULT_MESSAGE in m]
        if not results:
            raise dg.Failure(description=f"{launch.format_command(argv)} exited without reporting a training result "
                                         "through Pipes; see its log lines above")
        return results[-1]

    return run


def pool_limit(instance: dg.DagsterInstance, pool: str = TRAINING_POOL) -> int | None:
    """The pool's slot count on ``instance`` (its own limit, else dagster.yaml's default_limit); None: unlimited."""
    limits = {p.name: p.limit for p in instance.event_log_storage.get_pool_limits()}
    return limits.get(pool, instance.get_concurrency_config().pool_config.default_pool_limit)


@contextmanager
def training_slot(context: dg.AssetExecutionContext, root: Path) -> Iterator[None]:
    """One of the training pool's slots on the data root while the step trains (``training_assets.slots``).

    Dagster's pool queues the step and shows it in the UI, but two steps claiming at the same
    moment can both get its one slot (see ``slots``): this lock makes the limit hold.
    """
    limit = pool_limit(context.instance)
    if limit is None:
        yield
        return
    with hold_slot(paths.slots_dir(root), TRAINING_POOL, limit, on_wait=context.log.info):
        yield


CANCEL_POLL_S = 1.0  # how often a training in the run's process asks the instance whether its run was canceled


def stop_when_canceled(context: dg.AssetExecutionContext) -> Callable[[int, dict[str, float]], None]:
    """A step callback for training in the run's process: once the run is CANCELING (or CANCELED), the
    loop stops at its next logged step with Dagster's interrupt, and Dagster records the run CANCELED.

    A cancel also signals the run's process, which interrupts the step; this check does not rest on
    the signal arriving while the step's own code runs (once in ~10 suite runs a canceled run trained
    to its end and succeeded). It reads the run's status at most every ``CANCEL_POLL_S`` seconds.
    """
    asked = [0.0]

    def check(step: int, metrics: dict[str, float]) -> None:
        now = time.monotonic()
        if now - asked[0] < CANCEL_POLL_S:
            return
        asked[0] = now
        run = context.instance.get_run_by_id(context.run_id)
        if run is not None and run.status in (dg.DagsterRunStatus.CANCELING, dg.DagsterRunStatus.CANCELED):
            context.log.info(f"run {context.run_id} is {run.status.value}: training stops at step {step}")
            raise dg.DagsterExecutionInterruptedError()

    return check


def launch_mode(config: dg.Config, job: jobs.TrainingJob) -> str:
    """``subprocess`` or ``in_process`` for the config's ``launcher`` (``auto``: a subprocess when one
    process on the CPU is not enough); an in-process launch that cannot train the job is refused."""
    needs_processes = config.num_processes > 1 or job.config.distributed != "none"
    if config.launcher == "auto":
        return "subprocess" if needs_processes or jobs.has_cuda() else "in_process"
    if config.launcher == "in_process" and needs_processes:
        raise dg.Failure(description=f"{job.asset}: launcher='in_process' trains one process; num_processes="
                                     f"{config.num_processes}, distributed={job.config.distributed!r} need "
                                     "launcher='subprocess' (or 'auto')")
    return config.launcher


def _train(context: dg.AssetExecutionContext, asset_key: str, config: dg.Config, data_root: DataRoot,
           mlflow: MlflowTracking) -> dg.MaterializeResult:
    root = data_root.root()
    base = current_base_model(root)
    if kinds.kind_of_checkpoint(asset_key).upstream is None and base is not None and base.folder:
        # a pretrained base_model: it is the base checkpoint (its weights where they are; nothing pretrained)
        manifest = adopt_checkpoint(root, base, tokenizer_dir(root), tokenizer_hash(root), asset_key, context.run_id)
        context.log.info(f"{asset_key}: the pretrained {base.source} ({base.model_hash}); not pretrained from scratch")
        return _result(manifest, adopted=base.source)
    job = jobs.prepare_job(asset_key, root, overrides(config), tracking_uri=mlflow.uri(root),
                           tags={"dagster_run_id": context.run_id, "asset": asset_key},
                           limit=config.limit_examples or None)
    mode = launch_mode(config, job)
    with training_slot(context, root):
        run = jobs.run_training(job, num_processes=config.num_processes,
                                launcher=_pipes_launcher(context) if mode == "subprocess" else None,
                                dagster_run_id=context.run_id, log=context.log.info,
                                callbacks=(stop_when_canceled(context),))
    return _result(run.manifest, launcher=mode)


def _result(manifest: CheckpointManifest, **extra: str) -> dg.MaterializeResult:
    train = manifest.train
    metadata = {
        **extra,
        "kind": manifest.kind,
        "checkpoint_uri": dg.MetadataValue.path(manifest.checkpoint_dir),
        "data_versions": dg.MetadataValue.json(manifest.data_versions),
    }
    if train.losses:
        metadata.update({
            "plan": md_table([{k: v for k, v in (manifest.plan or {}).items() if k != "notes"}]),
            "steps": train.steps, "final_loss": float(train.final_loss), "tokens_per_s": float(train.tokens_per_s),
            "peak_rss_mb": float(train.peak_rss_mb), "resumed_from": str(train.resumed_from),
            "tracker": manifest.tracker, "tracker_run_id": str(manifest.tracker_run_id),
            "tracking_uri": str(manifest.tracking_uri),
            "loss_curve": png_markdown(tracking.loss_curve_png(train.losses, manifest.asset), "loss curve"),
        })
    if train.mean_rewards:
        metadata["mean_reward_per_step"] = dg.MetadataValue.json(train.mean_rewards)
    if train.skipped:
        metadata["skipped_examples"] = dg.MetadataValue.json(train.skipped[:50])
    if train.merge:
        metadata["merge"] = dg.MetadataValue.json(train.merge)
    return dg.MaterializeResult(metadata=metadata, data_version=dg.DataVersion(manifest.data_version))


_COMMON = dict(group_name="training", code_version=TRAINING_CODE_VERSION, kinds={"pytorch"}, pool=TRAINING_POOL,
               automation_condition=training_condition(POLICY))


def checkpoint_asset(kind: kinds.TrainingKind) -> dg.AssetsDefinition:
    """``kind.checkpoint``: trains on ``kind.dataset`` from ``kind.upstream`` once the upstream's gate passed."""
    config_class = checkpoint_config(kind)
    upstream_gate = kinds.kind_of_checkpoint(kind.upstream).gate if kind.upstream else None
    deps = [kind.dataset, "tokenizer", *([kind.upstream] if kind.upstream else ["base_model"]),
            *([upstream_gate] if upstream_gate else [])]
    condition = training_condition(POLICY) if kind.upstream else base_model_condition()

    def train(context: dg.AssetExecutionContext, config: config_class, data_root: DataRoot,  # type: ignore[valid-type]
              mlflow: MlflowTracking) -> dg.MaterializeResult:
        return _train(context, kind.checkpoint, config, data_root, mlflow)

    start = f"from {kind.upstream}" if kind.upstream else "from random init, or the pretrained base_model when it names one"
    return dg.asset(name=kind.checkpoint, deps=deps, description=f"{kind.summary} ({start}, on {kind.dataset}).",
                    **{**_COMMON, "automation_condition": condition})(train)


checkpoint_assets = [checkpoint_asset(kind) for kind in kinds.KINDS.values()]


MergeConfig = pydantic.create_model(
    "MergeConfig", __base__=dg.Config, __doc__="TIES merge of the adapter kinds' checkpoints.",
    density=(float, Field(0.5, ge=0.0, le=1.0, description="TIES: share of each task vector kept (largest magnitudes).")),
    **{f"{name}_weight": (float, Field(1.0, description=f"Weight of the {name} adapter.")) for name in kinds.MERGED_KINDS})
MERGED_CHECKPOINTS = [kinds.kind(name).checkpoint for name in kinds.MERGED_KINDS]


# The adapters' gates block the merge: an adapter whose eval report fails is never merged.
@dg.asset(deps=[*MERGED_CHECKPOINTS, *(kinds.kind(name).gate for name in kinds.MERGED_KINDS)], **_COMMON)
def merged_adapter(context: dg.AssetExecutionContext, config: MergeConfig, data_root: DataRoot) -> dg.MaterializeResult:
    """TIES merge (trim, elect sign, disjoint mean) of the adapter kinds' LoRA adapters (DPO and GRPO)."""
    with training_slot(context, data_root.root()):
        manifest = jobs.merge_job(data_root.root(), sources=tuple(MERGED_CHECKPOINTS),
                                  weights=[getattr(config, f"{name}_weight") for name in kinds.MERGED_KINDS],
                                  density=config.density, dagster_run_id=context.run_id)
    return _result(manifest)
