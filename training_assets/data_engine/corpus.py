"""The curation pipeline: traces (+ extra sources) -> normalise -> quality filter -> decontaminate
-> exact/near dedup -> ``<root>/curated_corpus/``, with an answer for every input record.

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
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from training_assets import ingest, paths
from training_assets.data_engine import staged
from training_assets.data_engine.decontam import (
    DEFAULT_MIN_NGRAM,
    DEFAULT_NGRAM,
    HeldOutExample,
    build_index,
    decontaminate,
    find_overlaps,
    load_held_out,
)
from training_assets.data_engine.dedup import DedupParams, DedupResult, dedup
from training_assets.data_engine.filters import Dropped, QualityConfig, normalize, quality_filter
from training_assets.data_engine.provenance import DatasetVersion, dataset_provenance
from training_assets.data_engine.sources import stream_corpus
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


ENGINES = ("local", "ray")
RUN_ONLY_FIELDS = ("engine", "ray_address", "ray_shard_docs", "ray_partitions")


@dataclass(frozen=True)
class CurationConfig:
    quality: QualityConfig = field(default_factory=QualityConfig)
    dedup: DedupParams = field(default_factory=DedupParams)
    decontam_ngram: int = DEFAULT_NGRAM
    decontam_min_ngram: int = DEFAULT_MIN_NGRAM
    extra_sources: tuple[str, ...] = ()  # .jsonl / .txt / .parquet files curated with the traces
    # Where it runs, not what it gives (left out of the DatasetVersion: both engines give one answer).
    engine: Literal["local", "ray"] = "local"  # "ray": the sharded pipeline of ray_engine.py on a cluster
    ray_address: str | None = None  # the cluster's address; None: $RAY_ADDRESS (or this process's ray.init)
    ray_shard_docs: int = 100_000  # records per input shard (one map task each)
    ray_partitions: int | None = None  # shuffle partitions (reduce tasks per stage); None: 2 x cluster CPUs

    def __post_init__(self) -> None:
        if self.decontam_ngram < 1 or self.decontam_min_ngram < 1:
            raise ValueError(f"decontam_ngram ({self.decontam_ngram}) and decontam_min_ngram "
                             f"({self.decontam_min_ngram}) must be >= 1 (words per n-gram)")
        if self.engine not in ENGINES:
            raise ValueError(f"curation engine {self.engine!r} is not one of {ENGINES}")
        if self.ray_shard_docs < 1 or (self.ray_partitions is not None and self.ray_partitions < 1):
            raise ValueError(f"ray_shard_docs ({self.ray_shard_docs}) and ray_partitions ({self.ray_partitions}) "
                             "must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        """What the corpus depends on (the DatasetVersion's config): the engine settings left out."""
        return {k: v for k, v in asdict(self).items() if k not in RUN_ONLY_FIELDS}


# --------------------------------------------------------------------------- held-out sets


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


# --------------------------------------------------------------------------- curation


@dataclass
class CurationReport:
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


def gather_records(root: str | os.PathLike[str] | None, extra_sources: Sequence[str] = ()
                   ) -> tuple[list[dict[str, Any]], list[Dropped]]:
    """Every materialised trace partition (rendered, normalised), then the extra sources.

    Returns (records, repeats): a trace whose id already came in an earlier batch (batches in id
    order) is a repeat, not a new record: its record id becomes ``<trace id>@<batch id>`` and it
    is dropped before any stage, its decision naming the batch that had it first. Extra sources
    must lie under the data root or an allowed source folder (``paths.confine_path``), checked
    before any record is read.
    """
    for i, source in enumerate(extra_sources):
        paths.confine_path(source, f"extra_sources[{i}]", root)
    records, repeats = [], []
    first_batch: dict[str, str] = {}
    for batch_id in ingest.materialized_batches(root):
        for record in staged.batch_records(batch_id, root):
            if record["id"] in first_batch:
                repeats.append(Dropped(f"{record['id']}@{batch_id}", "input", "duplicate_trace_id",
                                       f"trace id already in batch {first_batch[record['id']]}",
                                       duplicate_of=record["id"]))
                record = {**record, "id": repeats[-1].id}
            else:
                first_batch[record["id"]] = batch_id
            records.append(record)
    for source in extra_sources:
        for record in stream_corpus(source):
            records.append({**record, "text": normalize(record["text"])})
    return records, repeats


def _input_versions(root: str | os.PathLike[str] | None, extra_sources: Sequence[str]) -> dict[str, str]:
    versions = {f"raw_traces/{b}": ingest.partition_version(b, root) for b in ingest.materialized_batches(root)}
    held = paths.asset_dir(HELD_OUT_ASSET, root) / EXAMPLES_FILE
    versions["held_out_sets"] = sha256_file(held)[:16] if held.is_file() else "none"
    versions.update({f"extra/{s}": sha256_file(s)[:16] for s in extra_sources})
    return versions


def _decision_rows(records: Sequence[dict[str, Any]], dropped: Sequence[Dropped]) -> list[dict[str, Any]]:
    by_id = {d.id: d for d in dropped}
    rows = []
    for r in records:
        d = by_id.get(r["id"])
        row = {"id": r["id"], "source": r.get("source"), "batch_id": r.get("batch_id"), "trace_id": r.get("trace_id"),
               "task_id": r.get("task_id"), "kept": d is None,
               "stage": "kept", "reason": "kept", "detail": "passed every stage", "duplicate_of": None,
               "similarity": None}
        if d is not None:
            row.update(stage=d.stage, reason=d.reason, detail=d.detail, duplicate_of=d.duplicate_of,
                       similarity=d.similarity)
        rows.append(row)
    return rows


def curate(root: str | os.PathLike[str] | None = None, config: CurationConfig | None = None) -> CurationReport:
    """Run the whole pipeline over the data root and write ``<root>/curated_corpus/``."""
    config = config or CurationConfig()
    if config.engine == "ray":
        from training_assets.data_engine.ray_engine import curate_on_ray

        return curate_on_ray(root, config)
    records, repeats = gather_records(root, config.extra_sources)
    ids = Counter(r["id"] for r in records)
    if len(ids) != len(records):
        dup = sorted(i for i, n in ids.items() if n > 1)[:5]
        raise ValueError(f"curate: record ids {dup} occur more than once across sources; give extra sources "
                         "their own ids")
    counts = {"input": len(records), "unique_trace_ids": len(records) - len(repeats)}
    repeated = {d.id for d in repeats}
    kept, dropped = quality_filter([r for r in records if r["id"] not in repeated], config.quality)
    dropped = repeats + dropped
    counts["quality_filter"] = len(kept)
    index = build_index(load_held_out_sets(root), config.decontam_ngram, config.decontam_min_ngram)
    decon = decontaminate(kept, index, config.decontam_ngram, config.decontam_min_ngram)
    dropped += decon.dropped
    counts["decontaminate"] = len(decon.kept)
    params = config.dedup
    features, store_report = (staged.load_store_features(decon.kept, ingest.materialized_batches(root), params, root)
                              if params.method == "minhash" else (None, {"partitions": {}, "from_store": 0, "computed": 0}))
    result: DedupResult = dedup(decon.kept, params.method, params.threshold, params.num_perm, params.ngram,
                                params.seed, params.target_recall, features=features)
    dropped += result.dropped
    counts["dedup"] = len(result.kept)
    residual = [r["id"] for r, hit in zip(result.kept, find_overlaps([r["text"] for r in result.kept], index),
                                          strict=True) if hit is not None]
    version = dataset_provenance(_input_versions(root, config.extra_sources), config.to_dict(), counts, dropped)
    out = paths.asset_dir(CORPUS_ASSET, root)
    with atomic_dir(out) as tmp:
        corpus_rows = [{**{k: r.get(k) for k in ("id", "text", "source", "trace_id", "task_id", "batch_id")},
                        "cluster_size": len(result.clusters[r["id"]]), "n_chars": len(r["text"])} for r in result.kept]
        write_parquet(tmp / CORPUS_FILE, pa.Table.from_pylist(corpus_rows, schema=CORPUS_SCHEMA))
        write_parquet(tmp / DECISIONS_FILE, pa.Table.from_pylist(_decision_rows(records, dropped), schema=DECISION_SCHEMA))
        unique_ids = [r["id"] for r in decon.kept]
        sigs = features.signatures if features is not None else None
        if sigs is not None:
            write_parquet(tmp / BUCKETS_FILE, staged.bucket_table(unique_ids, sigs, params))
        write_parquet(tmp / CLUSTERS_FILE, staged.cluster_table(result.clusters))
        write_json_atomic(tmp / VERSION_FILE, version.to_dict())
    return CurationReport(version, out, counts, version.drop_reasons, result.cluster_sizes(), result.stats,
                          store_report, residual, decon.stats, sha256_file(out / CORPUS_FILE)[:16])


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
