"""The agentic eval: a checkpoint served with tools on held-out tasks, and its promotion gate.

    result = evaluate_checkpoint(checkpoint_dir, tasks, cache_root=..., settings=AgenticSettings())
    gate = agentic_gate(result, baseline, settings)     # no regression; promotion needs a gain whose CI is > 0

The candidate is served (``serving.ModelServer``: ``transformers serve`` on CPU, vLLM on a GPU
host) and the harness runs every held-out task through the chat-completions API with tools,
scoring the final answer strictly (``harness.scoring``). Results are stored per checkpoint data
version (``results/<version>.json``): the same checkpoint on the same tasks and settings is never
evaluated twice, and the role's registered version's results are its baseline. The gate compares
the candidate with that baseline on the same tasks (paired bootstrap of the per-task difference):
it fails when the gain's interval lies below 0 (a regression), and passes only when it lies above
``min_gain`` (0 by default: a real gain).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from training_assets.harness.client import chat_client
from training_assets.harness.runner import HarnessReport, run_tasks
from training_assets.harness.stats import bootstrap_ci, paired_gain_ci
from training_assets.harness.tasks import Task
from training_assets.serving.server import ModelServer, ServeSpec, servable_folder
from training_assets.storage import fingerprint, write_json_atomic

AGENTIC_VERSION = "agentic-1"
RESULTS_DIR = "results"
REPORT_FILE = "report.json"  # agentic_eval_report's decision, read by registry_entry


class AgenticSettings(BaseModel):
    """How the candidate is served and run on the held-out tasks, and what its gate asks."""

    model_config = ConfigDict(extra="forbid")

    max_tasks: int = Field(0, ge=0, description="Held-out tasks to run (the file's first N per family, round-robin); 0 = all.")
    max_turns: int = Field(3, ge=1, le=16, description="Assistant turns per attempt before it is scored a failure.")
    max_tokens: int = Field(96, ge=8, description="New tokens per assistant turn (>= 64 keeps 5-item list calls whole).")
    concurrency: int = Field(4, ge=1, le=64, description="Attempts in flight against a server that batches (vLLM, continuous "
                             "batching); a sequential server gets one at a time.")
    engine: str = Field("auto", description="Server engine: auto (vLLM on a GPU host when installed), transformers or vllm.")
    serve_dtype: str = Field("float32", description="transformers serve --dtype (float32 is the fast path on CPUs).")
    level: float = Field(0.95, gt=0.0, lt=1.0, description="Confidence level of the bootstrap intervals.")
    min_gain: float = Field(0.0, ge=0.0, le=1.0, description="Promotion: the gain's interval must lie above this.")
    require_gain: bool = Field(True, description="Promotion needs a significant gain (False: no significant regression is enough).")
    seed: int = Field(0, description="Bootstrap seed.")


class AgenticResult(BaseModel):
    """One checkpoint's held-out results: per task, per family and overall, with intervals."""

    label: str
    checkpoint_data_version: str
    settings_id: str
    per_task: dict[str, float]
    families: dict[str, dict[str, float]]
    overall: dict[str, float]
    n_tasks: int


def pick_tasks(tasks: list[Task], max_tasks: int) -> list[Task]:
    """The first ``max_tasks`` tasks taking families in turn (all when 0): every family stays represented."""
    if not max_tasks or max_tasks >= len(tasks):
        return list(tasks)
    by_family: dict[str, list[Task]] = {}
    for task in tasks:
        by_family.setdefault(task.family, []).append(task)
    picked: list[Task] = []
    queues = [list(v) for _, v in sorted(by_family.items())]
    while len(picked) < max_tasks and any(queues):
        for queue in queues:
            if queue and len(picked) < max_tasks:
                picked.append(queue.pop(0))
    return picked


def settings_id(tasks: list[Task], settings: AgenticSettings) -> str:
    """What makes two runs comparable: the tasks and the settings that change the score."""
    keep = settings.model_dump(include={"max_turns", "max_tokens"})
    return fingerprint([t.model_dump(mode="json") for t in tasks], keep, AGENTIC_VERSION)


def summarise(report: HarnessReport, label: str, version: str, sid: str, settings: AgenticSettings) -> AgenticResult:
    per_task = report.success_by_task()
    families: dict[str, dict[str, float]] = {}
    for family, rate in report.by_family.items():
        families[family] = {"n": rate.n, "rate": rate.rate, "low": rate.low, "high": rate.high}
    overall = bootstrap_ci(list(per_task.values()), level=settings.level, seed=settings.seed)
    return AgenticResult(label=label, checkpoint_data_version=version, settings_id=sid, per_task=per_task,
                         families=families, n_tasks=len(per_task),
                         overall={"rate": overall.estimate, "low": overall.low, "high": overall.high})


def results_path(report_dir: str | os.PathLike[str], version: str, sid: str) -> Path:
    return Path(report_dir) / RESULTS_DIR / f"{version}-{sid[:12]}.json"


def load_result(report_dir: str | os.PathLike[str], version: str, sid: str) -> AgenticResult | None:
    path = results_path(report_dir, version, sid)
    return AgenticResult.model_validate_json(path.read_text()) if path.is_file() else None


def evaluate_checkpoint(checkpoint_dir: str | os.PathLike[str], version: str, label: str, tasks: list[Task], *,
                        report_dir: str | os.PathLike[str], serve_cache: str | os.PathLike[str],
                        settings: AgenticSettings, log=print, generation: int = 0) -> tuple[AgenticResult, HarnessReport | None]:
    """Serve ``checkpoint_dir`` and run ``tasks``; reuses the stored result of the same version and setup."""
    sid = settings_id(tasks, settings)
    stored = load_result(report_dir, version, sid)
    if stored is not None:
        log(f"{label}: reusing its stored held-out results ({stored.overall['rate']:.3f})")
        return stored, None
    folder = servable_folder(checkpoint_dir, serve_cache)
    spec = ServeSpec(model_dir=str(folder), engine=settings.engine, dtype=settings.serve_dtype,
                     log_path=str(Path(report_dir) / "serve.log"))
    with ModelServer(spec) as server:
        log(f"{label}: served by {server.engine} at {server.base_url}; {len(tasks)} held-out tasks")
        client = chat_client(server.base_url, timeout_s=120.0)
        report = run_tasks(client, server.model, tasks, concurrency=server.in_flight(settings.concurrency),
                           generation=generation,
                           max_turns=settings.max_turns, max_tokens=settings.max_tokens)
    result = summarise(report, label, version, sid, settings)
    write_json_atomic(results_path(report_dir, version, sid), result.model_dump(mode="json"))
    return result, report


def agentic_gate(candidate: AgenticResult, baseline: AgenticResult | None, settings: AgenticSettings) -> dict[str, Any]:
    """Passed, with reasons: no regression against ``baseline`` and (``require_gain``) a gain whose
    interval lies above ``min_gain``. Without a baseline the candidate cannot show a gain: it fails
    when ``require_gain`` (evaluate the base first: the first baseline is the base model's)."""
    if baseline is None:
        passed = not settings.require_gain
        return {"passed": passed, "gain": None, "reasons": [
            "no baseline to compare with" + ("; a gain cannot be shown: evaluate the base model first" if not passed else "")]}
    if baseline.settings_id != candidate.settings_id:
        return {"passed": False, "gain": None, "reasons": [
            "the baseline was run on other tasks or settings; evaluate both on the same held-out setup"]}
    gain = paired_gain_ci(candidate.per_task, baseline.per_task, level=settings.level, seed=settings.seed)
    reasons = []
    regressed = gain.high < 0
    if regressed:
        reasons.append(f"regression: gain {gain.estimate:+.3f}, {settings.level:.0%} CI [{gain.low:+.3f}, {gain.high:+.3f}] "
                       f"lies below 0 against {baseline.label}")
    for family, stats in candidate.families.items():
        before = baseline.families.get(family)
        if before and stats["high"] < before["low"]:
            reasons.append(f"family {family} regressed: {stats['rate']:.3f} (CI high {stats['high']:.3f}) "
                           f"below {baseline.label}'s CI low {before['low']:.3f}")
    gained = gain.low > settings.min_gain
    if settings.require_gain and not gained:
        reasons.append(f"no significant gain: {gain.estimate:+.3f}, {settings.level:.0%} CI [{gain.low:+.3f}, {gain.high:+.3f}] "
                       f"does not lie above {settings.min_gain:+.3f}")
    passed = not reasons
    if passed:
        reasons.append(f"gain {gain.estimate:+.3f}, {settings.level:.0%} CI [{gain.low:+.3f}, {gain.high:+.3f}] over {baseline.label}")
    return {"passed": passed, "gain": {"estimate": gain.estimate, "low": gain.low, "high": gain.high}, "reasons": reasons}


def history(report_dir: str | os.PathLike[str], sid: str) -> list[AgenticResult]:
    """Every stored result of this setup, oldest first (the generations, for the plot)."""
    folder = Path(report_dir) / RESULTS_DIR
    found = [AgenticResult.model_validate_json(p.read_text()) for p in folder.glob("*.json")] if folder.is_dir() else []
    found = [r for r in found if r.settings_id == sid]
    order = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.json")} if folder.is_dir() else {}
    return sorted(found, key=lambda r: order.get(results_path(report_dir, r.checkpoint_data_version, sid).name, 0))


def success_plot_png(results: list[AgenticResult], title: str = "held-out success per generation") -> bytes:
    """Success rate (with its interval) per result, overall and per family."""
    import matplotlib  # ~0.5 s, only when a plot is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # matplotlib: after use("Agg"), only when a plot is drawn

    fig, ax = plt.subplots(figsize=(6, 3.4))
    xs = list(range(len(results)))
    series = {"overall": [r.overall for r in results]}
    for family in sorted({f for r in results for f in r.families}):
        series[family] = [r.families.get(family, {"rate": float("nan"), "low": float("nan"), "high": float("nan")})
                          for r in results]
    for name, points in series.items():
        rates = [p["rate"] for p in points]
        errors = [[p["rate"] - p["low"] for p in points], [p["high"] - p["rate"] for p in points]]
        ax.errorbar(xs, rates, yerr=errors, marker="o", capsize=3, label=name, linewidth=2 if name == "overall" else 1)
    ax.set_xticks(xs, [r.label for r in results], rotation=20, fontsize=7)
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("success rate")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def report_verdict(report_file: str | os.PathLike[str], data_version: str) -> tuple[bool, str]:
    """May the checkpoint of ``data_version`` be registered, by its agentic report? (ok, reason)."""
    path = Path(report_file)
    if not path.is_file():
        return False, f"{path} not found: materialise agentic_eval_report first"
    report = json.loads(path.read_text())
    if report.get("checkpoint_data_version") != data_version:
        return False, (f"the agentic eval report is for {report.get('checkpoint_data_version')} but the candidate is "
                       f"{data_version}: re-materialise agentic_eval_report")
    gate = report.get("gate") or {}
    if not gate.get("passed"):
        return False, "the agentic gate failed: " + "; ".join(gate.get("reasons", ["no decision"]))
    return True, "; ".join(gate.get("reasons", []))
