"""The curated corpus's contract, shared by both engines: what a curation is asked
(``CurationConfig``) and answers (``CurationReport``), the files it writes and their readers, the
held-out sets it checks against, and the input versions its DatasetVersion names. The local engine
(``local_engine.curate``) and the Ray engine (``ray_engine.curate_on_ray``) both build on this
module and never on each other (``engines`` picks one; ``tests/corpus/test_layers.py``).

Files under ``<root>/curated_corpus/`` (written whole, atomically):

- ``corpus.parquet``: id, text, source, trace_id, task_id, batch_id, cluster_size, n_chars;
- ``decisions.parquet``: one row per input record: id, source, batch_id, trace_id, task_id, kept,
  stage, reason, detail, duplicate_of, similarity (``lineage RECORD_ID`` and the trace selection
  read it);
- ``buckets.parquet`` (band, key, ids; MinHash only) and ``clusters.parquet`` (id,
  representative): the stage-2 and stage-3 dedup artifacts;
- ``dataset_version.json``: the DatasetVersion (id, inputs, config, counts, drop reasons).

Held-out sets (``held_out_sets`` asset): ``<root>/held_out_sets/examples.parquet`` (eval_set, id,
text) and ``manifest.json`` (files and their hashes).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from training_assets import ingest, paths
from training_assets.data_engine.decontam import DEFAULT_MIN_NGRAM, DEFAULT_NGRAM, HeldOutExample, load_held_out
from training_assets.data_engine.dedup import DedupParams
from training_assets.data_engine.filters import QualityConfig
from training_assets.data_engine.provenance import DatasetVersion
from training_assets.storage import atomic_dir, sha256_file, write_json_atomic, write_parquet

CORPUS_ASSET = "curated_corpus"
HELD_OUT_ASSET = "held_out_sets"
CORPUS_FILE = "corpus.parquet"
DECISIONS_FILE = "decisions.parquet"
BUCKETS_FILE = "buckets.parquet"
CLUSTERS_FILE = "clusters.parquet"
VERSION_FILE = "dataset_version.json"
EXAMPLES_FILE = "examples.parquet"
MANIFEST_FILE = "manifest.json"

CORPUS_SCHEMA = pa.schema([
    ("id", pa.string()), ("text", pa.string()), ("source", pa.string()), ("trace_id", pa.string()),
    ("task_id", pa.string()), ("batch_id", pa.string()), ("cluster_size", pa.int32()), ("n_chars", pa.int64()),
])
DECISION_SCHEMA = pa.schema([
    ("id", pa.string()), ("source", pa.string()), ("batch_id", pa.string()), ("trace_id", pa.string()),
    ("task_id", pa.string()), ("kept", pa.bool_()), ("stage", pa.string()), ("reason", pa.string()),
    ("detail", pa.string()), ("duplicate_of", pa.string()), ("similarity", pa.float64()),
])


Engine = Literal["local", "ray"]
ENGINES = get_args(Engine)
RUN_ONLY_FIELDS = ("engine", "ray_address", "ray_shard_docs", "ray_partitions")


class CurationConfig(BaseModel):
    """What a curation is asked: the one declaration of its settings (default and help per field); the
    ``curated_corpus`` run config and the ``curate`` / ``dedup`` / ``decontaminate`` options derive from it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    quality: QualityConfig = Field(default_factory=QualityConfig, description="Thresholds of the quality filters.")
    dedup: DedupParams = Field(default_factory=DedupParams, description=(
        "Near-duplicate method, threshold and MinHash shingling (data_engine.dedup.DedupParams)."))
    decontam_ngram: int = Field(DEFAULT_NGRAM, ge=1, description="n of the held-out n-gram index (13 prose, 8-10 code).")
    decontam_min_ngram: int = Field(DEFAULT_MIN_NGRAM, ge=1, description=(
        "Held-out examples with fewer words are not indexed (too generic to mean a leak)."))
    extra_sources: tuple[str, ...] = Field((), description=(
        ".jsonl/.txt/.parquet files curated with the traces, under the data root or a folder of "
        "$TRAINING_ASSETS_SOURCE_DIRS."))
    # Where it runs, not what it gives (left out of the DatasetVersion: both engines give one answer).
    engine: Engine = Field("local", description=(
        "Where curation runs: 'local' (this process) or 'ray' (the sharded pipeline on a Ray cluster; same "
        "answer). Needs pip install -e '.[scale]'."))
    ray_address: str | None = Field(None, description=(
        "Ray cluster address (host:6379 or ray://host:10001) on loopback, the $RAY_ADDRESS host or a host of "
        "$TRAINING_ASSETS_RAY_HOSTS; empty: $RAY_ADDRESS (or this process's ray.init)."))
    ray_shard_docs: int = Field(100_000, ge=1, description="engine='ray': records per input shard (one map task).")
    ray_partitions: int | None = Field(None, ge=1, description=(
        "engine='ray': shuffle partitions (reduce tasks per stage); empty: 2 x the cluster's CPUs."))

    def to_dict(self) -> dict[str, Any]:
        """What the corpus depends on (the DatasetVersion's config): the engine settings left out."""
        return self.model_dump(exclude=set(RUN_ONLY_FIELDS))


# --------------------------------------------------------------------------- held-out sets


class HeldOutConfig(BaseModel):
    """Which held-out files the ``held_out_sets`` asset indexes (its run config derives from this)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    paths: tuple[str, ...] = Field((), description=(
        "Held-out JSONL files or globs (rows need 'id' and the text fields), under the data root or a folder of "
        "$TRAINING_ASSETS_SOURCE_DIRS. Empty: <data root>/held_out/*.jsonl."))
    fields: tuple[str, ...] = Field(("prompt",), description="Row fields joined into the indexed text.")



def write_held_out_sets(files: Sequence[str | os.PathLike[str]], root: str | os.PathLike[str] | None = None,
                        fields: Sequence[str] = ("prompt",)) -> dict[str, Any]:
    """Validate held-out JSONL files and store their examples; returns counts and the data version.

    Every file must lie under the data root or an allowed source folder (``paths.confine_path``):
    the list comes from run config."""
    if not files:
        raise ValueError("held_out_sets: no held-out files matched; put JSONL files under "
                         f"{paths.data_root(root) / 'held_out'} or configure the paths")
    for i, f in enumerate(files):
        paths.confine_path(f, f"held_out_sets paths[{i}]", root)
    examples = load_held_out(files, fields)
    manifest = {"files": {Path(f).name: sha256_file(f) for f in sorted(map(str, files))}, "fields": list(fields)}
    table = pa.table({"eval_set": [e.eval_set for e in examples], "id": [e.example_id for e in examples],
                      "text": [e.text for e in examples]})
    out = paths.asset_dir(HELD_OUT_ASSET, root)
    with atomic_dir(out) as tmp:
        write_parquet(tmp / EXAMPLES_FILE, table)
        write_json_atomic(tmp / MANIFEST_FILE, manifest)
    counts: dict[str, int] = {}
    for e in examples:
        counts[e.eval_set] = counts.get(e.eval_set, 0) + 1
    return {"examples": len(examples), "per_set": counts, "uri": str(out),
            "data_version": sha256_file(out / EXAMPLES_FILE)[:16]}


def load_held_out_sets(root: str | os.PathLike[str] | None = None) -> list[HeldOutExample]:
    path = paths.asset_dir(HELD_OUT_ASSET, root) / EXAMPLES_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: materialise held_out_sets first")
    return [HeldOutExample(r["eval_set"], r["id"], r["text"]) for r in pq.read_table(path).to_pylist()]


# --------------------------------------------------------------------------- what a curation answers


@dataclass
class CurationReport:
    """What ``curate`` returns, whichever engine ran it (the Ray engine adds ``engine_info``)."""

    version: DatasetVersion
    output_dir: Path
    stage_counts: dict[str, int]
    drop_reasons: dict[str, int]
    cluster_sizes: dict[int, int]
    dedup_stats: dict[str, Any]
    store_report: dict[str, Any]
    residual_overlaps: list[str]  # kept ids that still share an n-gram with a held-out example
    decontam_stats: dict[str, Any]
    data_version: str
    engine_info: dict[str, Any] = field(default_factory=dict)  # engine="ray": cluster, tasks, seconds per stage


def input_versions(root: str | os.PathLike[str] | None, extra_sources: Sequence[str]) -> dict[str, str]:
    """The data version of every input a curation reads: each materialised trace partition, the
    held-out sets (``none`` before they are materialised) and each extra source (its content hash)."""
    versions = {f"raw_traces/{b}": ingest.partition_version(b, root) for b in ingest.materialized_batches(root)}
    held = paths.asset_dir(HELD_OUT_ASSET, root) / EXAMPLES_FILE
    versions["held_out_sets"] = sha256_file(held)[:16] if held.is_file() else "none"
    versions.update({f"extra/{s}": sha256_file(s)[:16] for s in extra_sources})
    return versions


# --------------------------------------------------------------------------- readers


def _corpus_path(root: str | os.PathLike[str] | None, name: str) -> Path:
    path = paths.asset_dir(CORPUS_ASSET, root) / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: materialise curated_corpus first (training-assets curate)")
    return path


def load_curated_corpus(root: str | os.PathLike[str] | None = None) -> pa.Table:
    """The curated corpus: columns id, text, source, trace_id, task_id, batch_id, cluster_size, n_chars."""
    return pq.read_table(_corpus_path(root, CORPUS_FILE))


def corpus_version(root: str | os.PathLike[str] | None = None) -> str:
    """The curated corpus's DatasetVersion id (changes with inputs, config or code version)."""
    return json.loads(_corpus_path(root, VERSION_FILE).read_text())["id"]


def lineage(record_id: str, root: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Why ``record_id`` was kept or dropped, with its cluster (representative and members)."""
    decisions = pq.read_table(_corpus_path(root, DECISIONS_FILE))
    match = decisions.filter(pc.equal(decisions["id"], record_id)).to_pylist()
    if not match:
        raise KeyError(f"record {record_id!r} is not in {_corpus_path(root, DECISIONS_FILE)}; "
                       "ids are trace ids (or <source>:<n> for extra sources)")
    row = match[0]
    clusters = pq.read_table(_corpus_path(root, CLUSTERS_FILE))
    rep = clusters.filter(pc.equal(clusters["id"], record_id)).column("representative").to_pylist()
    if rep:
        members = clusters.filter(pc.equal(clusters["representative"], rep[0])).column("id").to_pylist()
        row["cluster"] = {"representative": rep[0], "members": members}
    row["corpus_version"] = corpus_version(root)
    return row
