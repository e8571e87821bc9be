"""The trainers' shared shape: ``TrainerBase`` (plan → prepare → collate → loss inside ``run_loop``) and ``TrainResult``.

The configuration lives in ``trainers.config`` and the pure plan in ``trainers.plan``; the
trainers (``pretrain``, ``sft``, ``dpo``, ``grpo``) subclass ``TrainerBase`` in their own modules
and share ``trainers.loop.run_loop``. ``plan`` and ``train`` return mappings (the seed's
examples read ``{planned_steps, effective_batch, ...}`` and ``{steps, losses, final_loss, ...}``)
that keep attribute access (``result.loop.losses``).

Layers (``A ← B``: B imports A, never the reverse; ``tests/trainers/test_layers.py``): config, plan
← checkpoints, modeling ← loop ← base ← the kind trainers. ``modeling`` imports torch, so ``train``
imports it when it runs: importing this module, and planning, stay torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from training_assets import tracking
from training_assets.checkpoint_loading import load_tokenizer_dir
from training_assets.dataset_rows import DatasetRows
from training_assets.launch import check_launched
from training_assets.trainers import checkpoints
from training_assets.trainers.config import TrainConfig
from training_assets.trainers.loop import LoopResult, run_loop
from training_assets.trainers.plan import FieldsMapping, Plan, make_plan, tokenizer_vocab_size

__all__ = ["Examples", "LazyRows", "TrainResult", "TrainerBase", "as_examples"]
Examples = Sequence[dict[str, Any]] | DatasetRows  # a list of dicts, or a memory-mapped dataset


class LazyRows:
    """Training rows prepared on demand: ``take(indices)`` reads and prepares only those rows.

    What ``prepare`` returns for a ``DatasetRows`` source when every row prepares on its own (SFT,
    pretraining): the loop then holds one micro-batch of the dataset at a time, and a resumed run
    starts at its saved position without touching the rows before it.
    """

    def __init__(self, n_rows: int, make: Callable[[Sequence[int]], list[dict[str, Any]]]) -> None:
        self.n_rows, self.make = n_rows, make

    def __len__(self) -> int:
        return self.n_rows

    def take(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        return self.make(indices)


def as_examples(examples: Iterable[dict[str, Any]] | DatasetRows) -> Examples:
    """A ``DatasetRows`` as it is (never materialised); anything else as a list."""
    return examples if isinstance(examples, DatasetRows) else list(examples)


@dataclass(eq=False)
class TrainResult(FieldsMapping):
    """What ``trainer.train`` produced: the plan, the loop's numbers, where the model is and the tracker run.

    As a mapping it is the flat, JSON-able record of the run (``steps``, ``losses``, ``final_loss``,
    ``tokens_per_s``, ``checkpoint_dir``, ``plan``, ...) that a training subprocess reports back and
    ``checkpoint_manifest`` turns into the checkpoint manifest.
    """

    kind: str
    plan: Plan
    loop: LoopResult
    checkpoint_dir: str  # HF dir (full model) or PEFT adapter dir
    adapter: bool
    base_model_dir: str | None
    tokenizer_dir: str
    tracker: str = "none"
    tracker_run_id: str | None = None
    tracking_uri: str | None = None  # the MLflow store, or the wandb run directory
    world_size: int = 1
    extra: dict[str, Any] = field(default_factory=dict)  # trainer-specific: skipped rows, mean rewards

    def to_dict(self) -> dict[str, Any]:
        lp = self.loop
        return {"kind": self.kind, "steps": lp.steps, "losses": list(lp.losses), "final_loss": lp.final_loss,
                "tokens": lp.tokens, "tokens_per_s": round(lp.tokens_per_s, 1), "wall_s": round(lp.wall_s, 3),
                "peak_rss_mb": round(lp.peak_rss_mb, 1), "peak_gpu_mb": lp.peak_gpu_mb, "resumed_from": lp.resumed_from,
                "lrs": list(lp.lrs), "plan": self.plan.to_dict(), "checkpoint_dir": self.checkpoint_dir,
                "adapter": self.adapter, "base_model_dir": self.base_model_dir, "tokenizer_dir": self.tokenizer_dir,
                "tracker": self.tracker, "tracker_run_id": self.tracker_run_id, "tracking_uri": self.tracking_uri,
                "world_size": self.world_size, **self.extra}


class TrainerBase:
    """Shared shape of the trainers: ``plan`` (pure), ``prepare`` → ``collate`` → ``loss`` inside ``run_loop``.

    Subclasses set ``kind`` and implement ``example_tokens`` (for the plan), ``prepare`` (tokenise
    once), ``collate`` (rows → tensors) and ``loss`` (→ mean loss, weight). ``model`` and
    ``tokenizer`` may be injected (tests, pipelines); otherwise they come from the config.
    """

    kind = "base"
    sequences_per_example = 1

    def __init__(self, config: TrainConfig, model: Any = None, tokenizer: Any = None, accelerator: Any = None,
                 callbacks: tuple[Any, ...] = ()) -> None:
        self.config, self.model, self.tokenizer, self.accelerator, self.callbacks = config, model, tokenizer, accelerator, callbacks

    # -- planning (no torch)
    def example_tokens(self, example: dict[str, Any]) -> int:
        raise NotImplementedError

    def vocab_size(self) -> int | None:
        """The tokenizer's length: the injected tokenizer's, else read from the configured tokenizer.json."""
        return len(self.tokenizer) if self.tokenizer is not None else tokenizer_vocab_size(self.config)

    def example_lengths(self, examples: Examples) -> list[int] | np.ndarray:
        """``example_tokens`` of every example; trainers read a ``DatasetRows``' columns instead (no row dicts)."""
        return [self.example_tokens(e) for e in examples]

    def example_token_total(self, examples: Examples) -> int:
        """``sum(example_lengths(examples))``; trainers sum a ``DatasetRows``' columns in place instead
        (at 10^6 rows, a lengths array and its temporaries were ~37 MB of the trainer's start-up RSS)."""
        lengths = self.example_lengths(examples)
        return sum(lengths) if isinstance(lengths, list) else int(np.sum(lengths, dtype=np.int64))

    def plan(self, examples: Examples, world_size: int = 1) -> Plan:
        examples = as_examples(examples)
        mean = self.example_token_total(examples) / len(examples) if len(examples) else 0.0
        return make_plan(self.kind, self.config, len(examples), mean, self.vocab_size(), world_size,
                         self.sequences_per_example)

    # -- training
    def prepare(self, examples: Examples, tokenizer: Any) -> list[dict[str, Any]] | LazyRows:
        """Rows ready to collate: a list, or ``LazyRows`` for a ``DatasetRows`` the trainer prepares per micro-batch."""
        raise NotImplementedError

    def collate(self, rows: list[dict[str, Any]], model: Any) -> dict[str, Any]:
        """The tensors ``loss`` reads for these rows (padding and masks only)."""
        raise NotImplementedError

    def micro_batch(self, rows: list[dict[str, Any]], model: Any) -> dict[str, Any]:
        """What ``run_loop`` trains on for one micro-batch: the collated rows (an on-policy trainer samples first)."""
        return self.collate(rows, model)

    def loss(self, model: Any, batch: dict[str, Any]) -> tuple[Any, float]:
        raise NotImplementedError

    def before_loop(self, model: Any, rows: list[dict[str, Any]]) -> None:
        """Hook run once before the loop (DPO precomputes reference log-probs here)."""

    def policy_hook(self) -> Any:
        """``run_loop``'s ``on_policy_update`` (step, total_steps, model, resumed), or None (the default: no call at all)."""
        return None

    def result_extra(self) -> dict[str, Any]:
        """Trainer-specific entries of the result (DPO/GRPO: skipped rows with reasons, mean rewards)."""
        return {}

    def load_tokenizer(self) -> Any:
        if self.tokenizer is not None:
            return self.tokenizer
        source = self.config.tokenizer or self.config.base_model
        if source is None:
            raise ValueError(f"{self.kind}: no tokenizer: set TrainConfig.tokenizer (a tokenizer dir) or pass tokenizer=")
        self.tokenizer = load_tokenizer_dir(source)
        return self.tokenizer

    def tokenizer_dir(self, tokenizer: Any) -> str:
        """Where the run's tokenizer lives: the configured dir, else a copy saved under output_dir/tokenizer.

        Checkpoint dirs hold no tokenizer on purpose: next to a config.json, AutoTokenizer would
        load a model-specific class that tokenises our BPE differently (see load_tokenizer_dir).
        """
        if self.config.tokenizer:
            return str(Path(self.config.tokenizer).resolve())
        folder = Path(self.config.output_dir) / "tokenizer"
        if self.accelerator is None or self.accelerator.is_main_process:
            tokenizer.save_pretrained(str(folder))
        return str(folder.resolve())

    def train(self, examples: Examples, plan: Plan | None = None) -> TrainResult:
        """Train on ``examples``; writes checkpoints and ``<output_dir>/final``; returns the result.

        ``examples``: dicts, or a ``DatasetRows`` (``training_data.open_dataset_rows``), read a
        micro-batch at a time where the trainer prepares rows on their own (SFT, pretraining).

        ``plan``: the plan already made for these examples (``trainers.jobs.run_training`` plans
        once per run); made here when not given.
        """
        from training_assets.trainers import modeling  # torch, only when training

        check_launched(self.config, self.kind, self.accelerator)
        tokenizer = self.load_tokenizer()
        examples = as_examples(examples)
        world = self.accelerator.num_processes if self.accelerator is not None else 1
        plan = plan if plan is not None else self.plan(examples, world_size=world)
        if plan.world_size != world:
            raise ValueError(f"{self.kind}: the plan was made for {plan.world_size} process(es) but {world} are training; "
                             "plan with world_size equal to the launcher's process count")
        rows = self.prepare(examples, tokenizer)
        model = self.model if self.model is not None else modeling.build_model(self.config, len(tokenizer))
        if self.config.lora is not None and not hasattr(model, "peft_config"):
            model = modeling.attach_lora(model, self.config)
        self.model = model
        self.before_loop(model, rows)
        is_main = self.accelerator is None or self.accelerator.is_main_process
        with tracking.start_run(self.config, plan, enabled=is_main) as run:
            take = rows.take if isinstance(rows, LazyRows) else (lambda idx: [rows[i] for i in idx])
            result = run_loop(model, len(rows), lambda idx, m: self.micro_batch(take(idx), m), self.loss,
                              self.config, accelerator=self.accelerator, callbacks=(*self.callbacks, run.log_step),
                              planned_steps=plan.planned_steps, on_policy_update=self.policy_hook())
            final = Path(self.config.output_dir) / "final"
            checkpoints.save_model_dir(model, final, self.accelerator)  # every rank: gathering shards is collective
            run.finish(result, str(final))
        return TrainResult(kind=self.kind, plan=plan, loop=result, checkpoint_dir=str(final.resolve()),
                           adapter=self.config.lora is not None,
                           base_model_dir=str(Path(self.config.base_model).resolve()) if self.config.base_model else None,
                           tokenizer_dir=self.tokenizer_dir(tokenizer), tracker=self.config.tracker if is_main else "none",
                           tracker_run_id=run.run_id, tracking_uri=run.uri, world_size=world, extra=self.result_extra())
