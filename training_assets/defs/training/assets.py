"""Checkpoint assets: each trains in a subprocess (Dagster Pipes) and records the run in metadata.

The subprocess is ``trainers.accelerate_launch`` on a job spec; with ``num_processes > 1`` the
command becomes ``torchrun`` (CPU, gloo) or ``accelerate launch`` (GPU) — the asset code does
not change. Runs carry the tag ``training_assets/resource: accelerator`` (dagster.yaml allows one
such run at a time). Metadata: plan, steps, final loss, tokens/s, peak memory, the MLflow run,
the checkpoint URI and a loss-curve plot. dpo/grpo depend on ``sft_eval_report``, whose
blocking gate stops them when the SFT checkpoint fails evaluation.
"""

import os
import sys
from typing import Optional

import dagster as dg
from pydantic import Field

from training_assets import launch, tracking
from training_assets.defs.metadata import md_table, png_markdown
from training_assets.defs.resources import DataRoot, MlflowTracking
from training_assets.trainers import jobs

ACCELERATOR_TAG = {"training_assets/resource": "accelerator"}
TRAINING_CODE_VERSION = "trainers-1"


class TrainingConfig(dg.Config):
    max_steps: int = Field(8, description="Optimizer steps (the demo default is small: a tiny model on CPU).")
    batch_size: int = Field(8, description="Examples per micro-batch per process (GRPO: prompts per micro-batch).")
    grad_accum: int = Field(1, description="Micro-batches per optimizer step.")
    lr: float = Field(3e-3, description="Peak learning rate (high: a tiny random-init model).")
    warmup_steps: int = Field(0, description="Linear warm-up steps (the first warm-up step has lr 0).")
    max_seq_len: int = Field(512, description="Longer examples are truncated.")
    precision: str = Field("fp32", description="fp32 | bf16 | fp16 (autocast; fp16 adds a GradScaler).")
    lora_r: int = Field(0, description="LoRA rank; 0 trains all weights.")
    lora_alpha: int = Field(16, description="LoRA alpha (scale alpha/r).")
    save_steps: int = Field(4, description="Checkpoint every N steps (a crashed run resumes from the newest).")
    seed: int = Field(0, description="Seed for init, data order and sampling.")
    kernel_backend: str = Field("torch", description="torch | numba loss kernels and optimizer.")
    torch_threads: int = Field(1, description=(
        "CPU threads per training process (0 = one per core). 1 by default: dpo and grpo can train at the same "
        "time, and two processes spinning two OpenMP threads each on 2 shared cores ran ~20x slower here."))
    num_processes: int = Field(1, description="Processes to launch (torchrun on CPU, accelerate launch on GPU).")
    limit_examples: int = Field(0, description="Train on the first N examples only (0 = all).")


class DpoConfig(TrainingConfig):
    max_steps: int = Field(8, description="Optimizer steps.")
    lora_r: int = Field(8, description="LoRA rank (the merge step needs adapters).")
    beta: float = Field(0.1, description="DPO beta.")
    dpo_loss_type: str = Field("sigmoid", description="sigmoid | ipo | hinge.")


class GrpoConfig(TrainingConfig):
    max_steps: int = Field(3, description="Optimizer steps (each samples a rollout batch).")
    batch_size: int = Field(2, description="Prompts per micro-batch; each gets num_generations completions.")
    lora_r: int = Field(8, description="LoRA rank (the merge step needs adapters).")
    rollout: str = Field("mixed", description=(
        "Where each group's rollouts come from. mixed (default): the logged attempts of the grpo_groups row, with "
        "their stored rewards, plus num_generations samples of the policy, advantages normalised over the whole "
        "group (LUFFY-style off-policy guidance), so the tiny policy learns from logged successes and failures; "
        "local: only the policy's own samples (their rewards are usually all equal for a tiny model, so the loss "
        "is 0); dataset: only the logged attempts with their stored advantages; vllm: the policy's samples from "
        "a vLLM server at vllm_base_url."))
    vllm_base_url: Optional[str] = Field(None, description="OpenAI-compatible vLLM server for rollout=vllm, e.g. http://host:8000.")
    num_generations: int = Field(4, description="Completions per prompt.")
    max_new_tokens: int = Field(16, description="Generated tokens per completion.")
    kl_beta: float = Field(0.0, description="k3 KL weight to the reference (adapter disabled).")


def _overrides(config: TrainingConfig, extra: dict) -> dict:
    fields = {k: getattr(config, k) for k in ("max_steps", "batch_size", "grad_accum", "lr", "warmup_steps",
                                              "max_seq_len", "precision", "save_steps", "seed", "kernel_backend", "torch_threads")}
    if config.lora_r > 0:
        fields["lora"] = {"r": config.lora_r, "alpha": config.lora_alpha}
    return {**fields, **extra}


def _train(context: dg.AssetExecutionContext, asset_key: str, config: TrainingConfig, extra: dict,
           data_root: DataRoot, mlflow: MlflowTracking) -> dg.MaterializeResult:
    root = data_root.root()
    uri = mlflow.uri(root)
    job = jobs.prepare_job(asset_key, root, _overrides(config, extra), tracking_uri=uri,
                           tags={"dagster_run_id": context.run_id, "asset": asset_key},
                           limit=config.limit_examples or None)
    cmd = launch.build_launch_command(job.job_path, num_processes=config.num_processes,
                                      cpu=not _has_cuda(), python=sys.executable)
    context.log.info(f"training {asset_key}: {launch.format_command(cmd)}")
    dg.PipesSubprocessClient().run(command=cmd, context=context, env=dict(os.environ))
    manifest = jobs.finish_job(job, root, dagster_run_id=context.run_id)
    return _result(manifest, uri)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _result(manifest: dict, uri: str | None) -> dg.MaterializeResult:
    train, plan = manifest["train"], manifest.get("plan") or {}
    metadata = {
        "kind": manifest["kind"],
        "checkpoint_uri": dg.MetadataValue.path(manifest["checkpoint_dir"]),
        "data_versions": dg.MetadataValue.json(manifest["data_versions"]),
    }
    if train.get("losses"):
        metadata.update({
            "plan": md_table([{k: v for k, v in plan.items() if k != "notes"}]),
            "steps": train["steps"], "final_loss": float(train["final_loss"]),
            "tokens_per_s": float(train["tokens_per_s"]), "peak_rss_mb": float(train["peak_rss_mb"]),
            "resumed_from": str(train.get("resumed_from")),
            "mlflow_run_id": str(manifest.get("mlflow_run_id")), "mlflow_tracking_uri": str(uri),
            "loss_curve": png_markdown(tracking.loss_curve_png(train["losses"], manifest["asset"]), "loss curve"),
        })
    if manifest.get("mean_rewards"):
        metadata["mean_reward_per_step"] = dg.MetadataValue.json(manifest["mean_rewards"])
    if train.get("merge"):
        metadata["merge"] = dg.MetadataValue.json(train["merge"])
    return dg.MaterializeResult(metadata=metadata, data_version=dg.DataVersion(manifest["data_version"]))


_COMMON = dict(group_name="training", code_version=TRAINING_CODE_VERSION, kinds={"pytorch"}, op_tags=ACCELERATOR_TAG)


@dg.asset(deps=["pretrain_windows", "tokenizer"], **_COMMON)
def base_checkpoint(context: dg.AssetExecutionContext, config: TrainingConfig, data_root: DataRoot,
                    mlflow: MlflowTracking) -> dg.MaterializeResult:
    """A tiny random-init decoder pretrained on the packed corpus windows."""
    return _train(context, "base_checkpoint", config, {}, data_root, mlflow)


class SftConfig(TrainingConfig):
    max_steps: int = Field(6, description="Optimizer steps (about one epoch of the sample data).")
    batch_size: int = Field(4, description="Packed rows of max_seq_len tokens per micro-batch.")


@dg.asset(deps=["sft_dataset", "base_checkpoint", "tokenizer"], **_COMMON)
def sft_checkpoint(context: dg.AssetExecutionContext, config: SftConfig, data_root: DataRoot,
                   mlflow: MlflowTracking) -> dg.MaterializeResult:
    """base_checkpoint fine-tuned on successful traces (assistant-only loss, packed)."""
    return _train(context, "sft_checkpoint", config, {"packing": True}, data_root, mlflow)


@dg.asset(deps=["sft_checkpoint", "preference_pairs", "sft_eval_report"], **_COMMON)
def dpo_checkpoint(context: dg.AssetExecutionContext, config: DpoConfig, data_root: DataRoot,
                   mlflow: MlflowTracking) -> dg.MaterializeResult:
    """A DPO LoRA adapter on sft_checkpoint (reference log-probs precomputed once)."""
    extra = {"beta": config.beta, "dpo_loss_type": config.dpo_loss_type}
    return _train(context, "dpo_checkpoint", config, extra, data_root, mlflow)


# own code version: the rollout sources (mixed by default) changed what this asset trains on
@dg.asset(deps=["sft_checkpoint", "grpo_groups", "sft_eval_report"], **{**_COMMON, "code_version": "trainers-1-grpo-2"})
def grpo_checkpoint(context: dg.AssetExecutionContext, config: GrpoConfig, data_root: DataRoot,
                    mlflow: MlflowTracking) -> dg.MaterializeResult:
    """A GRPO LoRA adapter on sft_checkpoint: rollouts, composite rewards, group advantages."""
    extra = {"rollout": config.rollout, "vllm_base_url": config.vllm_base_url, "num_generations": config.num_generations,
             "max_new_tokens": config.max_new_tokens, "kl_beta": config.kl_beta}
    return _train(context, "grpo_checkpoint", config, extra, data_root, mlflow)


class MergeConfig(dg.Config):
    density: float = Field(0.5, ge=0.0, le=1.0, description="TIES: share of each task vector kept (largest magnitudes).")
    dpo_weight: float = Field(1.0, description="Weight of the DPO adapter.")
    grpo_weight: float = Field(1.0, description="Weight of the GRPO adapter.")


@dg.asset(deps=["dpo_checkpoint", "grpo_checkpoint"], group_name="training", code_version=TRAINING_CODE_VERSION,
          kinds={"pytorch"})
def merged_adapter(context: dg.AssetExecutionContext, config: MergeConfig, data_root: DataRoot) -> dg.MaterializeResult:
    """TIES merge (trim, elect sign, disjoint mean) of the DPO and GRPO LoRA adapters."""
    manifest = jobs.merge_job(data_root.root(), weights=[config.dpo_weight, config.grpo_weight], density=config.density,
                              dagster_run_id=context.run_id)
    return _result(manifest, None)
