"""Training tools (the training engineer's): pretrain, SFT, DPO, GRPO and the TIES merge.

Each plans by default with the trainer's own plan (planned_steps, effective_batch, tokens per
step, estimated memory) and the upstream assets it reuses or would rebuild; executed, it launches
one Dagster run whose checkpoint step trains in a Pipes subprocess.
"""

from __future__ import annotations

from mcp.server.mcpserver import Context

from training_assets.agent.models import ActionResult
from training_assets.agent.runtime import Runtime
from training_assets.agent.tools.actions import run_action
from training_assets.agent.tools.base import ConfigArg, OptionsArg, tool


@tool("plan", "Pretrain a model from random init")
async def pretrain_model(ctx: Context, config: ConfigArg = None, options: OptionsArg = None) -> ActionResult:
    """Materialise base_checkpoint: a random-init decoder pretrained on the packed corpus windows.
    Config: TrainConfig fields (max_steps, batch_size, grad_accum, lr, warmup_steps, max_seq_len,
    precision, lora {r, alpha}, save_steps, seed, kernel_backend, torch_threads) plus num_processes
    and limit_examples. Plans by default."""
    return await run_action(ctx, "pretrain_model", config, options)


@tool("plan", "Supervised fine-tuning")
async def train_sft(ctx: Context, config: ConfigArg = None, options: OptionsArg = None) -> ActionResult:
    """Materialise sft_checkpoint: base_checkpoint fine-tuned on the successful traces (assistant-only
    loss, packed). Config: TrainConfig fields as for pretrain_model. Plans by default."""
    return await run_action(ctx, "train_sft", config, options)


@tool("plan", "DPO alignment")
async def train_dpo(ctx: Context, config: ConfigArg = None, options: OptionsArg = None) -> ActionResult:
    """Materialise dpo_checkpoint: a DPO LoRA adapter on sft_checkpoint from the preference pairs
    (beta, dpo_loss_type sigmoid|ipo|hinge, and the TrainConfig fields). Runs only after the SFT
    gate passed (its blocking check). Plans by default."""
    return await run_action(ctx, "train_dpo", config, options)


@tool("plan", "GRPO alignment")
async def train_grpo(ctx: Context, config: ConfigArg = None, options: OptionsArg = None) -> ActionResult:
    """Materialise grpo_checkpoint: a GRPO LoRA adapter on sft_checkpoint (rollout mixed|local|dataset|
    vllm, num_generations, max_new_tokens, kl_beta, and the TrainConfig fields). Runs only after the
    SFT gate passed. Plans by default."""
    return await run_action(ctx, "train_grpo", config, options)


def _adapters(rt: Runtime, result: ActionResult) -> dict:
    states = rt.backend.asset_states(["dpo_checkpoint", "grpo_checkpoint"])
    return {"adapters": {k: {"data_version": v["data_version"], "stale_status": v["stale_status"],
                             "checkpoint_uri": (v.get("metadata") or {}).get("checkpoint_uri")} for k, v in states.items()}}


@tool("plan", "TIES-merge the adapters")
async def merge_adapters_ties(ctx: Context, config: ConfigArg = None, options: OptionsArg = None) -> ActionResult:
    """Materialise merged_adapter: the TIES merge (trim, elect sign, disjoint mean) of the DPO and GRPO
    LoRA adapters as they are (density, dpo_weight, grpo_weight). Both adapters must have been
    materialised (train_dpo, train_grpo). Plans by default."""
    return await run_action(ctx, "merge_adapters_ties", config, options, scope="target", details=_adapters)
