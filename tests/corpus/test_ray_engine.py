"""engine="ray" gives the local engine's answer, file for file, on a two-node loopback Ray cluster.

One module-scoped cluster (head + one worker node, one CPU each, every node on 127.0.0.1), shut
down after the module. The worker-loss test runs last: it removes the worker node mid-run.
"""

from training_assets.data_engine.ray_local import local_cluster, loopback_nodes  # first: ray's nodes stay on loopback

import filecmp
import json
import shutil
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from training_assets import data_engine
from training_assets.cli import main as cli
from training_assets.data_engine import CurationConfig
from training_assets.data_engine.corpus import CORPUS_ASSET

from .conftest import ingest_inbox
from .test_ray_stages import OUTPUT_FILES, synthetic_corpus


try:
    import ray
except ImportError:
    REASON = "ray is not installed (pip install -e '.[scale]'): the Ray engine is not tested on a cluster"
    print(f"SKIP: {REASON}")
    pytest.skip(REASON, allow_module_level=True)



@pytest.fixture(scope="module")
def cluster():
    with local_cluster(nodes=2, cpus_per_node=1) as c:
        ray.init(address=c.address, log_to_driver=False)
        try:
            addresses = loopback_nodes(ray)
            assert addresses == ["127.0.0.1", "127.0.0.1"], addresses
            yield c
        finally:
            ray.shutdown()


def _both_engines(root, tmp_path, **ray_options):
    """Curate with the local engine, keep its folder, curate again on Ray; -> (local report, ray report, local dir)."""
    local = data_engine.curate(root)
    kept_local = tmp_path / "local_corpus"
    shutil.copytree(root / CORPUS_ASSET, kept_local)
    on_ray = data_engine.curate(root, CurationConfig(engine="ray", **ray_options))
    return local, on_ray, kept_local


def _assert_same(local, on_ray, local_dir, root):
    out = root / CORPUS_ASSET
    for name in OUTPUT_FILES:
        assert filecmp.cmp(local_dir / name, out / name, shallow=False), f"{name} differs between engines"
    decisions = {r["id"]: r for r in pq.read_table(out / "decisions.parquet").to_pylist()}
    local_decisions = {r["id"]: r for r in pq.read_table(local_dir / "decisions.parquet").to_pylist()}
    assert decisions == local_decisions
    for field in ("stage_counts", "drop_reasons", "cluster_sizes", "dedup_stats", "store_report",
                  "residual_overlaps", "decontam_stats", "data_version"):
        assert getattr(on_ray, field) == getattr(local, field), field
    assert on_ray.version.id == local.version.id
    assert not list((root / "ray_work").iterdir()), "the run's work folder was left behind"


def test_sample_traces_same_answer_as_local(cluster, sample_root, tmp_path, capsys):
    root, _ = sample_root
    data_engine.write_held_out_sets(sorted((root / "held_out").glob("*.jsonl")), root)
    local, on_ray, local_dir = _both_engines(root, tmp_path, ray_shard_docs=40, ray_partitions=3)
    _assert_same(local, on_ray, local_dir, root)
    assert local.stage_counts["dedup"] < local.stage_counts["decontaminate"]  # dedup had work to do
    info = on_ray.engine_info
    assert info["nodes"] == 2 and info["node_addresses"] == ["127.0.0.1", "127.0.0.1"]
    assert info["shards"] > len(ingest_inbox(root)) and info["tasks"] > info["shards"]
    assert set(info["seconds"]) >= {"shard", "exact", "buckets", "verify", "cc", "assemble", "write"}
    assert cli(["curate", "--root", str(root), "--engine", "ray", "--ray-address", cluster.address, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["dataset_version"] == local.version.id and payload["ray"]["nodes"] == 2
    assert filecmp.cmp(local_dir / "corpus.parquet", root / CORPUS_ASSET / "corpus.parquet", shallow=False)


def test_synthetic_planted_duplicates_same_answer(cluster, data_root, tmp_path):
    records = synthetic_corpus(4000)
    held = data_root / "held_out" / "evals.jsonl"
    held.parent.mkdir()
    held.write_text(json.dumps({"id": "e1", "prompt": records[17]["text"]}) + "\n")  # one planted contamination
    data_engine.write_held_out_sets([held], data_root)
    source = data_root / "synthetic.parquet"  # sources must lie under the data root (paths.confine_path)
    pq.write_table(pa.Table.from_pylist(records), source, row_group_size=500)
    options = {"extra_sources": (str(source),)}
    local = data_engine.curate(data_root, CurationConfig(**options))
    local_dir = tmp_path / "local_corpus"
    shutil.copytree(data_root / CORPUS_ASSET, local_dir)
    on_ray = data_engine.curate(data_root, CurationConfig(engine="ray", ray_shard_docs=1000, ray_partitions=4,
                                                          **options))
    _assert_same(local, on_ray, local_dir, data_root)
    stats = local.dedup_stats
    assert stats["exact_duplicates"] > 200 and stats["near_duplicates"] > 300
    assert local.drop_reasons["decontaminate/held_out_overlap"] >= 1
    assert on_ray.engine_info["shards"] == 4 and on_ray.engine_info["cc_rounds"] >= 2


def test_dedup_entry_same_result_as_local(cluster, data_root):
    records = synthetic_corpus(1500, seed=3)
    local = data_engine.dedup(records)
    on_ray = data_engine.dedup(records, engine="ray")
    assert [r["id"] for r in on_ray.kept] == [r["id"] for r in local.kept]
    assert on_ray.clusters == local.clusters and on_ray.stats == local.stats
    assert [d.to_dict() for d in on_ray.dropped] == [d.to_dict() for d in local.dropped]
    assert on_ray.pair_index.tolist() == local.pair_index.tolist()
    assert on_ray.pair_similarity.tolist() == local.pair_similarity.tolist()
    assert local.stats["near_duplicates"] > 50 and not list((data_root / "ray_work").iterdir())


def test_asset_on_ray_reuses_stored_signatures_and_reports_the_cluster(cluster, sample_root, tmp_path):
    import dagster as dg

    from training_assets.defs.corpus.assets import MinhashShingling, curated_corpus, held_out_sets, minhash_signatures
    from training_assets.defs.partitions import trace_batches
    from training_assets.defs.resources import DataRoot

    root, batch_ids = sample_root
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(trace_batches.name, batch_ids)
    resources = {"data_root": DataRoot(path=str(root)), "minhash": MinhashShingling()}
    assert dg.materialize([held_out_sets], resources=resources, instance=instance).success
    for batch_id in batch_ids:
        assert dg.materialize([minhash_signatures], partition_key=batch_id, resources=resources, instance=instance).success

    def materialise(config):
        result = dg.materialize([curated_corpus], resources=resources, instance=instance,
                                run_config={"ops": {"curated_corpus": {"config": config}}})
        assert result.success
        event = result.asset_materializations_for_node("curated_corpus")[0]
        return {k: v.value for k, v in event.metadata.items()}, (root / CORPUS_ASSET / "corpus.parquet").read_bytes()

    local, local_bytes = materialise({})
    on_ray, ray_bytes = materialise({"engine": "ray", "ray_address": cluster.address, "ray_shard_docs": 50})
    assert ray_bytes == local_bytes and on_ray["dataset_version"] == local["dataset_version"]
    assert on_ray["signatures"] == local["signatures"] and on_ray["signatures"]["from_store"] > 0
    assert on_ray["engine"] == "ray" and on_ray["ray"]["nodes"] == 2 and on_ray["ray"]["tasks"] > 0
    assert "ray" not in local


def test_missing_ray_or_cluster_address_is_a_clear_error(monkeypatch):
    from training_assets.data_engine import ray_engine

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ValueError, match="RAY_ADDRESS"):
        ray_engine.connect(_Uninitialised(), None)
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install -e '\.\[scale\]'"):
        ray_engine.import_ray()


class _Uninitialised:
    @staticmethod
    def is_initialized():
        return False


def test_worker_node_removed_mid_run_same_answer(cluster, sample_root, tmp_path):
    root, _ = sample_root
    data_engine.write_held_out_sets(sorted((root / "held_out").glob("*.jsonl")), root)
    local = data_engine.curate(root)
    local_dir = tmp_path / "local_corpus"
    shutil.copytree(root / CORPUS_ASSET, local_dir)
    worker = next(n for n in cluster.list_all_nodes() if n is not cluster.head_node)
    outcome = {}

    def run():
        try:
            outcome["report"] = data_engine.curate(root, CurationConfig(engine="ray", ray_shard_docs=8,
                                                                        ray_partitions=3))
        except Exception as exc:  # handed to the test thread, which re-raises it
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 120
    while not list(root.glob("ray_work/*/shards/*/records.parquet")):  # the first shard task has finished
        assert time.monotonic() < deadline and thread.is_alive(), outcome
        time.sleep(0.05)
    assert thread.is_alive()  # mid-run: the worker node goes while its shard tasks run or wait
    cluster.remove_node(worker)
    thread.join(timeout=300)
    assert not thread.is_alive()
    if "error" in outcome:
        raise outcome["error"]
    alive = [n for n in ray.nodes() if n["Alive"]]
    assert len(alive) == 1
    assert outcome["report"].engine_info["nodes"] == 2  # it started on both nodes
    _assert_same(local, outcome["report"], local_dir, root)
