"""End-to-end pipelines from the seed: data → plan → train → save → eval → register.

    report = run_sft_pipeline(
        TrainConfig(base_model=..., output_dir=..., epochs=1, batch_size=8, lr=2e-4, lora=LoraSpec(r=16, alpha=32)),
        traces=traces, eval_cases=cases, registry=registry,
        deploy=DeploymentTarget(role="generator", ...), checkpoint_id="sft-v1")

Each returns a ``PipelineReport`` with the sections ``data`` (examples built and skipped, with
reasons), ``plan``, ``train`` (losses, tokens/s, peak memory), ``checkpoint`` (the manifest,
also written as ``<output_dir>/manifest.json`` so evaluation and registration can resolve the
checkpoint, its base and its tokenizer), ``eval`` and ``deployment`` (None when not asked for).
A model and a tokenizer can be injected (tests, notebooks); evaluation and registration come
from ``trainers.eval_hooks`` and ``registry``. ``DeploymentTarget`` is re-exported from there.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

from training_assets.storage import fingerprint, sha256_tree, write_json_atomic
from training_assets.trainers import TrainConfig, get_trainer
from training_assets.trainers.base import TrainResult


@dataclass
class PipelineReport:
    data: dict[str, Any]
    plan: dict[str, Any]
    train: dict[str, Any]
    checkpoint: dict[str, Any]
    eval: dict[str, Any] | None
    deployment: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def __getattr__(name: str) -> Any:
    # Re-export without importing the registry (and MLflow) on every import of this module.
    if name == "DeploymentTarget":
        from training_assets.registry import DeploymentTarget

        return DeploymentTarget
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _plain(obj: Any) -> Any:
    if obj is None or isinstance(obj, dict):
        return obj
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if is_dataclass(obj):
        return asdict(obj)
    return {"value": str(obj)}


def write_run_manifest(result: TrainResult, config: TrainConfig, asset: str, data_versions: dict[str, str]) -> dict[str, Any]:
    """The checkpoint manifest (GRAPH.md contract) for a pipeline run, at ``<output_dir>/manifest.json``."""
    manifest = {"asset": asset, "kind": "adapter" if result.adapter else "full", "checkpoint_dir": result.checkpoint_dir,
                "base_model_dir": result.base_model_dir if result.adapter else None, "tokenizer_dir": result.tokenizer_dir,
                "train": result.train_summary(), "plan": result.plan.to_dict(), "mlflow_run_id": result.mlflow_run_id,
                "dagster_run_id": None, "data_versions": data_versions, "config": config.to_dict(),
                "data_version": fingerprint(sha256_tree(result.checkpoint_dir), data_versions)}
    write_json_atomic(Path(config.output_dir) / "manifest.json", manifest)
    return manifest


def _evaluate_and_register(config: TrainConfig, eval_cases: Any, registry: Any, deploy: Any,
                           checkpoint_id: str | None) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    evaluation = deployment = None
    if eval_cases is not None:
        from training_assets.trainers.eval_hooks import evaluate_checkpoint

        evaluation = _plain(evaluate_checkpoint(config.output_dir, eval_cases))
    if registry is not None:
        if deploy is None or checkpoint_id is None:
            raise ValueError("registering needs deploy=DeploymentTarget(...) and checkpoint_id=")
        from training_assets.registry import register_checkpoint

        deployment = _plain(register_checkpoint(registry, config.output_dir, deploy, checkpoint_id))
    return evaluation, deployment


def run_sft_pipeline(config: TrainConfig, *, traces: Iterable[Any] | None = None,
                     examples: Sequence[dict[str, Any]] | None = None, eval_cases: Any = None, registry: Any = None,
                     deploy: Any = None, checkpoint_id: str | None = None, model: Any = None,
                     tokenizer: Any = None) -> PipelineReport:
    """Traces (or ready SFT examples) → plan → SFT → manifest → eval → register."""
    trainer = get_trainer("sft", config, model=model, tokenizer=tokenizer)
    tok = trainer.load_tokenizer()
    skipped: list[Any] = []
    if examples is None:
        if traces is None:
            raise ValueError("run_sft_pipeline needs traces= or examples=")
        from training_assets.training_data import build_sft_examples

        built = build_sft_examples(list(traces), tok, max_tokens=config.max_seq_len)
        examples, skipped = built.rows, list(built.skipped)
    examples = list(examples)
    if not examples:
        raise ValueError(f"no SFT examples from the traces (skipped: {skipped[:5]}); "
                         "SFT needs successful traces with assistant turns")
    data = {"examples": len(examples), "skipped": len(skipped), "skipped_examples": [list(s) for s in skipped[:20]],
            "version": fingerprint([e.get("id") for e in examples], [e.get("n_tokens") for e in examples])}
    return _train_evaluate_register(trainer, examples, data, config, "sft_checkpoint", {"sft_examples": data["version"]},
                                    eval_cases, registry, deploy, checkpoint_id)


def run_pretrain_pipeline(config: TrainConfig, *, texts: Iterable[str] | None = None, root: str | None = None,
                          eval_cases: Any = None, registry: Any = None, deploy: Any = None,
                          checkpoint_id: str | None = None, model: Any = None, tokenizer: Any = None) -> PipelineReport:
    """Corpus texts (or the curated corpus under ``root``) → packed windows → pretrain → manifest → eval → register."""
    from training_assets.training_data import pack_sequences

    trainer = get_trainer("pretrain", config, model=model, tokenizer=tokenizer)
    tok = trainer.load_tokenizer()
    if texts is None:
        from training_assets.data_engine import load_curated_corpus

        texts = load_curated_corpus(root).column("text").to_pylist()
    docs = [tok(t, add_special_tokens=False)["input_ids"] for t in texts if t]
    if not docs:
        raise ValueError("run_pretrain_pipeline: no non-empty texts to pretrain on")
    packed = pack_sequences(docs, config.max_seq_len, tok.eos_token_id, tok.pad_token_id or 0)
    windows = [dict(zip(packed.columns(), row)) for row in zip(*(a.tolist() for a in packed.columns().values()))]
    data = {"documents": packed.n_docs, "windows": packed.n_windows, "tokens": packed.n_tokens,
            "version": fingerprint(json.dumps(docs))}
    return _train_evaluate_register(trainer, windows, data, config, "base_checkpoint", {"corpus": data["version"]},
                                    eval_cases, registry, deploy, checkpoint_id)


def _train_evaluate_register(trainer: Any, examples: list, data: dict[str, Any], config: TrainConfig, asset: str,
                             data_versions: dict[str, str], eval_cases: Any, registry: Any, deploy: Any,
                             checkpoint_id: str | None) -> PipelineReport:
    """The shared tail of every pipeline: plan → train → manifest → eval → register → report."""
    plan = trainer.plan(examples)
    result = trainer.train(examples)
    manifest = write_run_manifest(result, config, asset, data_versions)
    evaluation, deployment = _evaluate_and_register(config, eval_cases, registry, deploy, checkpoint_id)
    return PipelineReport(data=data, plan=plan.to_dict(), train=result.train_summary(), checkpoint=manifest,
                          eval=evaluation, deployment=deployment)
