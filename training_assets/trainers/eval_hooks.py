"""The seed's evaluation names; the evaluation itself is the ``training_assets.evaluation`` package.

    from training_assets.trainers.eval_hooks import evaluate_checkpoint, evaluate_benchmarks
"""

from training_assets.evaluation import evaluate_benchmarks, evaluate_checkpoint

__all__ = ["evaluate_benchmarks", "evaluate_checkpoint"]
