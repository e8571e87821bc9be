"""GPU smoke: bf16 full fine-tune and LoRA of a Qwen2.5-0.5B-sized random-init model; tokens/s and MFU.

    python benchmarks/gpu_smoke.py                  # ~2-3 min on one H100/H200
    python benchmarks/gpu_smoke.py --steps 5 --seq-len 1024 --batch 4

Needs only torch, transformers and peft (no project import, so it runs on a bare GPU host).
Uses FlashAttention-2 when ``flash_attn`` imports, else SDPA; Liger's fused kernels (RMSNorm,
SwiGLU, RoPE, fused linear cross-entropy: no full logits tensor) when ``liger_kernel`` imports.
MFU = achieved model FLOP/s ÷ the GPU's dense bf16 peak, with training FLOPs per token
``6·N + 12·L·h·T`` for full fine-tuning (PaLM appendix B) and
``4·N + 6·N_lora + 12·L·h·T`` for LoRA (no weight gradients for the frozen base). Exits 2 with a
clear message on a host without CUDA. Last line: ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time

# Dense bf16 peak (TFLOP/s, no sparsity) by device-name substring.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0, "L4": 121.0, "4090": 165.0}

QWEN25_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})


def peak_tflops(name: str, override: float | None) -> float | None:
    if override:
        return override
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def build_model(attn: str, liger: bool):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", **QWEN25_05B)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.bfloat16).cuda()
    model.config.use_cache = False
    if liger:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance

        _apply_liger_kernel_to_instance(model=model)
    return model


def run(mode: str, args: argparse.Namespace, attn: str, liger: bool) -> dict:
    import torch

    model = build_model(attn, liger)
    n_params = sum(p.numel() for p in model.parameters())
    if mode == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, task_type="CAUSAL_LM",
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                 "gate_proj", "up_proj", "down_proj"]))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if mode == "lora":
        model.enable_input_require_grads()
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, fused=True)
    vocab = QWEN25_05B["vocab_size"]
    ids = torch.randint(0, vocab, (args.batch, args.seq_len), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    losses = []
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss))
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    tokens = args.batch * args.seq_len * args.steps
    L, h, T = QWEN25_05B["num_hidden_layers"], QWEN25_05B["hidden_size"], args.seq_len
    attn_flops = 12 * L * h * T
    # gradient checkpointing recomputes the forward: +2N per token of hardware work, not counted (MFU convention)
    per_token = (6 * n_params if mode == "full" else 4 * n_params + 6 * n_trainable) + attn_flops
    tflops = per_token * tokens / wall / 1e12
    name = torch.cuda.get_device_name()
    peak = peak_tflops(name, args.peak_tflops)
    result = {"mode": mode, "tokens_per_s": round(tokens / wall, 1), "model_tflops": round(tflops, 1),
              "mfu": round(tflops / peak, 4) if peak else None, "peak_mem_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2),
              "params": n_params, "trainable": n_trainable, "loss_first": losses[0], "loss_last": losses[-1],
              "finite": all(map(lambda x: x == x and abs(x) != float("inf"), losses))}
    del model, optimizer
    torch.cuda.empty_cache()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per mode")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps (compilation, allocator)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--modes", default="full,lora")
    parser.add_argument("--peak-tflops", type=float, default=None, help="override the GPU's bf16 peak for MFU")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_smoke: no CUDA device (torch.cuda.is_available() is False); run this on a GPU host "
              "with a CUDA build of torch. The CPU path is covered by benchmarks/trainers.py.", file=sys.stderr)
        return 2
    if not torch.cuda.is_bf16_supported():
        print(f"gpu_smoke: {torch.cuda.get_device_name()} has no bf16 support; needs Ampere or newer", file=sys.stderr)
        return 2
    attn = "flash_attention_2" if importlib.util.find_spec("flash_attn") else "sdpa"
    liger = importlib.util.find_spec("liger_kernel") is not None
    t0 = time.perf_counter()
    results = {}
    for mode in args.modes.split(","):
        results[mode] = run(mode, args, attn, liger)
        r = results[mode]
        print(f"{mode}: {r['tokens_per_s']:.0f} tokens/s, {r['model_tflops']} TFLOP/s, MFU {r['mfu']}, "
              f"peak {r['peak_mem_gb']} GB, loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}", flush=True)
    summary = {"device": torch.cuda.get_device_name(), "attn": attn, "liger": liger, "batch": args.batch,
               "seq_len": args.seq_len, "steps": args.steps, "wall_s": round(time.perf_counter() - t0, 1), **results}
    print("RESULT " + json.dumps(summary, sort_keys=True))
    return 0 if all(r["finite"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
