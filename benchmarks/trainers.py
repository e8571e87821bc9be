"""Our trainers against TRL 1.16 on the same tiny random-init model, data and hyper-parameters (CPU).

    .venv/bin/python benchmarks/trainers.py            # 16 steps per trainer (~3-5 min on 2 cores)
    .venv/bin/python benchmarks/trainers.py --quick    # 4 steps (smoke)
    .venv/bin/python benchmarks/trainers.py --threads 1   # one torch thread per run (a busy shared machine)

Each (framework, trainer) pair runs in its own subprocess so peak RSS is measured per run and
imports do not overlap. Same model (Qwen2, hidden 128, 4 layers, a 1k-token BPE with the
project chat template), same examples, batch, steps, lr, fp32, assistant-only loss, no packing
(TRL's default). DPO: sigmoid loss, beta 0.1, reference log-probs precomputed on both sides.
GRPO: 2 prompts × 4 generations per step, 16 new tokens, beta 0, DAPO aggregation, one reward
function. Throughput is the examples' tokens over the wall time of a whole run — model load,
data preparation and training (TRL tokenises in its constructor, we in ``train()``) — the same
token count on both sides, so the ratio is a time ratio. Targets (issue 6): SFT ≥ 1.3× TRL, DPO ≥
1.3× with the same step-0 loss (1e-4), GRPO ≥ 1.2×, peak RSS no higher than TRL's.

The last line is ``RESULT {json}``. The 1-minute load average is printed: a shared machine
makes absolute numbers noisy; ratios of back-to-back runs are what to read.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

HIDDEN, LAYERS, INTERMEDIATE = 128, 4, 256
BATCH, LR, SEED = 8, 1e-4, 0


def _texts(n: int = 400) -> list[str]:
    return [f"Task {i}: look up item {i * 7 % 113} with the search tool, then answer. The answer is {i * 3 % 97}." for i in range(n)]


def build_assets(workdir: Path) -> None:
    """Tokenizer + random-init model saved once; every worker loads the same files."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from training_assets.tokenizer_trainer import train_tokenizer
    from training_assets.trainers import PretrainSpec

    tok = train_tokenizer(_texts(), vocab_size=1024)
    tok.save_pretrained(str(workdir / "tokenizer"))
    spec = PretrainSpec(hidden_size=HIDDEN, num_hidden_layers=LAYERS, intermediate_size=INTERMEDIATE)
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen2", **spec.config_kwargs(len(tok))))
    model.save_pretrained(str(workdir / "model"))
    tok.save_pretrained(str(workdir / "model"))  # TRL loads the tokenizer with the model
    user = lambda i: [{"role": "user", "content": f"Task {i}: look up item {i * 7 % 113} and answer with the number."}]
    answer = lambda i: [{"role": "assistant", "content": f"I searched item {i * 7 % 113}. The answer is {i * 3 % 97}."}]
    wrong = lambda i: [{"role": "assistant", "content": "I do not know."}]
    rows = [{"messages": user(i) + answer(i), "prompt": user(i), "chosen": answer(i), "rejected": wrong(i),
             "expected_answer": str(i * 3 % 97)} for i in range(256)]
    (workdir / "data.json").write_text(json.dumps(rows))


def _tokenizer(workdir: Path):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(workdir / "tokenizer"))


def _reward(completions, **kwargs):
    """Same reward on both sides: length-based, so groups have varied advantages."""
    out = []
    for c in completions:
        text = c if isinstance(c, str) else json.dumps(c)
        out.append(float(len(text) % 5) / 4.0)
    return out


def worker(framework: str, kind: str, workdir: Path, steps: int, threads: int) -> dict:
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    torch.manual_seed(SEED)
    t0 = time.perf_counter()  # both sides: model load + data preparation + training
    rows = json.loads((workdir / "data.json").read_text())
    tok = _tokenizer(workdir)
    n_examples = steps * BATCH
    model_dir = str(workdir / "model")
    out = tempfile.mkdtemp(prefix=f"bench-{framework}-{kind}-")
    losses: list[float] = []
    if framework == "ours":
        from training_assets.trainers import DpoSpec, GrpoSpec, TrainConfig, get_trainer

        common = dict(base_model=model_dir, tokenizer=str(workdir / "tokenizer"), output_dir=out, max_steps=steps,
                      lr=LR, seed=SEED, max_seq_len=256, warmup_steps=0, lr_scheduler="linear")
        if kind == "sft":
            trainer = get_trainer("sft", TrainConfig(batch_size=BATCH, **common))
            data = [{"messages": r["messages"]} for r in rows[:n_examples]]
        elif kind == "dpo":
            trainer = get_trainer("dpo", TrainConfig(batch_size=BATCH, dpo=DpoSpec(beta=0.1), **common))
            data = [{"id": str(i), "prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]}
                    for i, r in enumerate(rows[:n_examples])]
        else:
            grpo = GrpoSpec(num_generations=4, max_new_tokens=16, kl_beta=0.0, loss_type="dapo", temperature=1.0)
            trainer = get_trainer("grpo", TrainConfig(batch_size=2, grpo=grpo, **common), reward_fn=_reward)
            data = [{"group_id": str(i), "prompt": r["prompt"], "expected_answer": r["expected_answer"]}
                    for i, r in enumerate(rows[: steps * 2])]
        result = trainer.train(data)
        wall = time.perf_counter() - t0
        losses = result.loop.losses
    else:
        from datasets import Dataset
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir)
        common = dict(output_dir=out, max_steps=steps, learning_rate=LR, seed=SEED, use_cpu=True, bf16=False,
                      logging_steps=1, report_to=[], save_strategy="no", lr_scheduler_type="linear", warmup_steps=0,
                      disable_tqdm=True, dataloader_num_workers=0)
        if kind == "sft":
            from trl import SFTConfig, SFTTrainer

            args = SFTConfig(per_device_train_batch_size=BATCH, max_length=256, assistant_only_loss=True,
                             activation_checkpointing=False, **common)
            trainer = SFTTrainer(model=model, args=args, processing_class=tok,
                                 train_dataset=Dataset.from_list([{"messages": r["messages"]} for r in rows[:n_examples]]))
        elif kind == "dpo":
            from trl import DPOConfig, DPOTrainer

            args = DPOConfig(per_device_train_batch_size=BATCH, max_length=256, beta=0.1, loss_type=["sigmoid"],
                             precompute_ref_log_probs=True, activation_checkpointing=False, **common)
            data = Dataset.from_list([{"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]}
                                      for r in rows[:n_examples]])
            trainer = DPOTrainer(model=model, ref_model=None, args=args, processing_class=tok, train_dataset=data)
        else:
            from trl import GRPOConfig, GRPOTrainer

            args = GRPOConfig(per_device_train_batch_size=8, num_generations=4, max_completion_length=16, beta=0.0,
                              loss_type="dapo", temperature=1.0, activation_checkpointing=False, **common)
            data = Dataset.from_list([{"prompt": r["prompt"]} for r in rows[: steps * 2]])
            trainer = GRPOTrainer(model=model, reward_funcs=[_reward], args=args, processing_class=tok, train_dataset=data)
        trainer.train()
        wall = time.perf_counter() - t0
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"framework": framework, "kind": kind, "wall_s": wall, "steps": steps, "losses": losses[:3],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _tokens(workdir: Path, kind: str, steps: int) -> int:
    """Tokens a run processes (same on both sides): SFT/DPO from the examples, GRPO prompt + max completion."""
    tok = _tokenizer(workdir)
    rows = json.loads((workdir / "data.json").read_text())
    def n(messages, **kw):
        return len(tok.apply_chat_template(messages, tokenize=True, return_dict=True, **kw)["input_ids"])

    if kind == "sft":
        return sum(n(r["messages"]) for r in rows[: steps * BATCH])
    if kind == "dpo":
        return sum(n(r["prompt"] + r[side]) for r in rows[: steps * BATCH] for side in ("chosen", "rejected"))
    return sum(4 * (n(r["prompt"], add_generation_prompt=True) + 16) for r in rows[: steps * 2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 steps per trainer")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--kinds", default="sft,dpo,grpo")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per run (0 = torch default)")
    parser.add_argument("--worker", nargs=3, metavar=("FRAMEWORK", "KIND", "WORKDIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    steps = 4 if args.quick else args.steps
    if args.worker:
        print("WORKER " + json.dumps(worker(args.worker[0], args.worker[1], Path(args.worker[2]), steps, args.threads)))
        return
    workdir = Path(tempfile.mkdtemp(prefix="bench-trainers-"))
    build_assets(workdir)
    results: dict[str, dict] = {}
    for kind in args.kinds.split(","):
        runs = {}
        for framework in ("trl", "ours"):
            cmd = [sys.executable, __file__, "--worker", framework, kind, str(workdir), "--steps", str(steps),
                   "--threads", str(args.threads)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
            line = [x for x in done.stdout.splitlines() if x.startswith("WORKER ")]
            if done.returncode != 0 or not line:
                raise SystemExit(f"{framework} {kind} failed:\n{done.stderr[-3000:]}")
            runs[framework] = json.loads(line[0][7:])
        tokens = _tokens(workdir, kind, steps)
        ours, trl = runs["ours"], runs["trl"]
        results[kind] = {
            "tokens": tokens, "ours_tokens_per_s": round(tokens / ours["wall_s"], 1),
            "trl_tokens_per_s": round(tokens / trl["wall_s"], 1), "speedup": round(trl["wall_s"] / ours["wall_s"], 2),
            "ours_peak_rss_mb": round(ours["peak_rss_mb"], 1), "trl_peak_rss_mb": round(trl["peak_rss_mb"], 1),
            "ours_first_losses": ours["losses"], "trl_first_losses": trl["losses"],
        }
        if kind == "dpo" and ours["losses"] and trl["losses"]:
            results[kind]["step0_loss_diff"] = abs(ours["losses"][0] - trl["losses"][0])
        r = results[kind]
        print(f"{kind}: ours {r['ours_tokens_per_s']:.0f} tok/s vs TRL {r['trl_tokens_per_s']:.0f} tok/s "
              f"(×{r['speedup']}); peak RSS {r['ours_peak_rss_mb']:.0f} vs {r['trl_peak_rss_mb']:.0f} MB; "
              f"first losses {ours['losses']} vs {trl['losses']}", flush=True)
    summary = {"steps": steps, "batch": BATCH, "threads": args.threads or "default", "model": f"qwen2 h{HIDDEN} L{LAYERS}", "load_avg_1m": os.getloadavg()[0],
               **results}
    print("RESULT " + json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
