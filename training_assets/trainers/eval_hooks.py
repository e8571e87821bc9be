"""Evaluation of checkpoints: a reliability suite over eval cases, and lm-eval benchmarks offline.

    from training_assets.trainers.eval_hooks import evaluate_checkpoint, evaluate_benchmarks, load_cases
    report = evaluate_checkpoint("data/merged_adapter", load_cases())   # manifest dir, HF dir or PEFT dir
    bench = evaluate_benchmarks("data/merged_adapter")                  # the shipped held-out tasks

Eval cases are JSONL, one case a line::

    {"id": "arith-0000", "category": "answer", "prompt": "What is 2 * 3?",
     "checks": [{"type": "contains", "value": "6"}]}

``prompt`` is a string (one user turn) or a list of OpenAI chat messages. A case passes when
every check passes. Check types (each scored by a plain function ``(output, **spec) -> (passed,
reason)``): ``exact``, ``contains``, ``regex``, ``tool_call`` (a JSON tool call, optionally with
a given ``name`` and ``required_args``), ``refuse`` (the answer declines) and ``not_contains``.

This module is the public entry point; the code lives in ``training_assets.evaluation``, one
module per seam: ``scorers`` (check functions), ``cases`` (case schema and loading), ``loading``
(checkpoint resolution and model loading), ``suite`` (answers, per-case results, pass rates),
``benchmarks`` (lm-eval offline), ``gates`` (gate metrics and decision) and ``report`` (the
stored report per checkpoint and its chart).
"""

from __future__ import annotations

from training_assets.evaluation.benchmarks import (DEFAULT_BENCHMARKS, evaluate_benchmarks, lm_eval_available,
                                                   shipped_task_config, uniform_bits_per_byte)
from training_assets.evaluation.cases import (DEFAULT_CASES, EVAL_TASKS_DIR, EvalCase, cases_from_held_out,
                                              load_cases, parse_case)
from training_assets.evaluation.gates import GateDecision, GateThresholds, decide_gate, gate_metrics
from training_assets.evaluation.loading import CheckpointDirs, load_model, resolve_checkpoint
from training_assets.evaluation.report import (EVAL_VERSION, REPORT_FILE, eval_chart_png, eval_config_id,
                                               load_eval_report, run_eval_report, write_eval_report)
from training_assets.evaluation.scorers import (REFUSAL_PATTERN, SCORERS, Verdict, find_tool_call, score_contains,
                                                score_exact, score_not_contains, score_refuse, score_regex,
                                                score_tool_call)
from training_assets.evaluation.suite import (CaseResult, EvalReport, evaluate_checkpoint, generate_answers,
                                              score_case, summarize)

__all__ = [
    "DEFAULT_BENCHMARKS", "DEFAULT_CASES", "EVAL_TASKS_DIR", "EVAL_VERSION", "REFUSAL_PATTERN", "REPORT_FILE", "SCORERS",
    "CaseResult", "CheckpointDirs", "EvalCase", "EvalReport", "GateDecision", "GateThresholds", "Verdict",
    "cases_from_held_out", "decide_gate", "eval_chart_png", "eval_config_id", "evaluate_benchmarks",
    "evaluate_checkpoint", "find_tool_call", "gate_metrics", "generate_answers", "lm_eval_available", "load_cases",
    "load_eval_report", "load_model", "parse_case", "resolve_checkpoint", "run_eval_report", "score_case",
    "score_contains", "score_exact", "score_not_contains", "score_refuse", "score_regex", "score_tool_call",
    "shipped_task_config", "summarize", "uniform_bits_per_byte", "write_eval_report",
]
