"""Evaluation of checkpoints: the reliability suite, lm-eval benchmarks offline, gates and stored reports.

    from training_assets.evaluation import evaluate_checkpoint, evaluate_benchmarks, load_cases
    report = evaluate_checkpoint("data/merged_adapter", load_cases())   # manifest dir, HF dir or PEFT dir
    bench = evaluate_benchmarks("data/merged_adapter")                  # the shipped held-out tasks

Eval cases are JSONL, one case a line::

    {"id": "arith-0000", "category": "answer", "prompt": "What is 2 * 3?",
     "checks": [{"type": "contains", "value": "6"}]}

``prompt`` is a string (one user turn) or a list of OpenAI chat messages. A case passes when
every check passes. Check types (each scored by a plain function ``(output, **spec) -> (passed,
reason)``): ``exact``, ``contains``, ``regex``, ``tool_call`` (a JSON tool call, optionally with
a given ``name`` and ``required_args``), ``refuse`` (the answer declines) and ``not_contains``.

This package is the entry point (``trainers.eval_hooks`` keeps the seed's two names); one module
per seam:

- ``scorers``: plain check functions and the ``SCORERS`` table.
- ``cases``: the eval case schema, JSONL loading and validation, held-out tasks as cases.
- ``suite``: the reliability suite: greedy answers per case, per-case results, pass rates per category.
- ``benchmarks``: EleutherAI lm-eval on the shipped task YAMLs, offline.
- ``device``: where and in what dtype a checkpoint is evaluated (auto: CUDA + bf16 with a GPU, else CPU fp32).
- ``settings``: ``EvalSettings`` and ``GateThresholds``, declared once (the eval assets' run config and
  the ``evaluate`` options derive from them).
- ``gates``: the flat gate metrics and the pass/fail decision with its reasons.
- ``report``: one stored, JSON-able report per checkpoint (suite + benchmarks + gate) and its chart.

Checkpoints are resolved and loaded by ``training_assets.checkpoint_loading``, which sits below
both this package and the trainers: evaluation imports nothing from ``training_assets.trainers``
(the trainers' ``eval_hooks`` import evaluation, not the other way; ``tests/trainers/test_layers.py``).
Nothing heavy is imported here: torch, transformers, lm-eval and matplotlib (the ``train`` and
``eval`` extras) are imported by the functions that need them.
"""

from __future__ import annotations

from training_assets.evaluation.benchmarks import (DEFAULT_BENCHMARKS, evaluate_benchmarks, lm_eval_available,
                                                   shipped_task_config, uniform_bits_per_byte)
from training_assets.evaluation.cases import (DEFAULT_CASES, EVAL_TASKS_DIR, EvalCase, cases_from_held_out,
                                              load_cases, parse_case)
from training_assets.evaluation.device import Placement, resolve_device
from training_assets.evaluation.gates import GateDecision, GateThresholds, decide_gate, gate_metrics
from training_assets.evaluation.report import (EVAL_VERSION, REPORT_FILE, eval_chart_png, eval_config_id,
                                               load_eval_report, run_eval_report, write_eval_report)
from training_assets.evaluation.scorers import SCORERS
from training_assets.evaluation.settings import EvalSettings
from training_assets.evaluation.suite import (CaseResult, EvalReport, evaluate_checkpoint, generate_answers,
                                              score_case, summarize)

__all__ = [
    "DEFAULT_BENCHMARKS", "DEFAULT_CASES", "EVAL_TASKS_DIR", "EVAL_VERSION", "REPORT_FILE", "SCORERS", "CaseResult",
    "EvalCase", "EvalReport", "EvalSettings", "GateDecision", "Placement", "GateThresholds", "cases_from_held_out", "decide_gate", "eval_chart_png",
    "eval_config_id", "evaluate_benchmarks", "evaluate_checkpoint", "gate_metrics", "generate_answers",
    "lm_eval_available", "load_cases", "load_eval_report", "parse_case", "resolve_device", "run_eval_report", "score_case",
    "shipped_task_config", "summarize", "uniform_bits_per_byte", "write_eval_report",
]
