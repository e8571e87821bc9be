"""GPU smoke: what one GPU host can do for this project, one figure per check, a reason for each skip.

    python benchmarks/gpu_smoke.py                  # all checks, ~5 min on one H100/H200
    python benchmarks/gpu_smoke.py --checks lora,qlora,fsdp --steps 5 --seq-len 1024
    python benchmarks/gpu_smoke.py --dry-run        # CPU: the CPU-able checks on a tiny model (wiring test)

Checks (each prints one line; a missing library or device is a skip with its reason):

* ``full`` / ``lora`` — bf16 full fine-tune and LoRA (r=16, all linear layers) of a
  Qwen2.5-0.5B-shaped random-init model: tokens/s and MFU. Training FLOPs per token ``6·N +
  12·L·h·T`` for full fine-tuning (PaLM appendix B) and ``4·N + 6·N_lora + 12·L·h·T`` for LoRA (no
  weight gradients for the frozen base); MFU = achieved ÷ the GPU's dense bf16 peak.
* ``qlora`` — the same LoRA on an NF4 base (bitsandbytes): tokens/s, MFU (same formula; the
  dequantisation is overhead) and peak memory against the bf16 LoRA's.
* ``flash_attention_2`` / ``liger`` — two sides in one run, alternating rounds (``--rounds``):
  LoRA with SDPA vs FlashAttention-2, and without vs with Liger's fused kernels (fused linear
  cross-entropy: no full logits tensor); median tokens/s ratio, spread, peak memory, first-loss gap.
* ``fsdp`` — a one-process FSDP2 (``fully_shard``) save/load round trip over NCCL (gloo on
  ``--dry-run``): train a step, gather the full state dict, save safetensors, load into a fresh
  sharded model; every tensor and the loss must come back equal.
* ``vllm_grpo`` — when ``vllm`` and the project import: ``vllm serve`` on 127.0.0.1 (runtime LoRA,
  an API key) and the project's GRPO trainer with ``rollout="vllm"`` for a few steps: s/step and the
  adapter versions the server loaded.

Import-light: ``--help`` needs no torch; only torch, transformers, peft and safetensors are needed
(the project only for ``vllm_grpo``). Exits 2 with a clear message on a host without CUDA (unless
``--dry-run``). Last line: ``RESULT {json}``; exit 1 when a check that ran failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Dense bf16 peak (TFLOP/s, no sparsity) by device-name substring.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0, "L4": 121.0, "4090": 165.0}

QWEN25_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
TINY = dict(QWEN25_05B, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=512, max_position_embeddings=512)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ALL_CHECKS = ("full", "lora", "qlora", "flash_attention_2", "liger", "fsdp", "vllm_grpo")


class Skip(Exception):
    """A check the host cannot run; the message is the reason."""


def peak_tflops(name: str, override: float | None) -> float | None:
    if override:
        return override
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


class Host:
    """Device, dtype and shapes of this run (the real GPU sizes, or tiny CPU ones for ``--dry-run``)."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.args, self.dry = args, args.dry_run
        self.device = "cpu" if self.dry else "cuda"
        self.dtype = torch.float32 if self.dry else torch.bfloat16
        self.shape = TINY if self.dry else QWEN25_05B
        self.batch, self.seq_len = (2, 32) if self.dry else (args.batch, args.seq_len)
        self.steps, self.warmup, self.rounds = (2, 1, 2) if self.dry else (args.steps, args.warmup, args.rounds)
        self.name = "cpu (dry run)" if self.dry else torch.cuda.get_device_name()
        self.peak = None if self.dry else peak_tflops(self.name, args.peak_tflops)

    def need_cuda(self, what: str) -> None:
        if self.dry:
            raise Skip(f"{what} needs CUDA (dry run on CPU)")

    def sync(self) -> None:
        import torch

        if not self.dry:
            torch.cuda.synchronize()

    def reset_peak(self) -> None:
        import torch

        if not self.dry:
            torch.cuda.reset_peak_memory_stats()

    def peak_gb(self) -> float | None:
        import torch

        return None if self.dry else round(torch.cuda.max_memory_allocated() / 2**30, 2)


def need_module(name: str, why: str) -> None:
    if importlib.util.find_spec(name) is None:
        raise Skip(f"{name} does not import here ({why}); pip install {name.replace('_', '-')}")


def build_model(host: Host, attn: str = "sdpa", liger: bool = False, seed: int = 0):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model("qwen2", **host.shape)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=host.dtype).to(host.device)
    model.config.use_cache = False
    if liger:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance

        _apply_liger_kernel_to_instance(model=model)
    return model


def with_lora(model):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, task_type="CAUSAL_LM", target_modules=LORA_TARGETS))
    model.enable_input_require_grads()
    return model


class Trainee:
    """A model, its optimizer and a fixed batch: ``steps(n)`` trains n steps and returns (wall s, losses)."""

    def __init__(self, host: Host, model, lora: bool, fused: bool = True) -> None:
        import torch

        self.host, self.model, self.lora = host, model, lora
        self.n_params = sum(p.numel() for p in model.parameters())
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.n_trainable = sum(p.numel() for p in self.trainable)
        self.optimizer = torch.optim.AdamW(self.trainable, lr=1e-4, fused=fused and not host.dry)
        generator = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, host.shape["vocab_size"], (host.batch, host.seq_len), generator=generator).to(host.device)

    def steps(self, n: int) -> tuple[float, list[float]]:
        import torch

        self.host.sync()
        t0 = time.perf_counter()
        losses = []
        for _ in range(n):
            loss = self.model(input_ids=self.ids, labels=self.ids).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.trainable, 1.0)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        self.host.sync()
        return time.perf_counter() - t0, [float(x) for x in losses]

    def figures(self, wall: float, steps: int, losses: list[float]) -> dict:
        shape, T = self.host.shape, self.host.seq_len
        tokens = self.host.batch * T * steps
        attn_flops = 12 * shape["num_hidden_layers"] * shape["hidden_size"] * T
        # gradient checkpointing recomputes the forward: +2N per token of hardware work, not counted (MFU convention)
        per_token = (4 * self.n_params + 6 * self.n_trainable if self.lora else 6 * self.n_params) + attn_flops
        tflops = per_token * tokens / wall / 1e12
        return {"tokens_per_s": round(tokens / wall, 1), "model_tflops": round(tflops, 3),
                "mfu": round(tflops / self.host.peak, 4) if self.host.peak else None, "peak_mem_gb": self.host.peak_gb(),
                "params": self.n_params, "trainable": self.n_trainable, "loss_first": losses[0], "loss_last": losses[-1],
                "ok": all(x == x and abs(x) != float("inf") for x in losses)}


def timed_run(host: Host, model, lora: bool, n_params: int | None = None) -> dict:
    trainee = Trainee(host, model, lora)
    trainee.n_params = n_params or trainee.n_params  # a 4-bit base counts packed bytes: pass the real N
    trainee.steps(host.warmup)  # compilation, allocator, autotuning
    host.reset_peak()
    wall, losses = trainee.steps(host.steps)
    return trainee.figures(wall, host.steps, losses)


def check_full(host: Host) -> dict:
    return timed_run(host, build_model(host), lora=False)


def check_lora(host: Host) -> dict:
    return timed_run(host, with_lora(build_model(host)), lora=True)


def check_qlora(host: Host) -> dict:
    host.need_cuda("QLoRA (bitsandbytes NF4)")
    need_module("bitsandbytes", "QLoRA's 4-bit base")
    import torch
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    with tempfile.TemporaryDirectory() as tmp:  # bitsandbytes quantises at load: save the random init first
        base = build_model(host)
        n_params = sum(p.numel() for p in base.parameters())
        base.save_pretrained(tmp)
        del base
        torch.cuda.empty_cache()
        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
                                   bnb_4bit_use_double_quant=True)
        model = AutoModelForCausalLM.from_pretrained(tmp, quantization_config=quant, dtype=torch.bfloat16,
                                                     attn_implementation="sdpa", device_map={"": 0})
    model.config.use_cache = False
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    return timed_run(host, with_lora(model), lora=True, n_params=n_params)


def compare_sides(host: Host, make_a, make_b, names: tuple[str, str]) -> dict:
    """Two trainees, alternating timed rounds of ``steps``; median tokens/s ratio b/a and its spread."""
    sides = {names[0]: Trainee(host, make_a(), lora=True), names[1]: Trainee(host, make_b(), lora=True)}
    first = {n: t.steps(max(host.warmup, 1))[1][0] for n, t in sides.items()}  # same weights, same batch: same first loss
    walls: dict[str, list[float]] = {n: [] for n in names}
    peaks: dict[str, float | None] = {}
    for _ in range(host.rounds):
        for n, t in sides.items():
            host.reset_peak()
            walls[n].append(t.steps(host.steps)[0])
            peaks[n] = max(peaks.get(n) or 0.0, host.peak_gb() or 0.0) or None
    tokens = host.batch * host.seq_len * host.steps
    ratios = [a / b for a, b in zip(walls[names[0]], walls[names[1]], strict=True)]  # time a / time b = speed b / a
    return {f"{n}_tokens_per_s": round(tokens / statistics.median(walls[n]), 1) for n in names} | {
        "speedup": round(statistics.median(ratios), 3), "spread": [round(min(ratios), 3), round(max(ratios), 3)],
        "rounds": host.rounds, **{f"{n}_peak_mem_gb": peaks[n] for n in names},
        "first_loss_gap": round(abs(first[names[0]] - first[names[1]]), 4),
        "ok": abs(first[names[0]] - first[names[1]]) < 0.05}


def check_flash_attention_2(host: Host) -> dict:
    host.need_cuda("FlashAttention-2")
    need_module("flash_attn", "FlashAttention-2 kernels")
    return compare_sides(host, lambda: with_lora(build_model(host, "sdpa")),
                         lambda: with_lora(build_model(host, "flash_attention_2")), ("sdpa", "fa2"))


def check_liger(host: Host) -> dict:
    host.need_cuda("Liger's Triton kernels")
    need_module("liger_kernel", "Liger's fused kernels")
    return compare_sides(host, lambda: with_lora(build_model(host)), lambda: with_lora(build_model(host, liger=True)),
                         ("plain", "liger"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_fsdp(host: Host) -> dict:
    """One-process FSDP2 round trip: full state dict out (safetensors), into a fresh sharded model, equal."""
    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file, save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
    from torch.distributed.fsdp import fully_shard

    backend = "gloo" if host.dry else "nccl"
    if not dist.is_available() or (backend == "nccl" and not dist.is_nccl_available()):
        raise Skip(f"torch.distributed with {backend} is not available in this torch build")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        def sharded(seed: int):
            model = build_model(host, seed=seed)
            for layer in model.model.layers:
                fully_shard(layer)
            return fully_shard(model)

        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        trainee = Trainee(host, sharded(0), lora=False, fused=False)  # foreach AdamW: the usual FSDP2 pairing
        trainee.steps(1)
        t0 = time.perf_counter()
        state = {k: v.clone().contiguous() for k, v in get_model_state_dict(trainee.model, options=full).items()}
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.safetensors"
            save_file(state, str(path))  # tied weights cloned apart: safetensors refuses shared storage
            save_s, size = time.perf_counter() - t0, path.stat().st_size
            fresh = sharded(1)
            t0 = time.perf_counter()
            set_model_state_dict(fresh, load_file(str(path)), options=StateDictOptions(full_state_dict=True))
            host.sync()
            load_s = time.perf_counter() - t0
        back = get_model_state_dict(fresh, options=full)
        equal = back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)
        with torch.no_grad():
            gap = abs(float(trainee.model(input_ids=trainee.ids, labels=trainee.ids).loss)
                      - float(fresh(input_ids=trainee.ids, labels=trainee.ids).loss))
        return {"backend": backend, "tensors": len(state), "size_mb": round(size / 2**20, 1), "save_s": round(save_s, 2),
                "load_s": round(load_s, 2), "tensors_equal": equal, "loss_gap": gap, "ok": equal and gap == 0.0}
    finally:
        dist.destroy_process_group()


def check_vllm_grpo(host: Host) -> dict:
    host.need_cuda("vLLM")
    need_module("vllm", "the rollout server")
    need_module("training_assets", "the project's GRPO trainer; run from the repository with it installed")
    from gpu_smoke_vllm import run_vllm_grpo  # a sibling module, imported only here

    return run_vllm_grpo(host.args.vllm_steps)


CHECKS = {"full": check_full, "lora": check_lora, "qlora": check_qlora, "flash_attention_2": check_flash_attention_2,
          "liger": check_liger, "fsdp": check_fsdp, "vllm_grpo": check_vllm_grpo}


def line(name: str, r: dict) -> str:
    if "skipped" in r:
        return f"{name}: skipped: {r['skipped']}"
    if "error" in r:
        return f"{name}: FAILED: {r['error']}"
    return f"{name}: " + ", ".join(f"{k} {v}" for k, v in r.items() if k not in ("params", "trainable"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checks", default=",".join(ALL_CHECKS), help=f"comma-separated subset of {','.join(ALL_CHECKS)}")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run (per round in comparisons)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps (compilation, allocator)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of the two-sided checks")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--vllm-steps", type=int, default=3, help="GRPO optimizer steps in the vllm_grpo check")
    parser.add_argument("--peak-tflops", type=float, default=None, help="override the GPU's bf16 peak for MFU")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny model: the CPU-able checks only (wiring)")
    args = parser.parse_args()
    names = [c for c in args.checks.split(",") if c]
    unknown = sorted(set(names) - set(CHECKS))
    if unknown:
        parser.error(f"unknown checks {unknown}; choose from {','.join(ALL_CHECKS)}")
    import torch

    if not args.dry_run:
        if not torch.cuda.is_available():
            print("gpu_smoke: no CUDA device (torch.cuda.is_available() is False); run this on a GPU host with a "
                  "CUDA build of torch, or pass --dry-run to check the script on CPU.", file=sys.stderr)
            return 2
        if not torch.cuda.is_bf16_supported():
            print(f"gpu_smoke: {torch.cuda.get_device_name()} has no bf16 support; needs Ampere or newer", file=sys.stderr)
            return 2
    host = Host(args)
    t0 = time.perf_counter()
    results: dict[str, dict] = {}
    for name in names:
        try:
            results[name] = CHECKS[name](host)
        except Skip as why:
            results[name] = {"skipped": str(why)}
        except Exception as exc:  # one failed check must not hide the others' figures; it fails the run below
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:500], "ok": False}
        print(line(name, results[name]), flush=True)
        if not host.dry:
            torch.cuda.empty_cache()
    summary = {"device": host.name, "dry_run": host.dry, "batch": host.batch, "seq_len": host.seq_len,
               "steps": host.steps, "load_avg": list(os.getloadavg()), "wall_s": round(time.perf_counter() - t0, 1),
               **results}
    print("RESULT " + json.dumps(summary, sort_keys=True))
    return 0 if all(r.get("ok", True) for r in results.values()) else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the vllm_grpo check's sibling module
    sys.exit(main())
