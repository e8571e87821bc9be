"""``selected_traces``: the one selection of traces that every training dataset reads.

Every trace of every materialised ``raw_traces`` partition gets exactly one row, kept or dropped,
with the stage, the reason and its batch id. The decisions are the curated corpus's, taken per
stage for training (``STAGE_POLICY``), so curation, decontamination and lineage cover every
dataset:

- quality filter, decontamination, exact repeats and repeated trace ids drop a trace;
- a near duplicate is kept when its cluster's representative is an attempt at the **same task**
  (``near_duplicates="keep_within_task"``, the default): attempts at one task are often near
  copies of each other, and they are exactly what preference pairs and GRPO groups compare,
  so folding them away (as the pretraining corpus should) would leave DPO/GRPO without their
  negatives. A near duplicate of another task's trace is dropped (it would count twice);
- a trace the corpus has not curated yet (its partition arrived or changed after the corpus
  was built) is dropped as ``not_curated`` and fails the asset's blocking check.

Files under ``<root>/selected_traces/`` (written whole, atomically): ``decisions.parquet`` (batch_id,
line_no, trace_id, task_id, kept, stage, reason, detail, duplicate_of), ``traces.parquet`` (the
kept traces, ``raw_traces`` columns, batch then line order) and ``selection.json`` (key, data
version, counts).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from training_assets import ingest, paths
from training_assets.data_engine.corpus import CORPUS_ASSET, DECISIONS_FILE as CORPUS_DECISIONS, VERSION_FILE
from training_assets.storage import atomic_dir, fingerprint, sha256_file, write_json_atomic, write_parquet

SELECTION_ASSET = "selected_traces"
SELECTION_VERSION = "1"  # bump when the rule changes what the same inputs select: the asset's code version
DECISIONS_FILE, TRACES_FILE, INFO_FILE = "decisions.parquet", "traces.parquet", "selection.json"
NearDuplicates = Literal["keep_within_task", "drop", "keep"]

# What each corpus stage's drop means for the training datasets (documented in docs/datasets.md).
STAGE_POLICY: dict[str, str] = {
    "input/duplicate_trace_id": "drop: the trace id already came in an earlier batch",
    "quality_filter/*": "drop: not a training document",
    "decontaminate/held_out_overlap": "drop: shares an n-gram with a held-out eval example",
    "dedup/exact_duplicate": "drop: the same text as an earlier trace (a repeat would count twice)",
    "dedup/near_duplicate": "keep when the representative is an attempt at the same task (configurable)",
    "selection/not_curated": "drop: curated_corpus predates this partition; re-materialise it",
}
SELECTION_SCHEMA = pa.schema([
    ("batch_id", pa.string()), ("line_no", pa.int64()), ("trace_id", pa.string()), ("task_id", pa.string()),
    ("kept", pa.bool_()), ("stage", pa.string()), ("reason", pa.string()), ("detail", pa.string()),
    ("duplicate_of", pa.string()),
])


@dataclass(frozen=True)
class SelectionConfig:
    near_duplicates: NearDuplicates = "keep_within_task"  # "drop": as the corpus; "keep": every near duplicate

    def __post_init__(self) -> None:
        if self.near_duplicates not in ("keep_within_task", "drop", "keep"):
            raise ValueError(f"near_duplicates={self.near_duplicates!r}: use keep_within_task, drop or keep")


@dataclass
class SelectionReport:
    output_dir: Path
    data_version: str
    key: dict[str, Any]
    counts: dict[str, int]  # traces, kept, dropped, not_curated
    by_reason: dict[str, int]  # "stage/reason (kept|dropped)" -> traces
    by_batch: dict[str, dict[str, int]]  # batch id -> {kept, dropped}
    not_curated: list[str]  # batches the corpus has not curated in their current version


def _corpus_inputs(root: Path) -> tuple[str, dict[str, str], pl.DataFrame]:
    folder = paths.asset_dir(CORPUS_ASSET, root)
    if not (folder / VERSION_FILE).is_file():
        raise FileNotFoundError(f"{folder / VERSION_FILE} not found: materialise curated_corpus first "
                                "(training-assets curate)")
    version = json.loads((folder / VERSION_FILE).read_text(encoding="utf-8"))
    decisions = pl.read_parquet(folder / CORPUS_DECISIONS).filter(pl.col("trace_id").is_not_null())
    curated = {k.removeprefix("raw_traces/"): v for k, v in version["inputs"].items() if k.startswith("raw_traces/")}
    return version["id"], curated, decisions


def _decide(raw: pl.DataFrame, decisions: pl.DataFrame, stale: list[str], corpus_id: str,
            near_duplicates: NearDuplicates) -> pl.DataFrame:
    """One row per raw trace: the corpus decision joined on (batch, trace id), then the policy."""
    corpus = decisions.select("batch_id", "trace_id", pl.col("kept").alias("c_kept"), pl.col("stage").alias("c_stage"),
                              pl.col("reason").alias("c_reason"), pl.col("detail").alias("c_detail"), "duplicate_of")
    representatives = decisions.select(pl.col("id").alias("duplicate_of"), pl.col("task_id").alias("rep_task_id"))
    rows = (raw.select("batch_id", "line_no", "trace_id", "task_id")
            .join(corpus, on=["batch_id", "trace_id"], how="left")
            .join(representatives, on="duplicate_of", how="left"))
    curated = pl.col("c_stage").is_not_null() & ~pl.col("batch_id").is_in(stale)
    near = pl.col("c_reason") == "near_duplicate"
    same_task = near & (pl.col("rep_task_id") == pl.col("task_id"))
    keep_near = {"keep": near, "drop": pl.lit(False), "keep_within_task": same_task}[near_duplicates]
    kept = curated & (pl.col("c_kept") | keep_near.fill_null(False))
    detail = (pl.when(~curated).then(pl.format("raw_traces[{}] is newer than curated_corpus {}: re-materialise "
                                               "curated_corpus", pl.col("batch_id"), pl.lit(corpus_id)))
              .when(kept & same_task).then(pl.format("kept for training: an attempt at the same task as {} ({})",
                                                     pl.col("duplicate_of"), pl.col("c_detail")))
              .when(kept & near).then(pl.format("kept for training (near_duplicates=keep): {}", pl.col("c_detail")))
              .when(near & same_task).then(pl.format("dropped (near_duplicates=drop): {}", pl.col("c_detail")))
              .when(near).then(pl.format("dropped: near-duplicate of {}, a trace of another task ({})",
                                         pl.col("duplicate_of"), pl.col("c_detail")))
              .otherwise(pl.col("c_detail")))
    return rows.select(
        "batch_id", "line_no", "trace_id", "task_id", kept.fill_null(False).alias("kept"),
        pl.when(curated).then(pl.col("c_stage")).otherwise(pl.lit("selection")).alias("stage"),
        pl.when(curated).then(pl.col("c_reason")).otherwise(pl.lit("not_curated")).alias("reason"),
        detail.alias("detail"), pl.when(curated).then(pl.col("duplicate_of")).alias("duplicate_of"))


def select_traces(root: str | os.PathLike[str], config: SelectionConfig | None = None) -> SelectionReport:
    """Decide every trace (see the module docstring) and write ``<root>/selected_traces/``."""
    root, config = Path(root), config or SelectionConfig()
    corpus_id, curated, decisions = _corpus_inputs(root)
    batches = ingest.materialized_batches(root)
    versions = {b: ingest.partition_version(b, root) for b in batches}
    stale = sorted(b for b, v in versions.items() if curated.get(b) != v)
    raw_table = ingest.read_traces_table(batches, root)
    raw = pl.from_arrow(raw_table)
    decided = _decide(raw, decisions, stale, corpus_id, config.near_duplicates)
    selection = decided.to_arrow().cast(SELECTION_SCHEMA)
    kept_traces = raw_table.filter(selection.column("kept"))
    key = {"code_version": SELECTION_VERSION, "config": asdict(config), "corpus_version": corpus_id,
           "partitions": versions}
    out = paths.asset_dir(SELECTION_ASSET, root)
    with atomic_dir(out) as tmp:
        write_parquet(tmp / DECISIONS_FILE, selection)
        write_parquet(tmp / TRACES_FILE, kept_traces)
        data_version = fingerprint(key, sha256_file(tmp / DECISIONS_FILE), sha256_file(tmp / TRACES_FILE))
        reasons = (decided.group_by("stage", "reason", "kept").len().sort("stage", "reason", "kept")
                   .iter_rows(named=True))
        by_reason = {f"{r['stage']}/{r['reason']} ({'kept' if r['kept'] else 'dropped'})": r["len"] for r in reasons}
        per_batch = decided.group_by("batch_id").agg(pl.col("kept").sum().alias("kept"), pl.len().alias("n")).sort("batch_id")
        by_batch = {r["batch_id"]: {"kept": r["kept"], "dropped": r["n"] - r["kept"]} for r in per_batch.iter_rows(named=True)}
        n_kept = kept_traces.num_rows
        counts = {"traces": decided.height, "kept": n_kept, "dropped": decided.height - n_kept,
                  "not_curated": decided.filter(pl.col("reason") == "not_curated").height}
        write_json_atomic(tmp / INFO_FILE, {"key": key, "data_version": data_version, "counts": counts,
                                            "by_reason": by_reason, "by_batch": by_batch, "not_curated": stale})
    return SelectionReport(out, data_version, key, counts, by_reason, by_batch, stale)


def _selection_path(root: str | os.PathLike[str] | None, name: str) -> Path:
    path = paths.asset_dir(SELECTION_ASSET, root) / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: materialise selected_traces first")
    return path


def selection_version(root: str | os.PathLike[str] | None = None) -> str:
    """The data version of ``selected_traces`` (changes with its inputs, config or code version)."""
    return json.loads(_selection_path(root, INFO_FILE).read_text(encoding="utf-8"))["data_version"]


def load_selected_traces(root: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """The kept traces as ``raw_traces`` rows (plain dicts; ``messages`` is JSON text), batch then line order."""
    return pq.read_table(_selection_path(root, TRACES_FILE)).to_pylist()


def load_selection_decisions(root: str | os.PathLike[str] | None = None) -> pa.Table:
    """One row per trace: batch_id, line_no, trace_id, task_id, kept, stage, reason, detail, duplicate_of."""
    return pq.read_table(_selection_path(root, DECISIONS_FILE))
