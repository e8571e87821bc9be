"""The corpus stage on a Ray cluster: ``curate(root, CurationConfig(engine="ray"))`` gives exactly the
local engine's answer (same kept records, clusters, representatives, drop reasons, byte-identical
``corpus.parquet``), with the work spread over the cluster's CPUs as Ray tasks.

Stages (each a set of tasks, each task reading the previous stage's files under
``<data root>/ray_work/<run id>/``; the folder is removed at the end):

1. ``shard``: per input shard (a slice of a trace partition or of an extra source): normalise,
   quality filter, decontaminate, exact hash, shingles + MinHash (stored signatures reused);
2. ``ids`` / ``exact``: id repeats and exact duplicates, reduced per hash partition;
3. ``bands`` / ``buckets``: band-keyed shuffle; each reducer reads one (band, key) range and
   emits buckets and candidate pairs;
4. ``verify``: exact Jaccard of the distinct candidate pairs of each shard;
5. ``cc``: connected components by min-label propagation over edge files partitioned by node;
6. ``assemble`` / ``clusters``: decisions, kept records, clusters per shard, then one stream per
   output file into ``<root>/curated_corpus/`` (atomic, as the local engine writes it).

Tasks have ``max_retries``: a task on a killed worker node runs again elsewhere and rewrites the
same files. The data root must be on storage every node sees (one machine, NFS, a shared volume).

    from training_assets.data_engine import CurationConfig, curate, dedup
    report = curate("data", CurationConfig(engine="ray", ray_address="ray://head:10001"))
    report.engine_info  # address, nodes, tasks, seconds per stage, dashboard URL
    result = dedup(records, engine="ray")  # in-memory records, the same DedupResult as locally

The stage functions are plain Python over files (``ray_shard``, ``ray_reduce``, ``ray_assemble``);
this module only schedules them (``Stages``), so they also run, and are tested, without Ray. It builds
on the shared building blocks (``corpus``: config, report, files) and never on the local engine
(``local_engine``); ``engines`` picks between the two.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from training_assets import ingest, paths
from training_assets.data_engine.corpus import CurationConfig, CurationReport, load_held_out_sets
from training_assets.data_engine.dedup import DedupParams, DedupResult
from training_assets.data_engine.ray_assemble import assemble_stage, cluster_stage
from training_assets.data_engine.ray_files import run_task
from training_assets.data_engine.ray_reduce import (
    band_reduce,
    cc_final,
    cc_init,
    cc_round,
    exact_reduce,
    id_reduce,
    verify_stage,
)
from training_assets.data_engine.ray_report import build_report, dedup_result, write_outputs
from training_assets.data_engine.ray_shard import band_stage, shard_stage

MAX_RETRIES = 3  # a task whose worker dies runs again up to this many times
INSTALL_HINT = "pip install -e '.[scale]'"


def import_ray() -> Any:
    """The ``ray`` module, imported on first use: an optional dependency (the ``scale`` extra) whose import
    takes seconds, which ``engine="local"`` runs should neither need nor pay for."""
    try:
        import ray  # deferred: optional and heavy (see the docstring)
    except ImportError:
        raise ImportError(f"engine='ray' needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


def plan_shards(root: Path, extra_sources: tuple[str, ...], shard_docs: int) -> list[dict[str, Any]]:
    """Input shards in input order: slices of ``shard_docs`` records of each trace partition, row-group
    slices of Parquet extra sources, and other extra sources whole. Extra sources must lie under the
    data root or an allowed source folder (``paths.confine_path``), as for the local engine."""
    for i, source in enumerate(extra_sources):
        paths.confine_path(source, f"extra_sources[{i}]", root)
    specs = []
    for batch_id in ingest.materialized_batches(root):
        n = pq.ParquetFile(ingest.raw_traces_dir(batch_id, root) / ingest.TRACES_FILE).metadata.num_rows
        specs += [{"kind": "batch", "batch_id": batch_id, "start": s, "stop": min(s + shard_docs, n)}
                  for s in range(0, max(n, 1), shard_docs)]
    for source in extra_sources:
        if not str(source).endswith(".parquet"):
            specs.append({"kind": "extra", "source": str(source), "start": 0, "stop": None})
            continue
        meta = pq.ParquetFile(source).metadata
        groups, start, rows = [], 0, 0
        for g in range(meta.num_row_groups):
            groups.append(g)
            rows += meta.row_group(g).num_rows
            if rows - start >= shard_docs or g == meta.num_row_groups - 1:
                specs.append({"kind": "extra", "source": str(source), "row_groups": groups, "start": start, "stop": rows})
                groups, start = [], rows
    return specs


class Stages:
    """Runs a stage's tasks and keeps seconds, task counts and peak worker memory per stage."""

    def __init__(self, ray: Any) -> None:
        self.ray = ray
        self.remote = ray.remote(max_retries=MAX_RETRIES, num_cpus=1)(run_task)
        self.seconds: dict[str, float] = {}
        self.peak_rss: dict[str, int] = {}
        self.tasks = 0

    def run(self, stage: str, function: Callable[..., Any], calls: list[dict[str, Any]]) -> list[Any]:
        """``function(**kwargs)`` as one task per entry of ``calls``; -> their results, in order. The
        function travels by reference (module and name): every worker imports it from the same package."""
        start = time.perf_counter()
        refs = [self.remote.options(name=f"{stage}:{function.__name__}").remote(function, kwargs) for kwargs in calls]
        outs = self.ray.get(refs)
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start
        peaks = [o["peak_rss"] for o in outs if o["peak_rss"] is not None]
        if peaks:
            self.peak_rss[stage] = max(self.peak_rss.get(stage, 0), *peaks)
        self.tasks += len(calls)
        return [o["result"] for o in outs]


def connect(ray: Any, address: str | None) -> tuple[bool, str | None]:
    """Connect to the cluster unless this process already is: -> (connected here, dashboard URL).

    A given ``address`` must be on an allowed host (``paths.confine_ray_address``: loopback, the
    ``$RAY_ADDRESS`` host, ``$TRAINING_ASSETS_RAY_HOSTS``): the corpus is shipped to that cluster."""
    if address:
        paths.confine_ray_address(address, "ray_address")
    if ray.is_initialized():
        return False, None
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise ValueError("engine='ray' needs a Ray cluster: set ray_address (CLI --ray-address) or RAY_ADDRESS "
                         "to the head node's address (host:6379 or ray://host:10001); see docs/scale.md")
    context = ray.init(address=address, log_to_driver=False)
    return True, getattr(context, "dashboard_url", None) or None


def cluster_info(ray: Any, dashboard: str | None) -> dict[str, Any]:
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return {"address": ray.get_runtime_context().gcs_address, "nodes": len(nodes),
            "node_addresses": sorted(n["NodeManagerAddress"] for n in nodes),
            "cpus": int(ray.cluster_resources().get("CPU", 0)), "dashboard_url": dashboard}


def run_pipeline(stages: Stages, work: Path, root: Path, config: CurationConfig, specs: list[dict[str, Any]],
                 parts: int, filters: bool = True) -> dict[str, Any]:
    """Stages 1-6 of the module docstring over ``specs``; -> the per-stage results the report needs.

    ``filters``: run the quality filter and decontamination (``curate``); off for ``dedup``."""
    params, w, n_shards = config.dedup, str(work), len(specs)
    shard_range = range(n_shards)
    shards = stages.run("shard", shard_stage, [
        {"work": w, "shard": s, "spec": spec, "root": str(root), "quality": config.quality if filters else None,
         "decontam": filters,
         "decontam_ngram": config.decontam_ngram, "decontam_min_ngram": config.decontam_min_ngram,
         "params": params, "n_parts": parts} for s, spec in enumerate(specs)])
    batches = [spec.get("batch_id") for spec in specs]
    ids = stages.run("ids", id_reduce, [{"work": w, "part": p, "shard_batches": batches} for p in range(parts)])
    collisions = sorted({c for r in ids for c in r["collisions"]})[:5]
    if collisions:
        raise ValueError(f"curate: record ids {collisions} occur more than once across sources; give extra sources "
                         "their own ids")
    stages.run("exact", exact_reduce, [{"work": w, "part": p, "n_shards": n_shards} for p in range(parts)])
    bands = stages.run("bands", band_stage, [{"work": w, "shard": s, "n_parts": parts} for s in shard_range])
    stages.run("buckets", band_reduce, [{"work": w, "part": p, "n_shards": n_shards} for p in range(parts)])
    verified = stages.run("verify", verify_stage, [
        {"work": w, "shard": s, "threshold": params.threshold, "n_parts": parts} for s in shard_range])
    stages.run("cc", cc_init, [{"work": w, "part": q, "n_parts": parts} for q in range(parts)])
    round_no = 0
    while True:
        round_no += 1
        changed = stages.run("cc", cc_round, [{"work": w, "part": q, "round_no": round_no, "n_parts": parts}
                                              for q in range(parts)])
        if not sum(r["changed"] for r in changed):
            break
    stages.run("cc", cc_final, [{"work": w, "part": q, "round_no": round_no, "n_shards": n_shards}
                                for q in range(parts)])
    assembled = stages.run("assemble", assemble_stage, [
        {"work": w, "shard": s, "root": str(root), "method": params.method, "threshold": params.threshold,
         "decontam": filters, "decontam_ngram": config.decontam_ngram, "decontam_min_ngram": config.decontam_min_ngram,
         "n_shards": n_shards} for s in shard_range])
    clusters = stages.run("clusters", cluster_stage, [{"work": w, "shard": s} for s in shard_range])
    return {"specs": specs, "shards": shards, "bands": bands, "verified": verified, "assembled": assembled, "clusters": clusters,
            "cc_rounds": round_no}


def curate_on_ray(root: str | os.PathLike[str] | None, config: CurationConfig) -> CurationReport:
    """``local_engine.curate`` on the cluster: the same files and report, plus ``engine_info``."""
    ray = import_ray()
    if config.dedup.method != "minhash":
        raise ValueError(f"engine='ray' runs MinHash dedup; method {config.dedup.method!r} runs on engine='local'")
    root_path = paths.data_root(root)
    load_held_out_sets(root_path)  # fails here, as the local engine does, before any task
    specs = plan_shards(root_path, config.extra_sources, config.ray_shard_docs)
    connected, dashboard = connect(ray, config.ray_address)
    work = root_path / "ray_work" / uuid.uuid4().hex[:12]
    try:
        info = cluster_info(ray, dashboard)
        parts = config.ray_partitions or max(2, 2 * info["cpus"])
        stages = Stages(ray)
        start = time.perf_counter()
        results = run_pipeline(stages, work, root_path, config, specs, parts)
        t = time.perf_counter()
        out = write_outputs(work, root_path, len(specs), parts, results)
        stages.seconds["write"] = time.perf_counter() - t
        info.update(run_id=work.name, shards=len(specs), partitions=parts, tasks=stages.tasks,
                    cc_rounds=results["cc_rounds"], seconds=dict(stages.seconds),
                    total_seconds=time.perf_counter() - start, peak_task_rss_bytes=dict(stages.peak_rss))
        return build_report(root_path, config, results, out, info)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if connected:
            ray.shutdown()


def dedup_on_ray(records: list[dict[str, Any]], params: DedupParams, ray_address: str | None = None,
                 shard_docs: int = 100_000, partitions: int | None = None) -> DedupResult:
    """``dedup.dedup`` on the cluster: the same ``DedupResult`` (kept, clusters, drops, verified
    pairs, stats). Records are staged as Parquet under ``<data root>/ray_work/<run id>/`` (the data
    root of ``$TRAINING_ASSETS_DATA``, which every node must see)."""
    ray = import_ray()
    if params.method != "minhash":
        raise ValueError(f"engine='ray' runs MinHash dedup; method {params.method!r} runs on engine='local'")
    root = paths.data_root(None)
    work = root / "ray_work" / uuid.uuid4().hex[:12]
    connected, _ = connect(ray, ray_address)
    try:
        work.mkdir(parents=True)
        source = work / "input.parquet"
        pq.write_table(pa.table({"id": pa.array([r["id"] for r in records], pa.string()),
                                 "text": pa.array([r["text"] for r in records], pa.string())}),
                       source, row_group_size=shard_docs)
        n_groups = pq.ParquetFile(source).metadata.num_row_groups
        specs = [{"kind": "raw", "source": str(source), "row_groups": [g], "start": g * shard_docs,
                  "stop": min((g + 1) * shard_docs, len(records))} for g in range(n_groups)]
        parts = partitions or max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))
        config = CurationConfig(dedup=params)
        results = run_pipeline(Stages(ray), work, root, config, specs, parts, filters=False)
        return dedup_result(work, records, params, results, parts)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if connected:
            ray.shutdown()
