"""Our trainers against TRL 1.16, and ``run_loop`` against a bare PyTorch loop (CPU, tiny model).

    .venv/bin/python benchmarks/trainers.py              # 5 rounds × 12 steps per trainer, 1 torch thread (~6 min at load 6)
    .venv/bin/python benchmarks/trainers.py --quick      # 2 rounds × 4 steps (smoke; not for figures)
    .venv/bin/python benchmarks/trainers.py --kinds dpo --rounds 7

Same model (Qwen2, hidden 128, 4 layers, a 1k-token BPE with the project chat template), same
examples, batch, steps, lr, fp32, assistant-only loss, no packing (TRL's default) on both sides.
DPO: sigmoid loss, beta 0.1, reference log-probs precomputed on both sides. ORPO: beta (lambda) 0.1,
no reference (TRL's ``trl.experimental.orpo.ORPOTrainer``). KTO: beta 0.1, weights 1, alternate examples
desirable (the right answer) and undesirable (the wrong one), KL pairs from the batch, reference log-probs
precomputed on both sides. GRPO: 2 prompts × 4
generations per step, 16 new tokens, beta 0, DAPO aggregation, one reward function.

Each side lives in its own long-lived subprocess (imports paid once, before any timing, and
reported as ``import_s``), so peak RSS is per side: each run resets the process's peak (Linux
``/proc/self/clear_refs``) and reads VmHWM at its end, so a run's peak includes what the process
already held (imports, the allocator's cache of earlier runs), the same on both sides. The driver
alternates the sides round by round (TRL first on even rounds, ours first on odd ones) for
``--rounds`` rounds, after ``--warmup`` untimed rounds per trainer on each side (each side's first run
paid what its imports left for later — lazy imports, chat-template compilation, kernel set-up:
measured +0.15 s on ours' first SFT run and +0.26 s on its first GRPO run, up to +0.05 s on TRL's).
A round is a whole run:
model load, data preparation (TRL tokenises in its constructor, we in ``train()``), training and
the final save, the same token count on both sides, so the tokens/s ratio is a time ratio. Per
trainer it reports the median of the per-round ratios, their min-max spread, the same ratio on
process CPU time (robust to other tenants of a shared machine: one torch thread per side), the
peak RSS of each side and the load average seen during the rounds.

Loop overhead (SFT packed, DPO): the ours subprocess also times ``run_loop`` against a bare loop on the
SAME micro-batches (collated up front for the bare side): forward (the trainer's loss), backward,
grad clip, optimizer and lr-scheduler step, ``zero_grad`` — nothing else, i.e. the same math, and
the benchmark checks that both produce the same losses. ``loop_vs_bare`` is run_loop tokens/s over
bare tokens/s (run_loop collates each step inside its timing, the bare side does not). Each timing
runs ``--loop-steps`` optimizer steps (default 36, ~2 s): at 12 steps (~0.6 s) the ratio of one
round swung by ±15 % with the order of the two sides.

Targets (issue 15; ORPO from issue 24): ours ≥ 1.5× TRL (median) for SFT, DPO, ORPO and GRPO with peak RSS
below TRL's;
run_loop ≥ 0.95× the bare loop. The last line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
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


def _reset_peak_rss() -> None:
    """Linux: reset this process's peak RSS (VmHWM) to its current RSS, so each run's peak is its own."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:  # not Linux or not allowed: the peak is then the process's since start (ru_maxrss)
        pass


def _peak_rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _import_side(side: str) -> None:
    """Everything a side imports, before the first timed round (the first round would pay it otherwise)."""
    import transformers.models.qwen2.modeling_qwen2  # noqa: F401
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: F401

    if side == "trl":
        import datasets  # noqa: F401
        from trl import DPOTrainer, GRPOTrainer, SFTTrainer  # noqa: F401
        from trl.experimental.orpo import ORPOTrainer  # noqa: F401
        from trl.trainer.kto_trainer import KTOTrainer  # noqa: F401
    else:
        from training_assets import launch, tracking  # noqa: F401
        from training_assets.trainers import decoding, dpo, grpo, kto, loop, modeling, orpo, sft  # noqa: F401


def _common_ours(workdir: Path, out: str, steps: int, threads: int) -> dict:
    return dict(base_model=str(workdir / "model"), tokenizer=str(workdir / "tokenizer"), output_dir=out, max_steps=steps,
                lr=LR, seed=SEED, max_seq_len=256, warmup_steps=0, lr_scheduler="linear", torch_threads=threads)


def _ours_trainer(kind: str, rows: list[dict], workdir: Path, out: str, steps: int, threads: int, packing: bool = False):
    from training_assets.trainers import DpoSpec, GrpoSpec, TrainConfig, get_trainer

    common = _common_ours(workdir, out, steps, threads)
    n_examples = steps * BATCH
    if kind == "sft":
        trainer = get_trainer("sft", TrainConfig(batch_size=BATCH, packing=packing, **common))
        data = [{"messages": r["messages"]} for r in rows[: len(rows) if packing else n_examples]]
    elif kind == "dpo":
        trainer = get_trainer("dpo", TrainConfig(batch_size=BATCH, dpo=DpoSpec(beta=0.1), **common))
        data = [{"id": str(i), "prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]}
                for i, r in enumerate(rows[:n_examples])]
    elif kind == "orpo":
        from training_assets.trainers.config import OrpoSpec

        trainer = get_trainer("orpo", TrainConfig(batch_size=BATCH, orpo=OrpoSpec(beta=0.1), **common))
        data = [{"id": str(i), "prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]}
                for i, r in enumerate(rows[:n_examples])]
    elif kind == "kto":
        from training_assets.trainers.config import KtoSpec

        trainer = get_trainer("kto", TrainConfig(batch_size=BATCH, kto=KtoSpec(beta=0.1), **common))
        data = [{"id": str(i), **_kto_row(i, r)} for i, r in enumerate(rows[:n_examples])]
    else:
        grpo = GrpoSpec(num_generations=4, max_new_tokens=16, kl_beta=0.0, loss_type="dapo", temperature=1.0)
        trainer = get_trainer("grpo", TrainConfig(batch_size=2, grpo=grpo, **common), reward_fn=_reward)
        data = [{"group_id": str(i), "prompt": r["prompt"], "expected_answer": r["expected_answer"]}
                for i, r in enumerate(rows[: steps * 2])]
    return trainer, data


def run_once(side: str, kind: str, workdir: Path, steps: int, threads: int) -> dict:
    """One whole run of ``kind`` by ``side`` (ours | trl): model load, data preparation, training, final save."""
    import torch

    torch.manual_seed(SEED)
    _reset_peak_rss()
    t0, c0 = time.perf_counter(), time.process_time()
    rows = json.loads((workdir / "data.json").read_text())
    out = tempfile.mkdtemp(prefix=f"bench-{side}-{kind}-", dir=workdir)
    if side == "ours":
        trainer, data = _ours_trainer(kind, rows, workdir, out, steps, threads)
        losses = list(trainer.train(data).loop.losses)
    else:
        losses = _run_trl(kind, rows, workdir, out, steps)
    return {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "losses": losses[:3],
            "peak_rss_mb": _peak_rss_mb(), "load_1m": os.getloadavg()[0]}


def _kto_row(i: int, row: dict) -> dict:
    """KTO's unpaired example of row ``i``: even rows the right answer (desirable), odd rows the wrong one."""
    desirable = i % 2 == 0
    return {"prompt": row["prompt"], "completion": row["chosen" if desirable else "rejected"], "label": desirable}


def _run_trl(kind: str, rows: list[dict], workdir: Path, out: str, steps: int) -> list[float]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    tok = _tokenizer(workdir)
    n_examples = steps * BATCH
    model = AutoModelForCausalLM.from_pretrained(str(workdir / "model"))
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
    elif kind == "orpo":
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer

        args = ORPOConfig(per_device_train_batch_size=BATCH, max_length=256, beta=0.1, activation_checkpointing=False,
                          **common)
        data = Dataset.from_list([{"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]}
                                  for r in rows[:n_examples]])
        trainer = ORPOTrainer(model=model, args=args, processing_class=tok, train_dataset=data)
    elif kind == "kto":
        from trl.trainer.kto_config import KTOConfig
        from trl.trainer.kto_trainer import KTOTrainer

        args = KTOConfig(per_device_train_batch_size=BATCH, max_length=256, beta=0.1, precompute_ref_log_probs=True,
                         activation_checkpointing=False, **common)
        data = Dataset.from_list([_kto_row(i, r) for i, r in enumerate(rows[:n_examples])])
        trainer = KTOTrainer(model=model, ref_model=None, args=args, processing_class=tok, train_dataset=data)
    else:
        from trl import GRPOConfig, GRPOTrainer

        args = GRPOConfig(per_device_train_batch_size=8, num_generations=4, max_completion_length=16, beta=0.0,
                          loss_type="dapo", temperature=1.0, activation_checkpointing=False, **common)
        data = Dataset.from_list([{"prompt": r["prompt"]} for r in rows[: steps * 2]])
        trainer = GRPOTrainer(model=model, reward_funcs=[_reward], args=args, processing_class=tok, train_dataset=data)
    trainer.train()
    trainer.save_model(str(Path(out) / "final"))  # ours writes its final model too
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def bare_loop(trainer, rows: list[dict], model, steps: int) -> dict:
    """Forward, backward, clip, optimizer + lr step, zero_grad over pre-collated micro-batches: nothing else."""
    import torch
    from transformers import get_scheduler

    from training_assets.trainers.loop import DataSchedule, build_optimizer

    config = trainer.config
    schedule = DataSchedule(len(rows), config.batch_size, config.seed)
    batches = [trainer.micro_batch([rows[i] for i in schedule.indices(p)], model) for p in range(steps)]
    c0 = time.process_time()  # CPU from here: run_loop's CPU time includes building its optimizer too
    torch.manual_seed(config.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, config)
    scheduler = get_scheduler(config.lr_scheduler, optimizer, num_warmup_steps=config.warmup_steps,
                              num_training_steps=steps)
    model.train()
    losses = []
    t0 = time.perf_counter()
    for batch in batches:
        loss, _ = trainer.loss(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    tokens = sum(int(b["n_tokens"]) for b in batches)
    return {"wall_s": wall, "cpu_s": cpu, "tokens": tokens, "tokens_per_s": tokens / wall, "losses": [float(x) for x in losses]}


def loop_vs_bare(kind: str, workdir: Path, steps: int, threads: int, order: list[str]) -> dict:
    """``run_loop`` and ``bare_loop`` from the same initial weights on the same micro-batches, in ``order``."""
    import torch

    from training_assets.trainers import modeling
    from training_assets.trainers.loop import run_loop

    if threads > 0:
        torch.set_num_threads(threads)
    rows_in = json.loads((workdir / "data.json").read_text())
    trainer, data = _ours_trainer(kind, rows_in, workdir, tempfile.mkdtemp(prefix="bench-loop-", dir=workdir), steps,
                                  threads, packing=kind == "sft")
    tok = trainer.load_tokenizer()
    rows = trainer.prepare(data, tok)
    out = {}
    for which in order:
        torch.manual_seed(SEED)
        model = modeling.build_model(trainer.config, len(tok))
        trainer.model = model
        trainer.before_loop(model, rows)
        if which == "bare":
            out["bare"] = bare_loop(trainer, rows, model, steps)
        else:
            c0 = time.process_time()
            res = run_loop(model, len(rows), lambda idx, m: trainer.micro_batch([rows[i] for i in idx], m), trainer.loss,
                           trainer.config, planned_steps=steps)
            out["run_loop"] = {"wall_s": res.wall_s, "cpu_s": time.process_time() - c0, "tokens": res.tokens,
                               "tokens_per_s": res.tokens_per_s, "losses": list(res.losses)}
    return out


def serve(side: str, workdir: Path, steps: int, threads: int) -> None:
    """A side's long-lived worker: one command per stdin line (``run KIND``, ``loop KIND ORDER``), one ``ROUND {json}`` each."""
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    _import_side(side)
    print("READY " + json.dumps({"import_s": time.perf_counter() - t0}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "loop":
            answer = loop_vs_bare(cmd[1], workdir, int(cmd[3]), threads, cmd[2].split(","))
        else:
            answer = run_once(side, cmd[1], workdir, steps, threads)
        print("ROUND " + json.dumps(answer), flush=True)


class Worker:
    """The driver's handle on one side's subprocess; its stderr goes to a log file shown on failure."""

    def __init__(self, side: str, workdir: Path, steps: int, threads: int) -> None:
        self.side = side
        self.log = workdir / f"{side}.log"
        cmd = [sys.executable, __file__, "--serve", side, str(workdir), "--steps", str(steps), "--threads", str(threads)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log.open("w"),
                                     text=True, bufsize=1)
        self.ready = self._read("READY ")

    def _read(self, prefix: str) -> dict:
        for line in self.proc.stdout:  # TRL prints its log dicts on stdout: skip them
            if line.startswith(prefix):
                return json.loads(line[len(prefix):])
        self.proc.wait()
        raise SystemExit(f"{self.side} worker exited ({self.proc.returncode}) before {prefix.strip()}:\n"
                         + self.log.read_text()[-3000:])

    def ask(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read("ROUND ")

    def close(self) -> None:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _tokens(workdir: Path, kind: str, steps: int) -> int:
    """Tokens a run processes (same on both sides): SFT/DPO/ORPO from the examples, GRPO prompt + max completion."""
    tok = _tokenizer(workdir)
    rows = json.loads((workdir / "data.json").read_text())

    def n(messages, **kw):
        return len(tok.apply_chat_template(messages, tokenize=True, return_dict=True, **kw)["input_ids"])

    if kind == "sft":
        return sum(n(r["messages"]) for r in rows[: steps * BATCH])
    if kind in ("dpo", "orpo"):
        return sum(n(r["prompt"] + r[side]) for r in rows[: steps * BATCH] for side in ("chosen", "rejected"))
    if kind == "kto":  # each example once (its KL pair is forwarded too, on both sides alike)
        return sum(n(r["prompt"] + _kto_row(i, r)["completion"]) for i, r in enumerate(rows[: steps * BATCH]))
    return sum(4 * (n(r["prompt"], add_generation_prompt=True) + 16) for r in rows[: steps * 2])


def _spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def bench_kind(kind: str, workers: dict[str, Worker], workdir: Path, steps: int, rounds: int, bare: bool,
               warmup: int = 1, loop_steps: int = 36) -> dict:
    runs: dict[str, list[dict]] = {"trl": [], "ours": [], "loop": []}
    loop_check = bare and kind in ("sft", "dpo")  # in the ours process; each run resets and reads its own peak RSS
    for _ in range(warmup):  # untimed: the first run of a kind in each process (and the first loop check)
        for side in ("trl", "ours"):
            workers[side].ask(f"run {kind}")
        if loop_check:
            workers["ours"].ask(f"loop {kind} run_loop,bare {loop_steps}")
    for r in range(rounds):
        for side in (("trl", "ours") if r % 2 == 0 else ("ours", "trl")):
            runs[side].append(workers[side].ask(f"run {kind}"))
        if loop_check:
            order = "run_loop,bare" if r % 2 == 0 else "bare,run_loop"
            runs["loop"].append(workers["ours"].ask(f"loop {kind} {order} {loop_steps}"))
    tokens = _tokens(workdir, kind, steps)
    ours, trl = runs["ours"], runs["trl"]
    wall_ratio = [t["wall_s"] / o["wall_s"] for o, t in zip(ours, trl)]
    cpu_ratio = [t["cpu_s"] / o["cpu_s"] for o, t in zip(ours, trl)]
    result = {"tokens": tokens, "rounds": rounds,
              "ours_tokens_per_s": round(tokens / statistics.median(o["wall_s"] for o in ours), 1),
              "trl_tokens_per_s": round(tokens / statistics.median(t["wall_s"] for t in trl), 1),
              "speedup": _spread(wall_ratio), "speedup_per_round": [round(r, 3) for r in wall_ratio],
              "speedup_cpu_time": _spread(cpu_ratio),
              "ours_peak_rss_mb": round(max(o["peak_rss_mb"] for o in ours), 1),
              "trl_peak_rss_mb": round(max(t["peak_rss_mb"] for t in trl), 1),
              "load_1m": _spread([x["load_1m"] for x in ours + trl]),
              "ours_first_losses": ours[0]["losses"], "trl_first_losses": trl[0]["losses"],
              "ours_losses_repeat": all(o["losses"] == ours[0]["losses"] for o in ours)}
    if kind == "dpo":
        result["step0_loss_diff"] = abs(ours[0]["losses"][0] - trl[0]["losses"][0])
    if runs.get("loop"):
        loop = runs["loop"]
        result["loop_vs_bare"] = _spread([x["run_loop"]["tokens_per_s"] / x["bare"]["tokens_per_s"] for x in loop])
        result["loop_vs_bare_cpu_time"] = _spread([x["bare"]["cpu_s"] / x["run_loop"]["cpu_s"] for x in loop])
        result["loop_vs_bare_per_round"] = [round(x["run_loop"]["tokens_per_s"] / x["bare"]["tokens_per_s"], 3) for x in loop]
        result["run_loop_tokens_per_s"] = round(statistics.median(x["run_loop"]["tokens_per_s"] for x in loop), 1)
        result["bare_tokens_per_s"] = round(statistics.median(x["bare"]["tokens_per_s"] for x in loop), 1)
        result["loop_bare_same_losses"] = all(x["run_loop"]["losses"] == x["bare"]["losses"] for x in loop)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds × 4 steps (smoke)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds per trainer on each side, before the timed ones")
    parser.add_argument("--kinds", default="sft,dpo,kto,orpo,grpo")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per side (0 = torch default)")
    parser.add_argument("--no-bare", action="store_true", help="skip the run_loop vs bare loop comparison")
    parser.add_argument("--loop-steps", type=int, default=36,
                        help="optimizer steps of each run_loop / bare loop timing (12 steps, ~0.6 s, swung ±15%%)")
    parser.add_argument("--serve", nargs=2, metavar=("SIDE", "WORKDIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    steps, rounds = (4, 2) if args.quick else (args.steps, args.rounds)
    loop_steps = 4 if args.quick else args.loop_steps
    if args.serve:
        serve(args.serve[0], Path(args.serve[1]), steps, args.threads)
        return
    t0 = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="bench-trainers-"))
    build_assets(workdir)
    results: dict[str, dict] = {}
    workers: dict[str, Worker] = {}
    try:
        for side in ("trl", "ours"):  # one at a time: imports do not overlap
            workers[side] = Worker(side, workdir, steps, args.threads)
        for kind in args.kinds.split(","):
            results[kind] = bench_kind(kind, workers, workdir, steps, rounds, not args.no_bare, args.warmup, loop_steps)
            _print_kind(kind, results[kind])
    finally:
        for w in workers.values():
            w.close()
    targets = {kind: {"speedup_ge_1.5": r["speedup"]["median"] >= 1.5, "rss_below_trl": r["ours_peak_rss_mb"] < r["trl_peak_rss_mb"],
                      **({"loop_ge_0.95": r["loop_vs_bare"]["median"] >= 0.95} if "loop_vs_bare" in r else {})}
               for kind, r in results.items()}
    summary = {"steps": steps, "loop_steps": loop_steps, "rounds": rounds, "warmup_rounds": args.warmup, "batch": BATCH, "threads": args.threads or "default",
               "model": f"qwen2 h{HIDDEN} L{LAYERS}", "load_avg_1m_end": os.getloadavg()[0],
               "import_s": {s: round(w.ready["import_s"], 2) for s, w in workers.items()},
               "bench_wall_s": round(time.perf_counter() - t0, 1), "targets": targets, **results}
    print("RESULT " + json.dumps(summary, sort_keys=True))


def _print_kind(kind: str, r: dict) -> None:
    loop = (f"; run_loop/bare ×{r['loop_vs_bare']['median']} ({r['loop_vs_bare']['min']}–{r['loop_vs_bare']['max']}; "
            f"CPU time ×{r['loop_vs_bare_cpu_time']['median']}; same losses {r['loop_bare_same_losses']})"
            if "loop_vs_bare" in r else "")
    print(f"{kind}: ours {r['ours_tokens_per_s']:.0f} tok/s vs TRL {r['trl_tokens_per_s']:.0f} tok/s, median "
          f"×{r['speedup']['median']} ({r['speedup']['min']}–{r['speedup']['max']}; CPU time ×"
          f"{r['speedup_cpu_time']['median']}); peak RSS {r['ours_peak_rss_mb']:.0f} vs {r['trl_peak_rss_mb']:.0f} MB; "
          f"load {r['load_1m']['min']}–{r['load_1m']['max']}{loop}", flush=True)


if __name__ == "__main__":
    main()
