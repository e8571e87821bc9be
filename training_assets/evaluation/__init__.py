"""Checkpoint evaluation, one module per seam; ``training_assets.trainers.eval_hooks`` is the public entry.

- ``scorers``: plain check functions ``(output, **spec) -> (passed, reason)`` and the ``SCORERS`` table.
- ``cases``: the eval case schema, JSONL loading and validation, held-out tasks as cases.
- ``loading``: where a checkpoint's weights, base and tokenizer live; loading it for evaluation.
- ``suite``: the reliability suite: greedy answers per case, per-case results, pass rates per category.
- ``benchmarks``: EleutherAI lm-eval on the shipped task YAMLs, offline.
- ``gates``: the flat gate metrics and the pass/fail decision with its reasons.
- ``report``: one stored, JSON-able report per checkpoint (suite + benchmarks + gate) and its chart.

This package imports nothing heavy at import time: torch, transformers, lm-eval and matplotlib
are imported by the functions that need them.
"""
