"""SFT with shared prefixes and the LM head on labelled positions only, against the full rows and full
logits: the loop's conversations on SmolLM2-135M-Instruct (CPU).

    .venv/bin/python benchmarks/shared_prefix.py               # 5 rounds, batch 8
    .venv/bin/python benchmarks/shared_prefix.py --rounds 3 --batch 4

The rows are what the self-training loop trains on: teacher conversations of the three task
families, each with its tools folded into the system turn (240 to 990 tokens of system turn in
330 to 1,240), encoded by the SFT trainer's own template path, micro-batches of ``--batch`` in
the order the tasks file lists them after the loop's interleaving of families. Each round times,
on the same micro-batches and the same model (full weights, fp32, train mode), the loss and its
backward for three sides, in an order that rotates each round: ``logits`` (the model's own forward:
(B, T, V) logits, every position through the LM head, then the masked cross-entropy), ``full``
(``modeling.shifted_ce``: every row whole, the LM head only on the positions that have a label)
and ``shared`` (``modeling.shared_prefix_ce``: each shared prefix once, then as ``full``).
Reported: each side's median seconds per micro-batch, the per-round ratios (logits / full: the
head; full / shared: the prefixes; median and range), the tokens each side computes, the fp32
logits each holds, the largest loss difference between the sides (they must agree to float
rounding) and the load average. Needs the fetched model (``training-assets models fetch
smollm2-135m-instruct``; ``$TRAINING_ASSETS_MODELS`` names its cache). The last line is
``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def micro_batches(tokenizer, batch: int, count: int) -> list[list[dict]]:
    from training_assets.base_model.template import fold_tools
    from training_assets.evaluation.agentic import pick_tasks
    from training_assets.harness.families import TRAIN_TASKS
    from training_assets.harness.runner import SYSTEM_PROMPT
    from training_assets.harness.tasks import load_tasks
    from training_assets.harness.teacher import teacher_trace
    from training_assets.trainers.sft import encode_messages

    tasks = pick_tasks(load_tasks(TRAIN_TASKS), batch * count)
    rows = []
    for task in tasks:
        trace = teacher_trace(task, SYSTEM_PROMPT).model_dump(mode="json")
        ids, mask = encode_messages(tokenizer, fold_tools(trace["messages"], trace["metadata"].get("tools")))
        rows.append({"input_ids": ids, "labels": [t if m else -100 for t, m in zip(ids, mask)]})
    return [rows[i:i + batch] for i in range(0, len(rows), batch)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--batches", type=int, default=2, help="micro-batches timed per side and round")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training_assets.base_model.fetch import ensure_model
    from training_assets.base_model.template import with_tool_template
    from training_assets.trainers import objectives
    from training_assets.trainers.modeling import (
        IGNORE_INDEX,
        ones_mask,
        pad_rows,
        prefix_batch,
        shared_prefix_ce,
        shifted_ce,
    )
    from training_assets.trainers.sft import shared_prefixes

    folder = ensure_model("smollm2-135m-instruct", log=lambda _line: None)
    tokenizer = with_tool_template(AutoTokenizer.from_pretrained(folder))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
    model.train()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    batches, tokens, logits_mb = [], {"full": 0, "shared": 0}, {"logits": 0.0, "full": 0.0}
    vocab = model.get_output_embeddings().weight.shape[0]
    for rows in micro_batches(tokenizer, args.batch, args.batches):
        full = {"input_ids": pad_rows([r["input_ids"] for r in rows], pad),
                "labels": pad_rows([r["labels"] for r in rows], IGNORE_INDEX),
                "attention_mask": ones_mask([len(r["input_ids"]) for r in rows])}
        groups = shared_prefixes([r["input_ids"] for r in rows], [r["labels"] for r in rows])
        shared = {**full, "shared": prefix_batch(rows, *groups, pad)} if groups else full
        batches.append((full, shared))
        tokens["full"] += int(full["attention_mask"].numel())  # padded rows: what the full forward computes
        logits_mb["logits"] = max(logits_mb["logits"], full["input_ids"].numel() * vocab * 4 / 2**20)
        logits_mb["full"] = max(logits_mb["full"], int((full["labels"][:, 1:] != IGNORE_INDEX).sum()) * vocab * 4 / 2**20)
        tokens["shared"] += (sum(len(p) for p in shared["shared"]["prefix_ids"])
                             + int(shared["shared"]["suffix_ids"].numel())) if groups else int(full["attention_mask"].numel())

    def logits_ce(batch: dict) -> torch.Tensor:  # what shifted_ce did before the head ran on labelled positions only
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
        return objectives.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(), batch["labels"][:, 1:].reshape(-1))

    def run(side: str) -> tuple[float, list[float]]:
        losses, start = [], time.perf_counter()
        for full, shared in batches:
            if side == "logits":
                loss = logits_ce(full)
            else:
                loss, _ = shifted_ce(model, full, "torch") if side == "full" else shared_prefix_ce(model, shared, "torch")
            loss.backward()
            model.zero_grad(set_to_none=True)
            losses.append(loss.detach().item())
        return (time.perf_counter() - start) / len(batches), losses

    run("shared")  # warm-up: allocator, sdpa paths
    load_before = os.getloadavg()[0]
    sides = ("logits", "full", "shared")
    times: dict[str, list[float]] = {side: [] for side in sides}
    ratios, head_ratios, gap = [], [], 0.0
    for r in range(args.rounds):
        order = sides[r % 3:] + sides[:r % 3]
        got = {side: run(side) for side in order}
        for side in order:
            times[side].append(got[side][0])
        ratios.append(got["full"][0] / got["shared"][0])
        head_ratios.append(got["logits"][0] / got["full"][0])
        gap = max(gap, max(abs(a - b) for side in ("full", "shared") for a, b in zip(got["logits"][1], got[side][1])))
        print(f"round {r + 1}: logits {got['logits'][0]:.2f} s, full {got['full'][0]:.2f} s, shared "
              f"{got['shared'][0]:.2f} s per micro-batch (head {head_ratios[-1]:.2f}x, prefixes {ratios[-1]:.2f}x)",
              flush=True)
    result = {
        "benchmark": "shared_prefix", "model": "smollm2-135m-instruct", "batch": args.batch, "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "logits_s": round(statistics.median(times["logits"]), 3),
        "full_s": round(statistics.median(times["full"]), 3), "shared_s": round(statistics.median(times["shared"]), 3),
        "speedup_median": round(statistics.median(ratios), 2),
        "speedup_range": [round(min(ratios), 2), round(max(ratios), 2)],
        "head_speedup_median": round(statistics.median(head_ratios), 2),
        "head_speedup_range": [round(min(head_ratios), 2), round(max(head_ratios), 2)],
        "logits_mb_full": round(logits_mb["logits"], 1), "logits_mb_labelled": round(logits_mb["full"], 1),
        "tokens_full": tokens["full"], "tokens_shared": tokens["shared"], "max_loss_gap": gap,
        "load_avg": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    print(f"LM head on labelled positions: {result['head_speedup_median']}x (rounds {result['head_speedup_range']}), "
          f"{result['logits_mb_labelled']:,} MB of logits instead of {result['logits_mb_full']:,}; shared prefixes: "
          f"{result['speedup_median']}x (rounds {result['speedup_range']}), {tokens['shared']:,} tokens computed "
          f"instead of {tokens['full']:,}; loss gap {gap:.2e}")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
