"""The self-training loop: a served model acts with real tools, its traces train the next version.

    training-assets loop --generations 2          # what `make loop` runs (SmolLM2-135M-Instruct)
    summary = run_loop(LoopSettings(generations=2))

One generation, every step a Dagster run on the graph (visible in the UI, tagged with the loop):

1. the role's current model is served (generation 0: the pretrained base, recorded by the
   ``base_model`` asset; later: the role's registered version, from the MLflow registry), and the
   harness runs it on the training task pool with real tools, ``attempts`` times per task;
   generation 0 also writes the teacher batch (the ideal conversations of the training pool);
2. those attempts go into the inbox as a batch (metadata: the served version, generation, family,
   score); ``trace_batch_sensor`` makes it a partition and ``raw_traces`` / ``minhash_signatures``
   are materialised for it;
3. the training chain runs on everything gathered so far: curated corpus, selected traces, SFT on
   the successes (LoRA on the base), DPO on success/failure pairs of one task, GRPO on the task
   reward of the logged attempts, TIES merge, the eval reports and their gates, the agentic eval
   (the candidate served with tools on the held-out tasks against the role's registered version)
   and ``registry_entry``, which registers the candidate for the role only when every gate passed.

The next generation serves what the role holds then: the new version when it was promoted, the
previous one when a gate stopped it. ``<data root>/loop/summary.json`` and ``success.png`` hold the
held-out success per generation (per family, 95% intervals) and where the time went.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg

from training_assets import paths
from training_assets.base_model.selection import current_base_model
from training_assets.defs.resources import MlflowTracking
from training_assets.evaluation import agentic
from training_assets.harness.client import chat_client
from training_assets.harness.families import HELD_OUT_TASKS, TRAIN_TASKS
from training_assets.harness.runner import SYSTEM_PROMPT, run_tasks, write_batch
from training_assets.harness.tasks import load_tasks
from training_assets.harness.teacher import teacher_trace
from training_assets.orchestration.active_runs import IN_FLIGHT_STATUSES
from training_assets.orchestration.catalog import defs, get_instance, tick_sensor
from training_assets.orchestration.demo import missing_partitions
from training_assets.orchestration.local_runs import WORKER_PID_TAG, reap_dead_worker
from training_assets.orchestration.vocabulary import LAUNCHED_BY_TAG
from training_assets.registry import DEFAULT_MODEL_NAME, ModelRegistry
from training_assets.serving.server import ModelServer, ServeSpec, servable_folder
from training_assets.settings import LoopSettings
from training_assets.storage import atomic_path, canonical_json, write_json_atomic

LOOP_TAG = "training_assets/loop"
LOOP_DIR = "loop"
ROLE = "generator"
SETUP_ASSETS = ("base_model", "held_out_sets")
# the chain each generation materialises (kto/orpo are other branches of the graph, not on this path)
CHAIN = ("curated_corpus", "selected_traces", "tokenizer", "preference_pairs", "grpo_groups", "pretrain_windows",
         "sft_dataset", "base_checkpoint", "sft_checkpoint", "sft_eval_report", "dpo_checkpoint", "grpo_checkpoint",
         "dpo_eval_report", "grpo_eval_report", "merged_adapter", "merged_eval_report", "agentic_eval_report",
         "registry_entry")


def chain_config(settings: LoopSettings) -> dict[str, dict[str, Any]]:
    """Run config per asset of ``CHAIN``: the loop's sizes, on the graph's own config fields."""
    # torch_threads 0: every core (the graph's demo default is 1 thread per trainer, for its parallel tiny runs)
    common = {"max_seq_len": settings.max_seq_len, "seed": settings.seed, "lr_scheduler": "constant", "torch_threads": 0,
              "save_steps": 0,  # the demo saves every 4 steps: a full 135M checkpoint each time here
              "warmup_steps": 0}
    lora = {"r": 16, "alpha": 32}  # DPO and GRPO: LoRA on every projection (LoraSpec's target_modules) of the SFT model
    small_eval = {"benchmark_tasks": [], "max_new_tokens": 16, "max_bpb_vs_uniform": None}
    per_step = max(1, settings.batch_size // 2)
    adapter_batch = {"batch_size": min(2, per_step), "grad_accum": max(1, per_step // 2)}
    return {
        # the dataset leaves out (and counts) what the trainers would otherwise truncate
        "sft_dataset": {"max_tokens": settings.max_seq_len},
        # unpacked: rows of one family share their system turn (240-990 tokens), computed once per micro-batch;
        # the graph's packed default put 8 x 1,536 tokens in a step, whose fp32 logits alone took 2.4 GB
        # a copy (the first run with 1,536-token rows was killed for memory on this 24 GB machine)
        "sft_checkpoint": {**common, "max_steps": settings.sft_steps, "batch_size": settings.batch_size,
                           "lr": settings.lr, "packing": False},
        # DPO and GRPO: half SFT's batch per optimizer step, in micro-batches of 2 (a micro-batch of 4 list
        # pairs is 8 x ~1,200 tokens through the policy: killed for memory on this 24 GB machine)
        "dpo_checkpoint": {**common, "max_steps": settings.dpo_steps, "lora": lora, **adapter_batch,
                           "lr": settings.adapter_lr},
        "grpo_checkpoint": {**common, "max_steps": settings.grpo_steps, "lora": lora, **adapter_batch,
                            "lr": settings.adapter_lr, "grpo": {"rollout": "dataset"}},
        "sft_eval_report": small_eval, "dpo_eval_report": small_eval, "grpo_eval_report": small_eval,
        "merged_eval_report": small_eval,
        "agentic_eval_report": {"max_tasks": settings.held_out_tasks, "concurrency": settings.concurrency,
                                "engine": settings.engine, "role": ROLE},
        "registry_entry": {"role": ROLE},
    }


class LoopError(RuntimeError):
    """A step of the loop failed; one line naming it and where to look."""


def _materialize(instance: dg.DagsterInstance, keys: list[str], tags: dict[str, str],
                 config: dict[str, dict[str, Any]] | None = None, partition: str | None = None) -> dg.ExecuteInProcessResult:
    job = defs.resolve_implicit_global_asset_job_def()
    ops = {k: {"config": v} for k, v in (config or {}).items() if k in keys}
    return job.execute_in_process(
        instance=instance, asset_selection=[dg.AssetKey(k) for k in keys], partition_key=partition,
        # console: CRITICAL only. A failed step or gate is reported by the loop in one line (_failures); Dagster's
        # own ERROR events carry a stack trace (a blocking gate failing is a normal outcome) and stay in the
        # run's event log, in the UI
        run_config={"ops": ops, "loggers": {"console": {"config": {"log_level": "CRITICAL"}}}},
        tags=tags, raise_on_error=False)


def _root_cause(event: dg.DagsterEvent) -> str:
    """The first line of the error a failed step raised itself (not Dagster's wrapper), class name dropped."""
    error = event.step_failure_data.error if event.step_failure_data else None
    while error is not None and error.cause is not None:
        error = error.cause
    if error is None:
        return event.message or "failed"
    first = (error.message or "").strip().splitlines()[0] if (error.message or "").strip() else (error.cls_name or "failed")
    head, sep, rest = first.partition(": ")
    return rest if sep and head.split(".")[-1] == error.cls_name else first


def _failures(result: dg.ExecuteInProcessResult) -> list[str]:
    out = []
    for event in result.all_events:
        if event.is_step_failure:
            out.append(f"{event.step_key}: {_root_cause(event)}")
        elif event.event_type_value == "ASSET_CHECK_EVALUATION" and not event.event_specific_data.passed:
            data = event.event_specific_data
            out.append(f"gate {data.asset_key.to_user_string()}/{data.check_name} failed: {data.description or ''}")
    return out


def _served_model(root: Path, tracking_uri: str, generation: int) -> tuple[Path, str]:
    """The folder the role serves now and its label: the registered version, else the base."""
    registry = ModelRegistry(tracking_uri, DEFAULT_MODEL_NAME)
    current = registry.serving(ROLE)
    if current is not None:
        return servable_folder(registry.local_dir(current), root / "serving"), f"{ROLE}-v{current.version}"
    base = current_base_model(root)
    if base is None or not base.folder:
        raise LoopError("no base model recorded: materialise base_model with a model (training-assets models fetch ...)")
    return Path(base.folder), "base"


def _collect(folder: Path, label: str, generation: int, settings: LoopSettings, root: Path, log) -> dict[str, Any]:
    name = f"loop-g{generation}-{label}"
    if (paths.inbox_dir(root) / f"{name}.jsonl").exists():  # a loop run again on its data root resumes
        log(f"generation {generation}: {label}'s attempts are already in the inbox ({name}.jsonl)")
        return {"batch": f"{name}.jsonl", "resumed": True}
    tasks = agentic.pick_tasks(load_tasks(TRAIN_TASKS), settings.collect_tasks)
    spec = ServeSpec(model_dir=str(folder), engine=settings.engine, dtype="float32",
                     log_path=str(root / LOOP_DIR / f"serve-g{generation}.log"))
    with ModelServer(spec) as server:
        client = chat_client(server.base_url, timeout_s=120.0)
        report = run_tasks(client, server.model, tasks, concurrency=server.in_flight(settings.concurrency), generation=generation,
                           attempts=settings.attempts, temperature=settings.temperature, seed=settings.seed,
                           served_as=label)
    unanswered = [t for t in report.traces if not any(m.role == "assistant" for m in t.messages)]
    if len(unanswered) == len(report.traces):  # not one model turn: the server, not the model, failed
        raise LoopError(f"generation {generation}: no attempt got a model turn from {label}: "
                        f"{unanswered[0].outcome.error}; see {spec.log_path}")
    batch = write_batch(report.traces, paths.inbox_dir(root), name)
    log(f"generation {generation}: {label} attempted {len(tasks)} training tasks x{settings.attempts}: "
        f"{report.overall.rate:.3f} success -> {batch.name}")
    return {"batch": batch.name, "train_success": report.overall.model_dump(),
            "train_by_family": {f: r.model_dump() for f, r in report.by_family.items()}}


def _teacher(settings: LoopSettings, root: Path, log) -> str | None:
    if not settings.teacher_tasks:
        return None
    tasks = agentic.pick_tasks(load_tasks(TRAIN_TASKS), settings.teacher_tasks)
    target = paths.inbox_dir(root) / "loop-teacher.jsonl"
    if target.exists():
        return target.name
    batch = write_batch([teacher_trace(t, SYSTEM_PROMPT) for t in tasks], paths.inbox_dir(root), "loop-teacher")
    log(f"teacher batch: {len(tasks)} ideal conversations -> {batch.name}")
    return batch.name


def _held_out_file(root: Path) -> Path:
    """The agentic held-out tasks among the held-out sets: the corpus is decontaminated against their prompts."""
    target = root / "held_out" / HELD_OUT_TASKS.name
    data = "".join(canonical_json({"id": t.task_id, "prompt": t.prompt}) + "\n" for t in load_tasks(HELD_OUT_TASKS)).encode()
    if not (target.is_file() and target.read_bytes() == data):  # an identical file is left as it is
        with atomic_path(target) as tmp:
            tmp.write_bytes(data)
    return target


def _agentic_report(root: Path) -> dict[str, Any]:
    path = paths.asset_dir("agentic_eval_report", root) / agentic.REPORT_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def reap_dead_loop_runs(instance: dg.DagsterInstance) -> list[str]:
    """Loop runs still in flight whose loop process is gone (killed, interrupted): recorded failed, so the UI
    and the run queries stop showing them STARTED; the ids. Each run carries its process id
    (``WORKER_PID_TAG``), so a loop still running elsewhere on this instance keeps its runs."""
    records = instance.get_run_records(dg.RunsFilter(tags={LAUNCHED_BY_TAG: "loop"},
                                                     statuses=list(IN_FLIGHT_STATUSES)))
    return [r.dagster_run.run_id for r in records
            if reap_dead_worker(instance, r).dagster_run.status not in IN_FLIGHT_STATUSES]


def run_loop(settings: LoopSettings, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Generation 0 (the base) then ``settings.generations`` trained generations; the summary."""
    started = time.perf_counter()
    root = paths.data_root()
    instance = get_instance()
    loop_dir = root / LOOP_DIR
    loop_dir.mkdir(parents=True, exist_ok=True)
    tracking_uri = MlflowTracking().uri(root)  # what the graph's registry_entry registers into
    timings: dict[str, float] = {}
    reaped = reap_dead_loop_runs(instance)
    if reaped:
        log(f"{len(reaped)} run(s) of an earlier loop process that is gone recorded failed: {', '.join(reaped)}")

    def step(name: str, keys: list[str], config=None, partition=None, generation: int = 0) -> list[str]:
        t0 = time.perf_counter()
        tags = {LAUNCHED_BY_TAG: "loop", LOOP_TAG: f"g{generation}", WORKER_PID_TAG: str(os.getpid())}
        result = _materialize(instance, keys, tags, config, partition)
        timings[name] = round(timings.get(name, 0.0) + time.perf_counter() - t0, 1)
        return _failures(result)

    _held_out_file(root)
    failed = step("setup", list(SETUP_ASSETS), {"base_model": {"model": settings.model}})
    if failed:
        raise LoopError(f"setup failed: {failed[0]}")
    generations: list[dict[str, Any]] = []
    for generation in range(settings.generations + 1):
        t0 = time.perf_counter()
        folder, label = _served_model(root, tracking_uri, generation)
        record: dict[str, Any] = {"generation": generation, "served": label}
        if generation == 0:
            record["teacher_batch"] = _teacher(settings, root, log)
        if generation < settings.generations:  # the last generation's model is measured, not collected on
            record.update(_collect(folder, label, generation, settings, root, log))
        timings[f"g{generation} collect"] = round(time.perf_counter() - t0, 1)
        if generation == settings.generations:
            generations.append(record)
            break
        new = tick_sensor(instance)
        for partition, keys in missing_partitions(instance).items():
            failed = step(f"g{generation} ingest", [k.to_user_string() for k in keys], partition=partition,
                          generation=generation)
            if failed:
                log(f"batch {partition}: {failed[0]}")
        log(f"generation {generation}: sensor added {new}; training generation {generation + 1}")
        failed = step(f"g{generation + 1} train+gate", list(CHAIN), chain_config(settings), generation=generation + 1)
        report = _agentic_report(root)
        record_next = {"generation": generation + 1, "gates_failed": failed,
                       "agentic_gate": report.get("gate"), "candidate": report.get("candidate"),
                       "baseline": report.get("baseline")}
        generations.append(record)
        record["next"] = record_next
        cand = (report.get("candidate") or {}).get("overall", {})
        log(f"generation {generation + 1}: held-out {cand.get('rate', float('nan')):.3f} "
            f"[{cand.get('low', float('nan')):.3f}, {cand.get('high', float('nan')):.3f}]; "
            + ("registered" if not failed else f"not promoted: {failed[0][:200]}"))
    summary = _summarise(settings, generations, timings, time.perf_counter() - started, root)
    write_json_atomic(loop_dir / "summary.json", summary)
    return summary


def _summarise(settings: LoopSettings, generations: list[dict[str, Any]], timings: dict[str, float],
               elapsed: float, root: Path) -> dict[str, Any]:
    """Held-out success per generation (0 = the base, from the first agentic report's baseline)."""
    rows: list[dict[str, Any]] = []
    results: list[agentic.AgenticResult] = []
    for record in generations:
        nxt = record.get("next") or {}
        if record["generation"] == 0 and nxt.get("baseline"):
            results.append(agentic.AgenticResult.model_validate(nxt["baseline"]))
            rows.append(_row(0, results[-1], True))
        if nxt.get("candidate"):
            results.append(agentic.AgenticResult.model_validate(nxt["candidate"]))
            rows.append(_row(nxt["generation"], results[-1], bool((nxt.get("agentic_gate") or {}).get("passed"))
                             and not nxt.get("gates_failed")))
    if results:
        (root / LOOP_DIR / "success.png").write_bytes(agentic.success_plot_png(
            [r.model_copy(update={"label": f"g{row['generation']}"}) for r, row in zip(results, rows, strict=True)]))
    return {"settings": settings.model_dump(), "generations": rows, "targets": targets(rows, elapsed),
            "records": generations, "timings_s": timings, "elapsed_s": round(elapsed, 1),
            "machine": {"cpus": os.cpu_count(), "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()]},
            "plot": str(root / LOOP_DIR / "success.png")}


def targets(rows: list[dict[str, Any]], elapsed: float) -> dict[str, bool | None]:
    """Issue 25's targets, each None when this run cannot tell (too few generations)."""
    by_gen = {row["generation"]: row for row in rows}
    out: dict[str, bool | None] = {"g1_overall_ge_0.60_every_family_ge_0.50": None,
                                   "g2_weakest_family_gains_ge_0.10_none_worse": None,
                                   "two_generations_le_20_min": None}
    if 1 in by_gen:
        g1 = by_gen[1]
        out["g1_overall_ge_0.60_every_family_ge_0.50"] = (g1["overall"]["rate"] >= 0.60 and
                                                          all(f["rate"] >= 0.50 for f in g1["families"].values()))
    if 1 in by_gen and 2 in by_gen:
        f1, f2 = by_gen[1]["families"], by_gen[2]["families"]
        weakest = min(f1, key=lambda f: f1[f]["rate"])
        out["g2_weakest_family_gains_ge_0.10_none_worse"] = (
            f2[weakest]["rate"] >= f1[weakest]["rate"] + 0.10 and all(f2[f]["rate"] >= f1[f]["rate"] for f in f1))
        out["two_generations_le_20_min"] = elapsed <= 20 * 60 if max(by_gen) == 2 else None
    return out


def _row(generation: int, result: agentic.AgenticResult, promoted: bool) -> dict[str, Any]:
    return {"generation": generation, "label": result.label, "promoted": promoted,
            "overall": {k: round(v, 3) for k, v in result.overall.items()},
            "families": {f: {k: round(v, 3) for k, v in s.items()} for f, s in sorted(result.families.items())}}
