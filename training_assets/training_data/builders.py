"""Build the dataset assets (``BUILDERS``) from the data root: read inputs, build, write, check.

Each ``build_*_dataset(root, config)`` computes the dataset's key (code version, input versions,
tokenizer and chat-template hashes, config), reuses the existing files when they were built
from the same key and are intact, otherwise builds and writes them, then runs the dataset's
checks on what is on disk. SFT/DPO/GRPO/KTO read the kept traces of ``selected_traces`` (the one
selection: curation's decisions per trace, see ``selection``); pretraining windows read the
curated corpus. Every row records the trace batches it came from (``source_batches``).
"""

from __future__ import annotations

import os
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
from pydantic import BaseModel

from training_assets.data_engine import corpus_version, load_curated_corpus
from training_assets.data_engine.decontam import decontaminate
from training_assets.settings import GrpoConfig, KtoConfig, PreferenceConfig, PretrainConfig, SftConfig
from training_assets.storage import canonical_json
from training_assets.tokenizer_trainer import chat_template_hash, load_tokenizer, tokenizer_hash
from training_assets.training_data import held_out as held_out_lib
from training_assets.training_data import selection
from training_assets.training_data.common import BuildResult, has_completion
from training_assets.training_data.grpo import build_grpo_groups, filter_by_difficulty
from training_assets.training_data.io import (
    DatasetInfo, read_dataset_table, reusable, rows_to_table, windows_to_table, write_dataset,
)
from training_assets.training_data.packing import IGNORE_INDEX, pack_sequences
from training_assets.training_data.kto import build_binary_feedback
from training_assets.training_data.preferences import build_preference_pairs
from training_assets.training_data.rewards import completion_messages, compose_reward
from training_assets.training_data.sft import build_sft_examples

# Bump when a builder's output for the same inputs changes: it is the assets' code version.
DATASETS_VERSION = "2"
PREVIEW_ROWS = 5
HELD_OUT_NGRAM = 13


@dataclass(frozen=True)
class CheckOutcome:
    name: str
    passed: bool
    description: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class DatasetReport:
    info: DatasetInfo
    reused: bool
    preview: list[dict[str, Any]]
    checks: list[CheckOutcome]

    @property
    def data_version(self) -> str:
        return self.info.data_version


# --------------------------------------------------------------------------- inputs


def _load_selected(root: Path) -> tuple[list[dict[str, Any]], dict[str, Any], list[Any]]:
    """(kept trace rows of selected_traces, their version for the key, held-out examples)."""
    traces = selection.load_selected_traces(root)
    return traces, {"selected_traces_version": selection.selection_version(root)}, held_out_lib.held_out_examples(root)


def _base_key(name: str, root: Path, config: Any) -> dict[str, Any]:
    return {"dataset": name, "code_version": DATASETS_VERSION, "config": _config_dict(config),
            "held_out_version": held_out_lib.held_out_version(root)}


def _config_dict(config: Any) -> dict[str, Any]:
    return {k: dict(sorted(v.items())) if isinstance(v, Mapping) else v for k, v in config.model_dump().items()}


def _tokenizer_key(tokenizer: Any, root: Path) -> dict[str, str]:
    return {"tokenizer_hash": tokenizer_hash(root), "chat_template_hash": chat_template_hash(tokenizer)}


# --------------------------------------------------------------------------- checks


def messages_plain_text(*message_lists: str) -> str:
    """The words of JSON message lists (contents and tool-call arguments), without JSON punctuation
    glued to the first and last word of each field, which would hide an n-gram match."""
    parts = []
    for text in message_lists:
        for message in completion_messages(text):
            parts.append(str(message.get("content") or ""))
            parts += [str((c.get("function") or c).get("arguments", "")) for c in message.get("tool_calls") or ()]
    return "\n".join(parts)


def held_out_overlap_check(texts: Mapping[str, str], held_out: Sequence[Any], ngram: int = HELD_OUT_NGRAM) -> CheckOutcome:
    """No row's text shares a word ``ngram`` with a held-out example."""
    result = decontaminate([{"id": k, "text": v} for k, v in texts.items()], held_out, ngram=ngram)
    hits = [{"id": d.id, "detail": d.detail} for d in result.dropped]
    return CheckOutcome("no_held_out_overlap", not hits,
                        f"{len(hits)} of {len(texts)} rows share a {ngram}-gram with a held-out example" if hits
                        else f"none of {len(texts)} rows shares a {ngram}-gram with {len(held_out)} held-out examples",
                        {"overlaps": hits[:10]})


def _empty_check(rows: Sequence[Mapping[str, Any]], id_key: str,
                 fields: Callable[[Mapping[str, Any]], list[str]]) -> CheckOutcome:
    empty = []
    for row in rows:
        for text in fields(row):
            if not has_completion(completion_messages(text)):
                empty.append(row[id_key])
    return CheckOutcome("no_empty_completions", not empty,
                        f"{len(empty)} rows have a completion with no assistant content or tool call" if empty
                        else f"every completion of {len(rows)} rows says or calls something", {"ids": empty[:10]})


def _preview(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> list[dict[str, Any]]:
    def short(value: Any) -> Any:
        if isinstance(value, int | float | None):
            return value
        text = value if isinstance(value, str) else canonical_json(value)
        return text if len(text) <= 80 else text[:77] + "..."

    return [{c: short(r[c]) for c in columns} for r in rows[:PREVIEW_ROWS]]


def _finish(name: str, key: dict[str, Any], root: Path,
            build: Callable[[], tuple[pa.Table, dict[str, Any]]]) -> tuple[DatasetInfo, bool, list[dict[str, Any]]]:
    """Reuse the dataset built from ``key`` or build and write it; returns (info, reused, rows on disk)."""
    info = reusable(name, key, root)
    reused = info is not None
    if info is None:
        table, stats = build()
        info = write_dataset(name, table, key, stats, root)
    return info, reused, read_dataset_table(name, root).to_pylist()


def _skip_stats(result: BuildResult, traces: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What the builder left out (selection's drops are in the selected_traces asset), and the batches used."""
    batches = sorted({b for row in result.rows for b in row.get("source_batches") or ()})
    return {"input_traces": len(traces), "builder_skipped": result.skipped_by_reason(), "source_batches": len(batches)}


def window_batches(doc_ids: np.ndarray, doc_batches: Sequence[str | None]) -> list[list[str]]:
    """Per packed window (rows of ``doc_ids``, -1 = padding), the sorted trace batches of the
    documents in it; documents without a batch (extra sources) add none."""
    n_windows, width = doc_ids.shape if doc_ids.ndim == 2 else (0, 0)
    cells = pl.DataFrame({"window": np.repeat(np.arange(n_windows), width), "doc": doc_ids.reshape(-1)})
    docs = pl.DataFrame({"doc": np.arange(len(doc_batches), dtype=doc_ids.dtype), "batch": list(doc_batches)},
                        schema={"doc": pl.Int32, "batch": pl.String})
    found = (cells.filter(pl.col("doc") >= 0).unique().join(docs, on="doc").drop_nulls("batch")
             .group_by("window").agg(pl.col("batch").unique().sort()))
    out: list[list[str]] = [[] for _ in range(n_windows)]
    for window, batch in found.iter_rows():
        out[window] = batch
    return out


# --------------------------------------------------------------------------- datasets


def build_sft_dataset(root: str | os.PathLike[str], config: SftConfig | None = None) -> DatasetReport:
    root, config = Path(root), config or SftConfig()
    tokenizer = load_tokenizer(root)
    traces, version, held_out = _load_selected(root)
    key = {**_base_key("sft_dataset", root, config), **version, **_tokenizer_key(tokenizer, root)}

    def build() -> tuple[pa.Table, dict[str, Any]]:
        result = build_sft_examples(traces, tokenizer=tokenizer, max_tokens=config.max_tokens)
        n_tokens = [r["n_tokens"] for r in result.rows]
        trained = sum(sum(r["assistant_mask"]) for r in result.rows)
        stats = {"examples": len(result.rows), "tokens": sum(n_tokens), "trained_tokens": trained,
                 "trained_fraction": round(trained / sum(n_tokens), 4) if n_tokens else 0.0,
                 "mean_tokens": round(statistics.fmean(n_tokens), 2) if n_tokens else 0.0,
                 "max_tokens": max(n_tokens, default=0), **_skip_stats(result, traces)}
        return rows_to_table("sft_dataset", result.rows), stats

    info, reused, rows = _finish("sft_dataset", key, root, build)
    end_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    unmasked_end = [r["id"] for r in rows
                    if not any(t == end_id and m for t, m in zip(r["input_ids"], r["assistant_mask"], strict=True))]
    checks = [
        _empty_check(rows, "id", lambda r: [r["messages"]]),
        CheckOutcome("end_of_turn_in_mask", not unmasked_end,
                     f"{len(unmasked_end)} examples have no end-of-turn token inside the assistant mask" if unmasked_end
                     else "every example trains on at least one end-of-turn token", {"ids": unmasked_end[:10]}),
        held_out_overlap_check({r["id"]: messages_plain_text(r["messages"]) for r in rows}, held_out),
    ]
    return DatasetReport(info, reused, _preview(rows, ["id", "task_id", "n_tokens", "messages"]), checks)


def build_preference_dataset(root: str | os.PathLike[str], config: PreferenceConfig | None = None) -> DatasetReport:
    root, config = Path(root), config or PreferenceConfig()
    traces, version, held_out = _load_selected(root)
    key = {**_base_key("preference_pairs", root, config), **version}

    def build() -> tuple[pa.Table, dict[str, Any]]:
        result = build_preference_pairs(traces, config.max_pairs_per_task, config.require_success)
        stats = {"pairs": len(result.rows), "tasks": len({r["task_id"] for r in result.rows}),
                 "failure_point_counts": dict(sorted(Counter(str(r["failure_point"]) for r in result.rows).items())),
                 **_skip_stats(result, traces)}
        return rows_to_table("preference_pairs", result.rows), stats

    info, reused, rows = _finish("preference_pairs", key, root, build)
    same = [r["id"] for r in rows if r["chosen"] == r["rejected"]]
    checks = [
        _empty_check(rows, "id", lambda r: [r["chosen"], r["rejected"]]),
        CheckOutcome("chosen_differs_from_rejected", not same,
                     f"{len(same)} pairs have identical chosen and rejected" if same
                     else f"chosen differs from rejected in all {len(rows)} pairs", {"ids": same[:10]}),
        held_out_overlap_check({r["id"]: messages_plain_text(r["prompt"], r["chosen"], r["rejected"]) for r in rows}, held_out),
    ]
    return DatasetReport(info, reused, _preview(rows, ["id", "failure_point", "chosen", "rejected"]), checks)


def build_kto_dataset(root: str | os.PathLike[str], config: KtoConfig | None = None) -> DatasetReport:
    root, config = Path(root), config or KtoConfig()
    traces, version, held_out = _load_selected(root)
    key = {**_base_key("binary_feedback", root, config), **version}

    def build() -> tuple[pa.Table, dict[str, Any]]:
        result = build_binary_feedback(traces, config.max_per_task)
        desirable = sum(r["label"] for r in result.rows)
        stats = {"examples": len(result.rows), "desirable": desirable, "undesirable": len(result.rows) - desirable,
                 "tasks": len({r["task_id"] for r in result.rows}), **_skip_stats(result, traces)}
        return rows_to_table("binary_feedback", result.rows), stats

    info, reused, rows = _finish("binary_feedback", key, root, build)
    checks = [
        _empty_check(rows, "id", lambda r: [r["completion"]]),
        held_out_overlap_check({r["id"]: messages_plain_text(r["prompt"], r["completion"]) for r in rows}, held_out),
    ]
    return DatasetReport(info, reused, _preview(rows, ["id", "task_id", "label", "completion"]), checks)


def build_grpo_dataset(root: str | os.PathLike[str], config: GrpoConfig | None = None) -> DatasetReport:
    root, config = Path(root), config or GrpoConfig()
    traces, version, held_out = _load_selected(root)
    key = {**_base_key("grpo_groups", root, config), **version}

    def build() -> tuple[pa.Table, dict[str, Any]]:
        groups = build_grpo_groups(traces, compose_reward(config.reward_weights), config.scale_rewards,
                                   config.min_group_size)
        kept = filter_by_difficulty(groups, config.min_pass_rate, config.max_pass_rate, config.drop_zero_variance)
        kept.skipped[:0] = groups.skipped
        rates = [g["pass_rate"] for g in kept.rows if g["pass_rate"] is not None]
        stats = {"groups": len(kept.rows), "completions": sum(len(g["completions"]) for g in kept.rows),
                 "mean_pass_rate": round(statistics.fmean(rates), 4) if rates else None,
                 "scale_rewards": config.scale_rewards, **_skip_stats(kept, traces)}
        return rows_to_table("grpo_groups", kept.rows), stats

    info, reused, rows = _finish("grpo_groups", key, root, build)
    off = [{"group_id": r["group_id"], "mean": float(np.mean(r["advantages"]))} for r in rows
           if abs(float(np.mean(r["advantages"]))) > 1e-6]
    checks = [
        _empty_check(rows, "group_id", lambda r: list(r["completions"])),
        CheckOutcome("advantages_zero_mean", not off,
                     f"{len(off)} groups have advantages whose mean is not 0" if off
                     else f"advantages average to 0 (|mean| <= 1e-6) in all {len(rows)} groups", {"groups": off[:10]}),
        held_out_overlap_check({r["group_id"]: messages_plain_text(r["prompt"], *r["completions"]) for r in rows}, held_out),
    ]
    return DatasetReport(info, reused, _preview(rows, ["group_id", "pass_rate", "rewards", "advantages"]), checks)


def build_pretrain_dataset(root: str | os.PathLike[str], config: PretrainConfig | None = None) -> DatasetReport:
    root, config = Path(root), config or PretrainConfig()
    tokenizer = load_tokenizer(root)
    key = {**_base_key("pretrain_windows", root, config), "corpus_version": corpus_version(root),
           **_tokenizer_key(tokenizer, root)}
    corpus = load_curated_corpus(root).select(["id", "text", "batch_id"]).to_pylist()
    held_out = held_out_lib.held_out_examples(root)

    def build() -> tuple[pa.Table, dict[str, Any]]:
        ids = tokenizer([r["text"] for r in corpus], add_special_tokens=False)["input_ids"] if corpus else []
        packed = pack_sequences(ids, config.window, tokenizer.eos_token_id, tokenizer.pad_token_id)
        batches = window_batches(packed.doc_ids, [r["batch_id"] for r in corpus])
        stats = {"windows": packed.n_windows, "documents": packed.n_docs, "tokens": packed.n_tokens,
                 "window": config.window, "padding_fraction": round(packed.padding_fraction, 4),
                 "source_batches": len({b for w in batches for b in w})}
        return windows_to_table(packed.columns(), batches), stats

    info, reused, rows = _finish("pretrain_windows", key, root, build)
    doc = np.array([r["doc_ids"] for r in rows], dtype=np.int64).reshape(len(rows), -1)  # (n_windows, window)
    labels = np.array([r["labels"] for r in rows], dtype=np.int64).reshape(doc.shape)
    crossing = int(((doc[:, 1:] != doc[:, :-1]) & (labels[:, 1:] != IGNORE_INDEX)).sum())
    checks = [
        CheckOutcome("no_cross_document_loss", crossing == 0,
                     f"{crossing} tokens are trained to predict across a document boundary" if crossing
                     else "no label crosses a document boundary", {}),
        held_out_overlap_check({r["id"]: r["text"] for r in corpus}, held_out),
    ]
    preview = [{"window": i, "documents": len({d for d in r["doc_ids"] if d >= 0}),
                "text": tokenizer.decode(r["input_ids"][:60])} for i, r in enumerate(rows[:PREVIEW_ROWS])]
    return DatasetReport(info, reused, preview, checks)


@dataclass(frozen=True)
class DatasetBuilder:
    """What a dataset asset needs to know about its builder: the function, its settings, inputs and checks."""

    build: Callable[..., DatasetReport]  # (root, config) -> report
    config: type[BaseModel]  # its settings (training_assets.settings; Dagster config and CLI options derive from it)
    inputs: tuple[str, ...]  # the assets it reads
    checks: tuple[str, ...]  # the checks its report carries, in order
    description: str


# dataset asset -> its builder (training_assets.kinds names which kind trains on which)
BUILDERS: dict[str, DatasetBuilder] = {
    "sft_dataset": DatasetBuilder(
        build_sft_dataset, SftConfig, ("selected_traces", "held_out_sets", "tokenizer"),
        ("no_empty_completions", "end_of_turn_in_mask", "no_held_out_overlap"),
        "Successful traces as chat examples: input_ids and an assistant-only loss mask (end-of-turn included)."),
    "preference_pairs": DatasetBuilder(
        build_preference_dataset, PreferenceConfig, ("selected_traces", "held_out_sets"),
        ("no_empty_completions", "chosen_differs_from_rejected", "no_held_out_overlap"),
        "Better/worse attempts at the same task, split where they diverge, with the rejected one's failure point."),
    "grpo_groups": DatasetBuilder(
        build_grpo_dataset, GrpoConfig, ("selected_traces", "held_out_sets"),
        ("no_empty_completions", "advantages_zero_mean", "no_held_out_overlap"),
        "Attempts grouped per prompt with composite rewards and group-normalised advantages."),
    "pretrain_windows": DatasetBuilder(
        build_pretrain_dataset, PretrainConfig, ("curated_corpus", "held_out_sets", "tokenizer"),
        ("no_cross_document_loss", "no_held_out_overlap"),
        "The curated corpus tokenised and packed into fixed windows with per-document positions and labels."),
    "binary_feedback": DatasetBuilder(
        build_kto_dataset, KtoConfig, ("selected_traces", "held_out_sets"),
        ("no_empty_completions", "no_held_out_overlap"),
        "Every kept trace once (single attempts too): prompt, completion and label desirable = outcome.success."),
}
