"""End-to-end pipelines from the seed: data → plan → train → save → eval → register.

    report = run_sft_pipeline(
        TrainConfig(base_model=..., output_dir=..., epochs=1, batch_size=8, lr=2e-4, lora=LoraSpec(r=16, alpha=32)),
        traces=traces, eval_cases=cases, registry=registry,
        deploy=DeploymentTarget(role="generator", served_model_name="...", base_url="http://localhost:8000/v1"),
        checkpoint_id="sft-v1")
    report = run_pretrain_pipeline(TrainConfig(output_dir=...), corpus=records, spec=PretrainSpec(...),
                                   train_tokenizer_first=True)

Each returns a ``PipelineReport`` (attributes, or a mapping) with the sections ``data`` (examples
built and skipped, with reasons), ``plan``, ``train`` (losses, tokens/s, peak memory),
``checkpoint`` (the manifest, written to ``<output_dir>/manifest.json`` so evaluation and
registration resolve the checkpoint, its base and its tokenizer), ``eval`` and ``deployment``
(None when not asked for). Training goes through ``trainers.jobs.run_training`` like the assets
and the CLI; a model and a tokenizer can be injected (tests, notebooks). Registration is
idempotent on ``checkpoint_id``: a second call returns the version the first one registered.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training_assets.checkpoint_loading import load_tokenizer_dir
from training_assets.deploy import DeploymentTarget  # noqa: F401  (re-exported: callers build one to register)
from training_assets.evaluation import evaluate_checkpoint
from training_assets.registry import register_checkpoint
from training_assets.storage import fingerprint
from training_assets.tokenizer_trainer import train_tokenizer
from training_assets.training_data import build_sft_examples, pack_sequences
from training_assets.trainers import TrainConfig
from training_assets.trainers.config import PretrainSpec
from training_assets.trainers.jobs import in_memory_job, run_training
from training_assets.trainers.plan import FieldsMapping


@dataclass
class PipelineReport(FieldsMapping):
    data: dict[str, Any]
    plan: dict[str, Any]
    train: dict[str, Any]
    checkpoint: dict[str, Any]
    eval: dict[str, Any] | None
    deployment: dict[str, Any] | None


def run_sft_pipeline(config: TrainConfig, *, traces: Iterable[Any] | None = None,
                     examples: Sequence[dict[str, Any]] | None = None, eval_cases: Any = None, registry: Any = None,
                     deploy: Any = None, checkpoint_id: str | None = None, model: Any = None,
                     tokenizer: Any = None) -> PipelineReport:
    """Traces (trace dicts or ``Trace`` objects) or ready SFT examples → plan → SFT → manifest → eval → register."""
    skipped: list[Any] = []
    tokenizer = tokenizer or _tokenizer_of(config)
    if examples is None:
        if traces is None:
            raise ValueError("run_sft_pipeline needs traces= or examples=")
        built = build_sft_examples(list(traces), tokenizer, max_tokens=config.max_seq_len)
        examples, skipped = built.rows, list(built.skipped)
    examples = list(examples)
    if not examples:
        raise ValueError(f"no SFT examples from the traces (skipped: {skipped[:5]}); "
                         "SFT needs successful traces with assistant turns")
    data = {"examples": len(examples), "skipped": len(skipped), "skipped_examples": [list(s) for s in skipped[:20]],
            "version": fingerprint([e.get("id") for e in examples], [e.get("n_tokens") for e in examples])}
    return _train_evaluate_register("sft", "sft_checkpoint", config, examples, data, {"sft_examples": data["version"]},
                                    model, tokenizer, eval_cases, registry, deploy, checkpoint_id)


def run_pretrain_pipeline(config: TrainConfig, *, corpus: Iterable[Mapping[str, Any] | str] | None = None,
                          spec: PretrainSpec | None = None, train_tokenizer_first: bool = False,
                          tokenizer_vocab_size: int = 2048, root: str | None = None, eval_cases: Any = None,
                          registry: Any = None, deploy: Any = None, checkpoint_id: str | None = None, model: Any = None,
                          tokenizer: Any = None) -> PipelineReport:
    """Corpus records (``{"text": ...}`` or strings; default: the curated corpus under ``root``) → packed
    windows → pretrain a random-init ``spec`` model → manifest → eval → register.

    ``train_tokenizer_first``: train a byte-level BPE tokenizer (``tokenizer_trainer``) on the corpus
    and save it as ``<output_dir>/tokenizer`` before packing; otherwise the configured or injected
    tokenizer is used.
    """
    if corpus is None:
        from training_assets.data_engine import load_curated_corpus  # numba: ~1 s, only when no corpus is passed

        corpus = load_curated_corpus(root).column("text").to_pylist()
    texts = [r if isinstance(r, str) else str(r["text"]) for r in corpus]
    texts = [t for t in texts if t]
    if not texts:
        raise ValueError("run_pretrain_pipeline: no non-empty texts in the corpus to pretrain on")
    if spec is not None:
        config = config.with_(pretrain=spec)
    versions: dict[str, str] = {}
    if train_tokenizer_first:
        folder = Path(config.output_dir) / "tokenizer"
        train_tokenizer(texts, vocab_size=tokenizer_vocab_size).save_pretrained(str(folder))
        tokenizer, config = load_tokenizer_dir(folder), config.with_(tokenizer=str(folder.resolve()))
        versions["tokenizer"] = fingerprint(folder.joinpath("tokenizer.json").read_text(encoding="utf-8"))
    tok = tokenizer or _tokenizer_of(config)
    if tok is None:
        raise ValueError("run_pretrain_pipeline: no tokenizer; pass train_tokenizer_first=True, tokenizer=, "
                         "or TrainConfig(tokenizer=<dir>)")
    docs = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    packed = pack_sequences(docs, config.max_seq_len, tok.eos_token_id, tok.pad_token_id or 0)
    windows = [dict(zip(packed.columns(), row)) for row in zip(*(a.tolist() for a in packed.columns().values()))]
    data = {"documents": packed.n_docs, "windows": packed.n_windows, "tokens": packed.n_tokens,
            "version": fingerprint(json.dumps(docs))}
    versions["corpus"] = data["version"]
    return _train_evaluate_register("pretrain", "base_checkpoint", config, windows, data, versions, model, tok,
                                    eval_cases, registry, deploy, checkpoint_id)


def _tokenizer_of(config: TrainConfig) -> Any:
    source = config.tokenizer or config.base_model
    if source is None:
        return None
    return load_tokenizer_dir(source)


def _train_evaluate_register(kind: str, asset: str, config: TrainConfig, rows: list[dict[str, Any]], data: dict[str, Any],
                             data_versions: dict[str, str], model: Any, tokenizer: Any, eval_cases: Any, registry: Any,
                             deploy: Any, checkpoint_id: str | None) -> PipelineReport:
    """The shared tail of every pipeline: plan → train → manifest (``run_training``) → eval → register → report."""
    if registry is not None and (deploy is None or checkpoint_id is None):
        raise ValueError("registering needs deploy=DeploymentTarget(...) and checkpoint_id=")
    run = run_training(in_memory_job(asset, kind, config, data_versions), rows=rows, model=model, tokenizer=tokenizer)
    evaluation = deployment = None
    if eval_cases is not None:
        evaluation = evaluate_checkpoint(config.output_dir, eval_cases).to_dict()
    if registry is not None:
        deployment = register_checkpoint(registry, config.output_dir, deploy, checkpoint_id).to_dict()
    return PipelineReport(data=data, plan=run.plan.to_dict(), train=run.manifest.train.model_dump(),
                          checkpoint=run.manifest.to_dict(), eval=evaluation, deployment=deployment)
