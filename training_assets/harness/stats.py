"""Bootstrap confidence intervals for success rates, deterministic given the seed (numpy only).

    bootstrap_ci([1, 0, 1, 1])                       # Interval(estimate=0.75, low=..., high=...)
    paired_gain_ci({"t1": 1, "t2": 1}, {"t1": 0, "t2": 1})   # the candidate's gain on the same tasks

Percentile bootstrap (Efron & Tibshirani, *An Introduction to the Bootstrap*, ch. 13): resample the
values with replacement ``resamples`` times, take the mean of each resample, and read the interval
off the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of those means. The paired version
resamples *tasks*: each task's difference ``candidate - baseline`` is kept together, so the
interval reflects the gain on these tasks, not two independent samples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np


class Interval(NamedTuple):
    estimate: float  # the mean of the values
    low: float
    high: float


def bootstrap_ci(values: Sequence[float], *, level: float = 0.95, resamples: int = 2000, seed: int = 0) -> Interval:
    """The mean of ``values`` and its percentile-bootstrap interval at ``level``."""
    data = np.asarray(values, dtype=np.float64)
    if data.ndim != 1 or data.size == 0:
        raise ValueError(f"bootstrap_ci needs a non-empty list of numbers, got {data.size} value(s); "
                         "score at least one attempt first")
    if not 0.0 < level < 1.0 or resamples < 1:
        raise ValueError(f"level must be in (0, 1) and resamples >= 1, got level={level}, resamples={resamples}")
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(resamples, data.size))].mean(axis=1)  # (resamples,)
    low, high = np.quantile(means, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return Interval(float(data.mean()), float(low), float(high))


def paired_gain_ci(candidate: Mapping[str, float] | Sequence[float], baseline: Mapping[str, float] | Sequence[float],
                   *, level: float = 0.95, resamples: int = 2000, seed: int = 0) -> Interval:
    """The candidate's mean gain over the baseline on the same tasks, with its paired-bootstrap interval.

    Mappings (task id -> success rate) are aligned by task id and must hold the same tasks;
    sequences are aligned by position and must have the same length.
    """
    if isinstance(candidate, Mapping) and isinstance(baseline, Mapping):
        missing = sorted(set(candidate) ^ set(baseline))
        if missing:
            raise ValueError(f"paired_gain_ci compares the same tasks; {len(missing)} task(s) are scored on one side "
                             f"only, e.g. {missing[:3]}: score both on the same task set")
        keys = sorted(candidate)
        cand, base = [candidate[k] for k in keys], [baseline[k] for k in keys]
    elif isinstance(candidate, Mapping) or isinstance(baseline, Mapping):
        raise ValueError("paired_gain_ci takes two mappings (task id -> score) or two sequences, not one of each")
    else:
        cand, base = list(candidate), list(baseline)
        if len(cand) != len(base):
            raise ValueError(f"paired_gain_ci compares the same tasks; got {len(cand)} and {len(base)} scores")
    differences = np.asarray(cand, dtype=np.float64) - np.asarray(base, dtype=np.float64)  # (tasks,)
    return bootstrap_ci(differences, level=level, resamples=resamples, seed=seed)
