"""One stored eval report per checkpoint: reliability suite + benchmarks + gate decision, and its chart.

    payload = run_eval_report("data/merged_adapter", load_cases(), GateThresholds(min_pass_rate=0.8))
    write_eval_report(asset_dir("merged_eval_report", root), payload)   # <folder>/report.json
    load_eval_report(asset_dir("merged_eval_report", root))["gate"]     # {passed, reasons, compared_to}
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from training_assets.evaluation.benchmarks import evaluate_benchmarks
from training_assets.evaluation.cases import EvalCase
from training_assets.evaluation.gates import GateThresholds, decide_gate, gate_metrics
from training_assets.evaluation.suite import evaluate_checkpoint, load_for_eval
from training_assets.storage import fingerprint, write_json_atomic

EVAL_VERSION = "1"  # bump when scoring or generation changes: eval report assets re-run
REPORT_FILE = "report.json"


def eval_config_id(cases: Sequence[EvalCase], benchmark_tasks: Sequence[str], benchmark_limit: int | None,
                   max_new_tokens: int, dtype: str = "float32") -> str:
    """Identity of an evaluation setup: metrics are comparable only between reports that share it.

    The dtype counts (bf16 greedy answers can differ from fp32 ones); float32, what every report
    before device selection used, leaves the identity as it was.
    """
    parts: list[object] = [[asdict(c) for c in cases], list(benchmark_tasks), benchmark_limit, max_new_tokens, EVAL_VERSION]
    return fingerprint(*parts, *([dtype] if dtype != "float32" else []))


def run_eval_report(checkpoint_path: str | os.PathLike[str], cases: Sequence[EvalCase], thresholds: GateThresholds,
                    baseline: Mapping[str, float] | None = None, baseline_name: str | None = None,
                    benchmark_tasks: Sequence[str] = (), benchmark_limit: int | None = None,
                    max_new_tokens: int = 48, device: str = "auto", dtype: str = "auto",
                    batch_size: int = 32) -> dict[str, Any]:
    """Reliability suite + benchmarks + gate decision for one checkpoint, as one JSON-able report.

    ``device`` / ``dtype``: ``evaluation.device`` (auto: CUDA + bf16 with a GPU, else CPU fp32); the
    placement used is recorded in the report (``placement``); ``batch_size``: generation and lm-eval batch.
    """
    model, tokenizer, placement = load_for_eval(checkpoint_path, device, dtype)
    loaded = (model, tokenizer)
    report = evaluate_checkpoint(checkpoint_path, cases, max_new_tokens=max_new_tokens, loaded=loaded,
                                 batch_size=batch_size)
    benchmarks = (evaluate_benchmarks(checkpoint_path, benchmark_tasks, limit=benchmark_limit, loaded=loaded,
                                      batch_size=batch_size) if benchmark_tasks else {"tasks": {}})
    metrics = gate_metrics(report, benchmarks)
    decision = decide_gate(metrics, thresholds, baseline, baseline_name)
    return {"eval_version": EVAL_VERSION, "summary": report.summary(), "report": report.to_dict(),
            "eval_config": eval_config_id(cases, benchmark_tasks, benchmark_limit, max_new_tokens, placement.dtype),
            "benchmarks": benchmarks, "metrics": metrics, "baseline": dict(baseline or {}),
            "placement": placement.to_dict(),
            "thresholds": thresholds.model_dump(),
            "gate": {"passed": decision.passed, "reasons": list(decision.reasons), "compared_to": decision.compared_to}}


def write_eval_report(folder: str | os.PathLike[str], payload: Mapping[str, Any]) -> Path:
    """Write ``<folder>/report.json`` atomically (sorted keys: same report, same bytes)."""
    return write_json_atomic(Path(folder) / REPORT_FILE, dict(payload))


def load_eval_report(folder: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(folder) / REPORT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: materialise the eval report asset first "
                                "(`training-assets evaluate`, or `make demo`)")
    return json.loads(path.read_text(encoding="utf-8"))


def eval_chart_png(metrics: Mapping[str, float], baseline: Mapping[str, float] | None = None, title: str = "") -> bytes:
    """Bar chart of pass rates (overall and per category), beside the registered model's when known."""
    import matplotlib  # ~2 s to import: only when a chart is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # ~2 s to import: only when a chart is drawn

    keys = [k for k in metrics if k == "pass_rate" or k.startswith("pass_rate/")]
    labels = ["overall" if k == "pass_rate" else k.split("/", 1)[1] for k in keys]
    fig, ax = plt.subplots(figsize=(6, 3))
    width = 0.4 if baseline else 0.8
    xs = range(len(keys))
    ax.bar([x - (width / 2 if baseline else 0) for x in xs], [metrics[k] for k in keys], width, label="this checkpoint")
    if baseline:
        ax.bar([x + width / 2 for x in xs], [baseline.get(k, 0.0) for k in keys], width, label="registered")
        ax.legend(fontsize=8)
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass rate")
    ax.set_title(title, fontsize=9)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()
