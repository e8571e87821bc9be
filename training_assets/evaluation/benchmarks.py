"""EleutherAI lm-eval on a checkpoint, fully offline, over the task YAMLs shipped in ``eval_tasks/``.

    bench = evaluate_benchmarks("data/merged_adapter")   # {"tasks": {name: {metric: value}}, "n_samples": {...}}

Shipped tasks: ``ta_held_out_traces`` (held-out agent tasks as multiple choice) and
``ta_held_out_perplexity`` (rolling log-likelihood on held-out text; bits per byte, reported next
to a uniform guess's). Without lm-eval installed the result is ``{"skipped": reason}``.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from training_assets.evaluation.cases import EVAL_TASKS_DIR
from training_assets.evaluation.suite import load_for_eval

DEFAULT_BENCHMARKS = ("ta_held_out_traces", "ta_held_out_perplexity")


def lm_eval_available() -> tuple[bool, str]:
    """Whether EleutherAI lm-eval can be imported, with the reason when not."""
    try:
        import lm_eval  # noqa: F401  (the eval extra: only probed, seconds to import)
    except ImportError as exc:
        return False, f"lm-eval is not installed ({exc}); install it with: pip install 'training-assets[eval]'"
    return True, "lm-eval available"


def shipped_task_config(name: str) -> dict[str, Any]:
    """A shipped task YAML as a dict, its ``data_files`` made absolute (they are relative to the YAML)."""
    path = EVAL_TASKS_DIR / f"{name}.yaml"
    if not path.is_file():
        shipped = sorted(p.stem for p in EVAL_TASKS_DIR.glob("*.yaml"))
        raise FileNotFoundError(f"no shipped lm-eval task {name!r} ({path}); shipped: {shipped}")
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    files = config.get("dataset_kwargs", {}).get("data_files", {})
    for split, rel in files.items():
        files[split] = str((path.parent / rel).resolve())
    return config


def uniform_bits_per_byte(task_config: Mapping[str, Any], tokenizer: Any, limit: int | None = None) -> float:
    """Bits per byte of a uniform guess over the tokenizer's vocabulary on a rolling-perplexity task.

    ``sum_i n_tokens_i * log2(V) / sum_i n_bytes_i``: the chance level a model must beat. It
    depends on the tokenizer (a coarser one packs more bytes per token), which is why the gate
    compares the model against it rather than against a fixed number.
    """
    path = task_config["dataset_kwargs"]["data_files"]["test"]
    field_name = str(task_config.get("doc_to_target", "{{text}}")).strip("{} ")
    docs = [json.loads(line)[field_name] for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    docs = docs[:limit] if limit else docs
    n_tokens = sum(len(tokenizer(d, add_special_tokens=False)["input_ids"]) for d in docs)
    n_bytes = sum(len(d.encode("utf-8")) for d in docs)
    return n_tokens * math.log2(len(tokenizer)) / n_bytes


def _load_tasks(manager: Any, specs: list[Any], seed: int = 0) -> dict[str, Any]:
    """The task dict ``lm_eval.evaluate`` takes, set up as ``simple_evaluate`` sets it up (seeds, zero-shot
    unless a task says otherwise, the few-shot sampler's seed).

    ``simple_evaluate`` then also records the environment for its results (``add_env_info``: torch's
    ``collect_env`` runs ``pip list`` and other probes, ~0.8 s of CPU per call here), which we never read.
    """
    import torch  # torch: import-time stays torch-free

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    loaded = manager.load(specs)
    for task in loaded["tasks"].values():
        if task.get_config("num_fewshot") is None:
            task.set_config(key="num_fewshot", value=0)
        task.set_fewshot_seed(seed=seed)
    return loaded


def evaluate_benchmarks(model_path: str | os.PathLike[str], tasks: Sequence[str] = DEFAULT_BENCHMARKS,
                        limit: int | None = None, batch_size: int = 32,
                        loaded: tuple[Any, Any] | None = None, device: str = "auto", dtype: str = "auto") -> dict[str, Any]:
    """Run lm-eval tasks on a checkpoint, offline; ``{"tasks": {name: {metric: value}}}``.

    Shipped tasks (``training_assets/eval_tasks/*.yaml``) are passed as configs with absolute data
    paths; any other name goes through lm-eval's own task index. Without lm-eval installed the result
    is ``{"skipped": reason}`` rather than an error, so the reliability suite still runs.
    ``device`` / ``dtype`` (``evaluation.device``; auto: CUDA + bf16 with a GPU, else CPU fp32) place
    the model and go to lm-eval's HF model; with ``loaded`` the model's own device is used.
    """
    ok, reason = lm_eval_available()
    if not ok:
        return {"skipped": reason, "tasks": {}}
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import lm_eval  # the eval extra, checked by lm_eval_available
    from lm_eval.models.huggingface import HFLM  # the eval extra, checked by lm_eval_available
    from lm_eval.tasks import TaskManager  # the eval extra, checked by lm_eval_available

    shipped = {p.stem for p in EVAL_TASKS_DIR.glob("*.yaml")}
    specs: list[Any] = [shipped_task_config(t) if t in shipped else t for t in tasks]
    manager = TaskManager(include_path=str(EVAL_TASKS_DIR), include_defaults=not set(tasks) <= shipped)
    if loaded is None:
        model, tokenizer, _ = load_for_eval(model_path, device, dtype)
    else:
        model, tokenizer = loaded
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=str(model.device),
              max_length=getattr(model.config, "max_position_embeddings", None))
    out = lm_eval.evaluate(lm=lm, task_dict=_load_tasks(manager, specs), limit=limit, bootstrap_iters=0,
                           log_samples=False, fewshot_as_multiturn=True)
    results: dict[str, dict[str, float]] = {}
    for task, metrics in out["results"].items():
        results[task] = {k.split(",")[0]: float(v) for k, v in metrics.items()
                         if isinstance(v, (int, float)) and "_stderr" not in k and k != "alias"}
    for task, spec in zip(tasks, specs, strict=True):
        if isinstance(spec, dict) and spec.get("output_type") == "loglikelihood_rolling" and task in results:
            results[task]["uniform_bits_per_byte"] = uniform_bits_per_byte(spec, tokenizer, limit)
    return {"tasks": results, "n_samples": {k: v.get("effective", v.get("original"))
                                            for k, v in out.get("n-samples", {}).items()}}

