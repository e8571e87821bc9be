"""FSDP2 checkpoint round trip on CPU processes (gloo), run by torchrun from test_distributed.py.

    torchrun --nproc_per_node 2 tests/trainers/_fsdp_worker.py OUT_DIR

Accelerate configures FSDP only on GPUs (on CPU it trains as DDP), so this shards the model with
torch's own ``fully_shard`` — what Accelerate's FSDP2 ``prepare`` calls — and drives the
project's checkpoint code on it: 4 steps uninterrupted; 2 steps, ``save_checkpoint``, a fresh
model sharded again, ``resolve_resume`` + ``load_checkpoint``, 2 more steps. Rank 0 writes the
losses of both runs to OUT_DIR/result.json.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import AutoConfig, AutoModelForCausalLM

from training_assets.peft_manager import LoraSpec, PeftManager
from training_assets.trainers import checkpoints

VOCAB, SEQ, BATCH = 64, 16, 2


def build(seed, lora):
    """The tiny model sharded; with ``lora`` the base is always seed 0's and ``seed`` draws the LoRA factors."""
    torch.manual_seed(0 if lora else seed)
    cfg = AutoConfig.for_model("qwen2", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                               num_key_value_heads=1, vocab_size=VOCAB, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(cfg)
    if lora:
        model = PeftManager(LoraSpec(r=4, alpha=8)).wrap(model, seed=seed)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in (model.get_base_model() if lora else model).model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    return model, optimizer, scheduler


def step(model, optimizer, scheduler, n):
    g = torch.Generator().manual_seed(1000 * n + dist.get_rank())  # each rank its own rows of step n
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    return float(mean) / dist.get_world_size()


def round_trip(out, lora):
    model, optimizer, scheduler = build(0, lora)
    uninterrupted = [step(model, optimizer, scheduler, n) for n in range(4)]
    checkpoints.save_model_dir(model, out / "final_uninterrupted")  # gathered from the shards, as trainer.train does

    model, optimizer, scheduler = build(0, lora)
    losses = [step(model, optimizer, scheduler, n) for n in range(2)]
    checkpoints.save_checkpoint(out, 2, model, optimizer, scheduler, None, 2, losses, {}, 0)
    model, optimizer, scheduler = build(7, lora)  # other initial trainable weights: only the restore continues the run
    resume = checkpoints.resolve_resume("auto", out)
    restored = checkpoints.load_checkpoint(resume, model, optimizer, scheduler, None)
    losses = restored["losses"] + [step(model, optimizer, scheduler, n) for n in range(2, 4)]
    checkpoints.save_model_dir(model, out / "final")
    return {"uninterrupted": uninterrupted, "resumed": losses, "resumed_from": str(resume)}


def main():
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    result = {kind: round_trip(out / kind, kind == "lora") for kind in ("full", "lora")}
    if dist.get_rank() == 0:
        (out / "result.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
