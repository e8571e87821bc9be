"""Our trainers against TRL on one GPU: SFT, DPO and GRPO with LoRA, tokens/s, MFU and peak memory.

    python benchmarks/gpu_trainers.py                       # Qwen2.5-0.5B shape, seq 2048, batch 8, 2 rounds
    python benchmarks/gpu_trainers.py --kinds sft,dpo --trl-liger --rounds 3
    python benchmarks/gpu_trainers.py --dry-run             # CPU: a tiny shape, 3 steps, 1 round (the wiring)

Same model, data and hyper-parameters on every side: a random-init model of the real Qwen2.5-0.5B
shape (494M parameters with its 151,936-row vocabulary: the logits are what the memory is about),
LoRA r=16 / alpha 32 on every linear projection, bf16 weights and autocast, fp32 adapters, AdamW at
lr 1e-4, batch ``--batch``, rows of ``--seq-len`` tokens (DPO: a prompt and two completions of
half that each; GRPO: 64-token prompts, ``--generations`` completions of 64 new tokens each).
The token ids come from a small BPE trained here (the hub is unreachable) while the model keeps
the real vocabulary width: the cost of a step does not depend on which ids are fed.

Sides: ``ours`` (``get_trainer``; ``--ours-liger auto`` uses Liger's fused kernels when
liger-kernel is installed), ``trl`` (TRL's SFTTrainer / DPOTrainer / GRPOTrainer with the same
PEFT config) and, with ``--trl-liger``, ``trl_liger`` (``use_liger_kernel=True``: what TRL's GPU
users pick). Sides alternate within each round (the first side rotates round by round), in one
process; each run resets CUDA's peak-memory counter and empties the cache first. A run's
throughput is measured between the end of its ``--warmup``-th step and its last one (per-step
timestamps, after a device synchronise), so model loading, tokenising and DPO's reference pass
are outside it; its peak memory covers the whole run.

MFU: model FLOPs per trained token ``4·N + 6·N_lora + 12·L·h·T`` (LoRA: no weight gradients for
the frozen base; PaLM's appendix B attention term; gradient checkpointing's recompute not
counted), divided by the GPU's dense bf16 peak (``gpu_smoke.PEAK_BF16_TFLOPS``; ``--peak-tflops``
overrides). GRPO reports seconds per step and rollout tokens/s instead (generation dominates).

Targets (issue 26, one H200): ours >= 1.5x TRL's tokens/s at <= 0.5x its peak memory for SFT and
DPO, >= 30% MFU for LoRA SFT; GRPO >= 2x; against ``trl_liger`` >= 1.2x at no more memory. Only
torch, transformers, peft, TRL (and datasets) and the project are needed; no network. Last line:
``RESULT {json}``; exit 2 without CUDA unless ``--dry-run``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_smoke import LORA_TARGETS, QWEN25_05B, TINY, peak_tflops  # noqa: E402  (the smoke script's shapes and peaks)

KINDS = ("sft", "dpo", "grpo")
LR, SEED, PROMPT_TOKENS, NEW_TOKENS = 1e-4, 0, 64, 64


class Setup:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        import torch

        self.dry, self.workdir = args.dry_run, workdir
        self.device = "cpu" if self.dry else "cuda"
        self.shape = TINY if self.dry else QWEN25_05B
        self.batch, self.seq = (2, 64) if self.dry else (args.batch, args.seq_len)
        self.steps, self.warmup, self.rounds = (3, 1, 1) if self.dry else (args.steps, args.warmup, args.rounds)
        self.generations = 2 if self.dry else args.generations
        self.new_tokens = 8 if self.dry else NEW_TOKENS
        self.name = "cpu (dry run)" if self.dry else torch.cuda.get_device_name()
        self.peak = None if self.dry else peak_tflops(self.name, args.peak_tflops)
        liger = importlib.util.find_spec("liger_kernel") is not None and not self.dry
        self.ours_liger = {"auto": liger, "on": True, "off": False}[args.ours_liger]

    def sync(self) -> None:
        import torch

        if not self.dry:
            torch.cuda.synchronize()

    def reset_memory(self) -> None:
        import gc

        import torch

        gc.collect()
        if not self.dry:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def peak_gb(self) -> float | None:
        import torch

        return None if self.dry else round(torch.cuda.max_memory_allocated() / 2**30, 2)


def build_assets(setup: Setup) -> dict:
    """The tokenizer, the random-init model (saved once, bf16 on GPU) and each kind's rows."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from training_assets.tokenizer_trainer import train_tokenizer

    words = [f"item{i % 97} step{i % 13} value{i % 31}" for i in range(2000)]
    tok = train_tokenizer(words, vocab_size=512)
    tok.save_pretrained(str(setup.workdir / "model"))
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen2", **setup.shape),
                                             dtype=torch.float32 if setup.dry else torch.bfloat16)
    model.save_pretrained(str(setup.workdir / "model"))
    n_params = sum(p.numel() for p in model.parameters())
    del model

    def text(n_tokens: int, salt: int) -> str:  # about n_tokens tokens of the small BPE
        out, i = [], salt
        while len(tok(" ".join(out))["input_ids"]) < n_tokens:
            out.extend(words[(i + k) % len(words)] for k in range(16))
            i += 16
        ids = tok(" ".join(out))["input_ids"][:n_tokens]
        return tok.decode(ids)

    overhead = 16  # chat-template tokens around the turns
    n = setup.batch * (setup.steps + 1)
    half = (setup.seq - overhead) // 2
    sft = [{"messages": [{"role": "user", "content": text(half, i)},
                         {"role": "assistant", "content": text(half, i + 7)}]} for i in range(n)]
    dpo = [{"prompt": [{"role": "user", "content": text(half, i)}],
            "chosen": [{"role": "assistant", "content": text(half // 2, i + 3)}],
            "rejected": [{"role": "assistant", "content": text(half // 2, i + 5)}]} for i in range(n)]
    grpo = [{"prompt": [{"role": "user", "content": text(PROMPT_TOKENS, i)}], "expected_answer": "item1"}
            for i in range(n)]
    lengths = {"sft": [len(encode(tok, r["messages"])) for r in sft[: setup.batch]],
               "dpo": [len(encode(tok, r["prompt"] + r["chosen"])) + len(encode(tok, r["prompt"] + r["rejected"]))
                       for r in dpo[: setup.batch]]}
    return {"tokenizer": tok, "n_params": n_params, "rows": {"sft": sft, "dpo": dpo, "grpo": grpo},
            "tokens_per_step": {k: sum(v) for k, v in lengths.items()}}


def encode(tok, messages: list[dict]) -> list[int]:
    return tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]


def reward(completions, **_kwargs) -> list[float]:
    """The same reward on every side: varied within a group, so advantages are not all zero."""
    return [float(len(c if isinstance(c, str) else json.dumps(c)) % 5) / 4.0 for c in completions]


class StepClock:
    """Timestamps after each optimizer step (device synchronised), for the steady-state throughput."""

    def __init__(self, setup: Setup) -> None:
        self.setup, self.times = setup, []

    def tick(self) -> None:
        self.setup.sync()
        self.times.append(time.perf_counter())

    def steady(self, warmup: int) -> tuple[float, int]:
        """(seconds, steps) from the end of step ``warmup`` to the last step."""
        if len(self.times) <= warmup:
            raise RuntimeError(f"only {len(self.times)} steps were timed; raise --steps above --warmup")
        return self.times[-1] - self.times[warmup - 1] if warmup else self.times[-1] - self.times[0], \
            len(self.times) - max(warmup, 1)


def run_ours(setup: Setup, assets: dict, kind: str, out: str, clock: StepClock) -> list[float]:
    from training_assets.trainers import DpoSpec, GrpoSpec, LoraSpec, TrainConfig, get_trainer

    common = dict(base_model=str(setup.workdir / "model"), tokenizer=str(setup.workdir / "model"), output_dir=out,
                  max_steps=setup.steps, lr=LR, seed=SEED, max_seq_len=setup.seq, warmup_steps=0, log_steps=1,
                  lr_scheduler="constant", lora=LoraSpec(r=16, alpha=32, target_modules=list(LORA_TARGETS)),
                  precision="fp32" if setup.dry else "bf16", use_liger=setup.ours_liger)
    rows = assets["rows"][kind]
    if kind == "sft":
        config, data = TrainConfig(batch_size=setup.batch, **common), rows
    elif kind == "dpo":
        config = TrainConfig(batch_size=setup.batch, dpo=DpoSpec(beta=0.1), **common)
        data = [{"id": str(i), **r} for i, r in enumerate(rows)]
    else:
        grpo = GrpoSpec(num_generations=setup.generations, max_new_tokens=setup.new_tokens, kl_beta=0.0,
                        loss_type="dapo", temperature=1.0)
        config = TrainConfig(batch_size=max(1, setup.batch // setup.generations), grpo=grpo, **common)
        data = [{"group_id": str(i), **r} for i, r in enumerate(rows)]
    kwargs = {"reward_fn": reward} if kind == "grpo" else {}
    trainer = get_trainer(kind, config, callbacks=(lambda _step, _metrics: clock.tick(),), **kwargs)
    return list(trainer.train(data).loop.losses)


def run_trl(setup: Setup, assets: dict, kind: str, out: str, clock: StepClock, liger: bool) -> list[float]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, TrainerCallback

    class Tick(TrainerCallback):
        def on_step_end(self, *_args, **_kwargs):
            clock.tick()

    model = AutoModelForCausalLM.from_pretrained(str(setup.workdir / "model"),
                                                 dtype=torch.float32 if setup.dry else torch.bfloat16)
    peft = LoraConfig(r=16, lora_alpha=32, target_modules=list(LORA_TARGETS), task_type="CAUSAL_LM")
    common = dict(output_dir=out, max_steps=setup.steps, learning_rate=LR, seed=SEED, use_cpu=setup.dry,
                  bf16=not setup.dry, logging_steps=1, report_to=[], save_strategy="no", lr_scheduler_type="constant",
                  warmup_steps=0, disable_tqdm=True, dataloader_num_workers=0, use_liger_kernel=liger,
                  activation_checkpointing=False)
    rows, tok = assets["rows"][kind], assets["tokenizer"]
    if kind == "sft":
        from trl import SFTConfig, SFTTrainer

        args = SFTConfig(per_device_train_batch_size=setup.batch, max_length=setup.seq, assistant_only_loss=True,
                         **common)
        trainer = SFTTrainer(model=model, args=args, processing_class=tok, peft_config=peft,
                             train_dataset=Dataset.from_list(rows), callbacks=[Tick()])
    elif kind == "dpo":
        from trl import DPOConfig, DPOTrainer

        args = DPOConfig(per_device_train_batch_size=setup.batch, max_length=setup.seq, beta=0.1, loss_type=["sigmoid"],
                         precompute_ref_log_probs=True, **common)
        trainer = DPOTrainer(model=model, args=args, processing_class=tok, peft_config=peft,
                             train_dataset=Dataset.from_list(rows), callbacks=[Tick()])
    else:
        from trl import GRPOConfig, GRPOTrainer

        args = GRPOConfig(per_device_train_batch_size=setup.batch, num_generations=setup.generations,
                          max_completion_length=setup.new_tokens, beta=0.0, loss_type="dapo", temperature=1.0, **common)
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, processing_class=tok, peft_config=peft,
                              train_dataset=Dataset.from_list([{"prompt": r["prompt"]} for r in rows]),
                              callbacks=[Tick()])
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # its per-step dicts on stdout; the losses are read below
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def lora_params(shape: dict, r: int = 16) -> int:
    """Trainable parameters of LoRA r on every projection of a Qwen2-shaped model."""
    h, i, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
    per_layer = sum(r * (a + b) for a, b in [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)])
    return per_layer * layers


def one_run(setup: Setup, assets: dict, kind: str, side: str) -> dict:
    import torch

    torch.manual_seed(SEED)
    setup.reset_memory()
    clock = StepClock(setup)
    out = tempfile.mkdtemp(prefix=f"{side}-{kind}-", dir=setup.workdir)
    t0 = time.perf_counter()
    if side == "ours":
        losses = run_ours(setup, assets, kind, out, clock)
    else:
        losses = run_trl(setup, assets, kind, out, clock, liger=side == "trl_liger")
    wall = time.perf_counter() - t0
    seconds, steps = clock.steady(setup.warmup)
    result = {"run_s": round(wall, 2), "step_s": round(seconds / steps, 4), "peak_mem_gb": setup.peak_gb(),
              "losses": [round(float(x), 4) for x in losses[:3]],
              "ok": bool(losses) and all(x == x and abs(x) != float("inf") for x in losses)}
    if kind == "grpo":
        rollout_tokens = setup.batch * setup.new_tokens  # per step: prompts x generations x new tokens (at most)
        result["rollout_tokens_per_s"] = round(rollout_tokens * steps / seconds, 1)
    else:
        tokens = assets["tokens_per_step"][kind] * steps
        result["tokens_per_s"] = round(tokens / seconds, 1)
        shape = setup.shape
        per_token = 4 * assets["n_params"] + 6 * lora_params(shape) + 12 * shape["num_hidden_layers"] * \
            shape["hidden_size"] * setup.seq
        result["mfu"] = round(per_token * tokens / seconds / 1e12 / setup.peak, 4) if setup.peak else None
    return result


def summarise(kind: str, sides: list[str], runs: dict[str, list[dict]]) -> dict:
    metric = "rollout_tokens_per_s" if kind == "grpo" else "tokens_per_s"
    out = {side: {metric: statistics.median(r[metric] for r in runs[side]),
                  "step_s": statistics.median(r["step_s"] for r in runs[side]),
                  "peak_mem_gb": max((r["peak_mem_gb"] or 0) for r in runs[side]) or None,
                  "mfu": statistics.median(r["mfu"] for r in runs[side]) if runs[side][0].get("mfu") is not None else None,
                  "first_losses": runs[side][0]["losses"], "ok": all(r["ok"] for r in runs[side])} for side in sides}
    for other in sides[1:]:
        ratios = [a[metric] / b[metric] for a, b in zip(runs["ours"], runs[other])]
        out[f"ours_vs_{other}"] = {"speed_median": round(statistics.median(ratios), 3),
                                   "speed_range": [round(min(ratios), 3), round(max(ratios), 3)],
                                   "memory": round(out["ours"]["peak_mem_gb"] / out[other]["peak_mem_gb"], 3)
                                   if out["ours"]["peak_mem_gb"] and out[other]["peak_mem_gb"] else None}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated subset of sft,dpo,grpo")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per run (the first --warmup untimed)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--generations", type=int, default=8, help="GRPO completions per prompt")
    parser.add_argument("--trl-liger", action="store_true", help="add TRL with use_liger_kernel=True as a side")
    parser.add_argument("--ours-liger", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak, when not listed")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shape: checks the wiring, no figures")
    args = parser.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"--kinds: unknown {sorted(unknown)}; choose from {','.join(KINDS)}")

    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_trainers: no CUDA device here; run it on a GPU host, or --dry-run for the CPU wiring check",
              file=sys.stderr)
        return 2
    sides = ["ours", "trl"] + (["trl_liger"] if args.trl_liger else [])
    with tempfile.TemporaryDirectory(prefix="gpu-trainers-") as tmp:
        setup = Setup(args, Path(tmp))
        assets = build_assets(setup)
        results, load = {}, [round(os.getloadavg()[0], 2)]
        for kind in kinds:
            runs: dict[str, list[dict]] = {s: [] for s in sides}
            for r in range(setup.rounds):
                for side in sides[r % len(sides):] + sides[:r % len(sides)]:
                    runs[side].append(one_run(setup, assets, kind, side))
                    print(f"{kind} round {r + 1} {side}: {json.dumps(runs[side][-1])}", flush=True)
            results[kind] = summarise(kind, sides, runs)
        load.append(round(os.getloadavg()[0], 2))
        ok = all(v["ok"] for res in results.values() for k, v in res.items() if k in sides)
        summary = {"benchmark": "gpu_trainers", "device": setup.name, "dry_run": setup.dry, "shape": setup.shape,
                   "batch": setup.batch, "seq_len": setup.seq, "steps": setup.steps, "warmup": setup.warmup,
                   "rounds": setup.rounds, "ours_liger": setup.ours_liger, "results": results, "ok": ok,
                   "load_avg": load}
    print("RESULT " + json.dumps(summary, sort_keys=True))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
