"""The Ray engine's stages without Ray: the same task functions run one after another in this
process give the local engine's files; the streamed Parquet writer gives write_table's bytes."""

import filecmp
import itertools
import json
import random
import shutil
import uuid

import numba
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from training_assets import data_engine
from training_assets.data_engine import CurationConfig
from training_assets.data_engine.corpus import CORPUS_ASSET, CORPUS_SCHEMA
from training_assets.data_engine.ray_assemble import concat_parquet
from training_assets.data_engine.ray_engine import plan_shards, run_pipeline
from training_assets.data_engine.ray_files import group_pairs, run_task
from training_assets.data_engine.ray_reduce import BUCKET_SCHEMA
from training_assets.data_engine.ray_report import build_report, write_outputs
from training_assets.storage import write_parquet


OUTPUT_FILES = ("corpus.parquet", "decisions.parquet", "buckets.parquet", "clusters.parquet", "dataset_version.json")


def synthetic_corpus(n_docs, seed=0):
    """Documents of 60-200 random words; 8 % exact copies, 15 % near copies (1-4 words replaced or a
    few cut, some of them copies of copies: chains for the components), a few short and junk ones."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(20_000)]
    docs = []
    for i in range(n_docs):
        roll = rng.random()
        if docs and roll < 0.08:
            text = rng.choice(docs)
        elif docs and roll < 0.23:
            words = rng.choice(docs[-200:]).split()
            for _ in range(rng.randint(1, 4)):
                words[rng.randrange(len(words))] = rng.choice(vocab)
            text = " ".join(words[:len(words) - rng.randint(0, 3)])
        elif roll < 0.235:
            text = "too short"
        else:
            text = " ".join(rng.choice(vocab) for _ in range(rng.randint(60, 200)))
        docs.append(text)
    return [{"id": f"doc-{i:05d}", "text": t} for i, t in enumerate(docs)]


class SerialStages:
    """``ray_engine.Stages`` without a cluster: each task's function called in turn, here."""

    def __init__(self):
        self.seconds, self.peak_rss, self.tasks = {}, {}, 0

    def run(self, stage, function, calls):
        threads = numba.get_num_threads()
        try:
            out = [run_task(function, kwargs)["result"] for kwargs in calls]
        finally:
            numba.set_num_threads(threads)
        self.tasks += len(calls)
        return out


def test_pipeline_stages_in_process_give_the_local_files(data_root, tmp_path):
    records = synthetic_corpus(600, seed=5)
    held = data_root / "held_out" / "evals.jsonl"
    held.parent.mkdir()
    held.write_text(json.dumps({"id": "e1", "prompt": records[40]["text"]}) + "\n")
    data_engine.write_held_out_sets([held], data_root)
    source = data_root / "docs.parquet"  # sources must lie under the data root (paths.confine_path)
    pq.write_table(pa.Table.from_pylist(records), source, row_group_size=150)
    config = CurationConfig(extra_sources=(str(source),))
    local = data_engine.curate(data_root, config)
    shutil.copytree(data_root / CORPUS_ASSET, tmp_path / "local")

    ray_config = CurationConfig(extra_sources=(str(source),), engine="ray", ray_shard_docs=150)
    specs = plan_shards(data_root, ray_config.extra_sources, ray_config.ray_shard_docs)
    work = data_root / "ray_work" / uuid.uuid4().hex[:12]
    results = run_pipeline(SerialStages(), work, data_root, ray_config, specs, parts=3)
    report = build_report(data_root, ray_config, results, write_outputs(work, data_root, len(specs), 3, results), {})
    for name in OUTPUT_FILES:
        assert filecmp.cmp(tmp_path / "local" / name, data_root / CORPUS_ASSET / name, shallow=False), name
    assert report.dedup_stats == local.dedup_stats and report.cluster_sizes == local.cluster_sizes
    assert local.dedup_stats["near_duplicates"] > 30 and results["cc_rounds"] >= 2


def test_streamed_parquet_has_write_table_bytes(tmp_path):
    n = 150_000  # three row groups of 65,536 rows, parts cut across their boundaries
    rows = pa.table({"id": [f"r{i}" for i in range(n)], "text": ["x" * (i % 50) for i in range(n)],
                     "source": ["s"] * n, "trace_id": [None] * n, "task_id": [None] * n, "batch_id": ["b"] * n,
                     "cluster_size": pa.array([1 + i % 3 for i in range(n)], pa.int32()),
                     "n_chars": pa.array([i % 50 for i in range(n)], pa.int64())}, schema=CORPUS_SCHEMA)
    cuts = [0, 1000, 70_000, 70_001, 140_000, n]
    parts = []
    for k, (a, b) in enumerate(itertools.pairwise(cuts)):
        parts.append(tmp_path / f"part{k}.parquet")
        write_parquet(parts[-1], rows.slice(a, b - a))
    assert concat_parquet(parts, CORPUS_SCHEMA, tmp_path / "streamed.parquet") == n
    write_parquet(tmp_path / "whole.parquet", rows)
    assert filecmp.cmp(tmp_path / "streamed.parquet", tmp_path / "whole.parquet", shallow=False)
    write_parquet(tmp_path / "empty.parquet", BUCKET_SCHEMA.empty_table())
    concat_parquet([tmp_path / "empty.parquet"], BUCKET_SCHEMA, tmp_path / "streamed_empty.parquet")
    assert filecmp.cmp(tmp_path / "streamed_empty.parquet", tmp_path / "empty.parquet", shallow=False)


def test_group_pairs_lists_every_pair_inside_each_group_once():
    values = np.array([3, 5, 9, 1, 4, 8, 2, 7, 6, 0], np.int64)
    starts = np.array([0, 3, 4, 9])  # groups of 3, 1, 5, 1
    got = sorted(map(tuple, group_pairs(values, starts).tolist()))
    groups = [values[0:3], values[3:4], values[4:9], values[9:]]
    want = sorted((int(a), int(b)) for g in groups for a, b in itertools.combinations(g, 2))
    assert got == want
