"""Training tools (the training engineer's): one per training kind (``training_assets.kinds``) and the TIES merge.

Each plans by default with the trainer's own plan (planned_steps, effective_batch, tokens per
step, estimated memory) and the upstream assets it reuses or would rebuild; executed, it launches
one Dagster run whose checkpoint step trains in a Pipes subprocess.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context

from training_assets import kinds
from training_assets.agent.models import ActionResult
from training_assets.agent.runtime import Runtime
from training_assets.agent.tools.actions import run_action
from training_assets.agent.tools.base import OptionsArg, config_arg, tool

MergeConfig = config_arg("merge_adapters_ties")


def _training_tool(kind: kinds.TrainingKind) -> None:
    """Declare ``kind.tool``: a plan-by-default tool that materialises the kind's checkpoint asset."""

    async def train(ctx: Context, config: Any = None, options: OptionsArg = None) -> ActionResult:
        return await run_action(ctx, kind.tool, config, options)

    train.__annotations__["config"] = config_arg(kind.tool)  # the kind's typed config (TrainConfig and its spec)

    start = f"starting from {kind.upstream}" if kind.upstream else "from random init"
    upstream_gate = kinds.kind_of_checkpoint(kind.upstream).gate if kind.upstream else None
    gates = (f" Runs only after {upstream_gate}'s gate passed." if upstream_gate else "") + (
        f" {kind.gate}'s blocking check gates what follows it." if kind.gate else "")
    train.__name__ = train.__qualname__ = kind.tool
    train.__doc__ = (f"Materialise {kind.checkpoint}: {kind.summary}, {start}, trained on {kind.dataset}.{gates} "
                     "Config: TrainConfig fields (max_steps, batch_size, grad_accum, lr, warmup_steps, max_seq_len, "
                     "precision, lora {r, alpha}, save_steps, seed, kernel_backend, torch_threads"
                     + (f"; {kind.spec} {{...}}: this kind's own options" if kind.spec else "") + ") plus num_processes, "
                     "launcher and limit_examples; a plan lists every field with its default. Plans by default.")
    tool("plan", f"Train {kind.checkpoint} ({kind.name})")(train)


for _kind in kinds.KINDS.values():  # one tool per row of the kinds table
    _training_tool(_kind)


def _adapters(rt: Runtime, result: ActionResult) -> dict:
    states = rt.backend.asset_states(["dpo_checkpoint", "grpo_checkpoint"])
    return {"adapters": {k: {"data_version": v["data_version"], "stale_status": v["stale_status"],
                             "checkpoint_uri": (v.get("metadata") or {}).get("checkpoint_uri")} for k, v in states.items()}}


@tool("plan", "TIES-merge the adapters")
async def merge_adapters_ties(ctx: Context, config: MergeConfig = None, options: OptionsArg = None) -> ActionResult:
    """Materialise merged_adapter: the TIES merge (trim, elect sign, disjoint mean) of the DPO and GRPO
    LoRA adapters as they are (density, dpo_weight, grpo_weight). Both adapters must have been
    materialised (train_dpo, train_grpo). Plans by default."""
    return await run_action(ctx, "merge_adapters_ties", config, options, scope="target", details=_adapters)
