"""Gates: the flat metrics a checkpoint is judged on, and the pass/fail decision with its reasons.

    metrics = gate_metrics(report, benchmarks)
    decision = decide_gate(metrics, GateThresholds(min_pass_rate=0.8), baseline=registered_metrics, baseline_name="v3")
    decision.passed, decision.reasons   # every failed condition, or what was checked when it passed
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from training_assets.evaluation.settings import GateThresholds
from training_assets.evaluation.suite import EvalReport


@dataclass(frozen=True)
class GateDecision:
    passed: bool
    reasons: tuple[str, ...]  # every failed condition; or what was checked when it passed
    compared_to: str | None = None


def gate_metrics(report: EvalReport, benchmarks: Mapping[str, Any] | None = None) -> dict[str, float]:
    """The flat metrics a gate compares, higher-is-better except ``*bits_per_byte`` / ``*perplexity``."""
    metrics = {"pass_rate": report.pass_rate}
    metrics.update({f"pass_rate/{k}": v["pass_rate"] for k, v in report.by_category.items()})
    for task, values in (benchmarks or {}).get("tasks", {}).items():
        for name in ("acc", "acc_norm", "bits_per_byte", "word_perplexity"):
            if name in values and math.isfinite(values[name]):
                metrics[f"{task}/{name}"] = values[name]
        if values.get("uniform_bits_per_byte") and math.isfinite(values.get("bits_per_byte", math.inf)):
            metrics[f"{task}/bpb_vs_uniform"] = values["bits_per_byte"] / values["uniform_bits_per_byte"]
    return metrics


def _lower_is_better(metric: str) -> bool:
    return metric.endswith(("bits_per_byte", "perplexity", "bpb_vs_uniform"))


def decide_gate(metrics: Mapping[str, float], thresholds: GateThresholds,
                baseline: Mapping[str, float] | None = None, baseline_name: str | None = None) -> GateDecision:
    """Pass when every threshold holds and no metric is worse than ``baseline`` by more than ``max_regression``.

    The baseline is the eval summary of the model currently registered for the role (none on the
    first registration). Regressions are absolute for rates and relative (ratio - 1) for
    bits-per-byte / perplexity; only metrics both sides measured are compared.
    """
    failures, checked = [], []
    rate = metrics.get("pass_rate", 0.0)
    (failures if rate < thresholds.min_pass_rate else checked).append(
        f"pass_rate {rate:.3f} {'<' if rate < thresholds.min_pass_rate else '>='} min {thresholds.min_pass_rate:.3f}")
    for category, minimum in sorted(thresholds.min_category_pass_rate.items()):
        value = metrics.get(f"pass_rate/{category}")
        if value is None:
            failures.append(f"category {category!r} has no cases in this eval (threshold {minimum})")
        elif value < minimum:
            failures.append(f"pass_rate/{category} {value:.3f} < min {minimum:.3f}")
        else:
            checked.append(f"pass_rate/{category} {value:.3f} >= {minimum:.3f}")
    perplexity_ceilings = (  # (threshold name, metric suffix, note on the scale)
        ("max_bits_per_byte", "bits_per_byte", ""),
        ("max_bpb_vs_uniform", "bpb_vs_uniform", " (1.0 = a uniform guess over the vocabulary)"),
    )
    for name, suffix, note in perplexity_ceilings:
        ceiling = getattr(thresholds, name)
        if ceiling is None:
            continue
        measured = {k: v for k, v in metrics.items() if k.endswith(suffix)}
        if not measured:
            failures.append(f"{name} is set but no perplexity task ran (is lm-eval installed?)")
        for key, value in sorted(measured.items()):
            (failures if value > ceiling else checked).append(
                f"{key} {value:.3f} {'>' if value > ceiling else '<='} max {ceiling}{note}")
    compared = set(thresholds.regression_metrics) if thresholds.regression_metrics is not None else None
    for key, old in sorted((baseline or {}).items()):
        new = metrics.get(key)
        if new is None or not isinstance(old, (int, float)) or (compared is not None and key not in compared):
            continue
        if _lower_is_better(key):
            worse = (new / old - 1.0) if old > 0 else 0.0
        else:
            worse = old - new
        if worse > thresholds.max_regression + 1e-12:
            failures.append(f"{key} {new:.4f} is worse than registered {baseline_name or 'model'} ({old:.4f}) "
                            f"by {worse:.4f} > allowed {thresholds.max_regression}")
        else:
            checked.append(f"{key} {new:.4f} no worse than registered ({old:.4f})")
    return GateDecision(not failures, tuple(failures or checked), baseline_name)

