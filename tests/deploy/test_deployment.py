"""The users' paths on the production stack, driven only through the webserver's GraphQL API:
the sensor picks up dropped batches, a partition backfill, lineage, and a daemon crash in the
middle of a stream of batches. The stack (Postgres, code server, webserver, daemon, MLflow) is
the ``stack`` fixture in conftest.py.
"""

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import requests

from training_assets.sample_traces import make_batches, write_samples
from training_assets.traces import Trace

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(900)]

SENSOR = "trace_batch_sensor"
# Edges of the asset graph fixed in the project's contract (GRAPH.md): upstream -> downstream.
CONTRACT_EDGES = [
    ("raw_traces", "curated_corpus"), ("held_out_sets", "curated_corpus"), ("curated_corpus", "tokenizer"),
    ("pretrain_windows", "base_checkpoint"), ("tokenizer", "base_checkpoint"),
    ("sft_dataset", "sft_checkpoint"), ("base_checkpoint", "sft_checkpoint"), ("tokenizer", "sft_checkpoint"),
    ("sft_checkpoint", "sft_eval_report"),
    ("sft_checkpoint", "dpo_checkpoint"), ("preference_pairs", "dpo_checkpoint"), ("sft_eval_report", "dpo_checkpoint"),
    ("sft_checkpoint", "grpo_checkpoint"), ("grpo_groups", "grpo_checkpoint"), ("sft_eval_report", "grpo_checkpoint"),
    ("dpo_checkpoint", "merged_adapter"), ("grpo_checkpoint", "merged_adapter"),
    ("merged_adapter", "merged_eval_report"), ("merged_eval_report", "registry_entry"), ("merged_adapter", "registry_entry"),
]


def drop(inbox: Path, name: str, lines: list[bytes]) -> None:
    """Drop a batch the way a producer should: write a hidden temp file, then rename it in."""
    tmp = inbox / f".{name}.tmp"
    tmp.write_bytes(b"\n".join(lines) + b"\n")
    os.replace(tmp, inbox / name)


def tiny_batches(n: int) -> list[list[bytes]]:
    """``n`` small batches of valid, distinct traces (no junk lines: every run must succeed)."""
    batches, _ = make_batches(n_batches=n, tasks_per_batch=1, attempts=2, seed=7, held_out_tasks=0)
    out = []
    for lines in batches:
        seen, keep = set(), []
        for line in lines:
            try:
                trace = Trace.model_validate_json(line)
            except ValueError:
                continue
            if trace.trace_id not in seen:
                seen.add(trace.trace_id)
                keep.append(line)
        out.append(keep)
    return out


def stream_runs(stack) -> list[dict]:
    return [r for r in stack.runs() if r["tags"].get("dagster/partition", "").startswith("stream-")]


def materialized_counts(stack, prefix: str = "") -> Counter:
    return Counter(m["partition"] for m in stack.materializations("raw_traces")
                   if m["partition"] and m["partition"].startswith(prefix))


@pytest.fixture(scope="module")
def sample_partitions(stack) -> list[str]:
    """The two sample batches, dropped into the inbox and materialised by the sensor's runs."""
    written = write_samples(stack.data)
    assert len(written["batches"]) == 2, written

    def both_done():
        counts = materialized_counts(stack)
        return sorted(counts) if len(counts) == 2 and stack.runs_settled() else None

    return stack.wait_for("the sensor's runs to materialise the 2 sample batches", both_done, timeout_s=240)


def test_sensor_runs_materialise_dropped_batches(stack, sample_partitions):
    runs = stack.runs([{"key": "dagster/sensor_name", "value": SENSOR}])
    by_partition = Counter(r["tags"].get("dagster/partition") for r in runs)
    assert by_partition == Counter(sample_partitions), runs
    assert {r["status"] for r in runs} == {"SUCCESS"}, runs
    for m in stack.materializations("raw_traces"):
        entries = {e["label"]: e.get("intValue") for e in m["metadataEntries"]}
        assert entries["valid"] > 50 and entries["lines"] == entries["valid"] + entries["quarantined"], entries
    # partition key = batch file stem + content hash
    assert [p.rsplit("-", 1)[0] for p in sample_partitions] == ["traces-0001", "traces-0002"]


def test_partition_backfill_rematerialises_the_selected_partitions(stack, sample_partitions):
    before = materialized_counts(stack)
    launched = stack.graphql("""mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
          __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }""",
                             params={"partitionNames": sample_partitions, "assetSelection": [{"path": ["raw_traces"]}],
                                     "fromFailure": False})["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    backfill_id = launched["backfillId"]

    def status():
        node = stack.graphql("""query($id: String!) { partitionBackfillOrError(backfillId: $id) {
              ... on PartitionBackfill { status } } }""", id=backfill_id)["partitionBackfillOrError"]
        return node["status"] if node["status"] in {"COMPLETED", "COMPLETED_SUCCESS", "FAILED", "CANCELED",
                                                    "COMPLETED_FAILED"} else None

    assert stack.wait_for(f"backfill {backfill_id}", status, timeout_s=240) in {"COMPLETED", "COMPLETED_SUCCESS"}
    stack.wait_for("the backfill's runs to finish", stack.runs_settled, timeout_s=60)
    runs = stack.runs([{"key": "dagster/backfill", "value": backfill_id}])
    assert sorted(r["tags"]["dagster/partition"] for r in runs) == sample_partitions
    assert {r["status"] for r in runs} == {"SUCCESS"}
    after = materialized_counts(stack)
    assert after == Counter({p: before[p] + 1 for p in sample_partitions})


def test_lineage_upstream_and_downstream_keys(stack):
    nodes = stack.graphql("""{ assetNodes { assetKey { path } dependencyKeys { path } dependedByKeys { path }
                                isPartitioned } }""")["assetNodes"]
    graph = {"/".join(n["assetKey"]["path"]): n for n in nodes}
    assert "raw_traces" in graph and graph["raw_traces"]["isPartitioned"]
    upstream = {k: {"/".join(d["path"]) for d in n["dependencyKeys"]} for k, n in graph.items()}
    downstream = {k: {"/".join(d["path"]) for d in n["dependedByKeys"]} for k, n in graph.items()}
    # the API's two directions agree: A is upstream of B exactly when B is downstream of A
    assert {(u, k) for k, ups in upstream.items() for u in ups} == \
           {(k, d) for k, downs in downstream.items() for d in downs}
    missing_assets = sorted({k for edge in CONTRACT_EDGES for k in edge} - set(graph))
    assert not missing_assets, f"the code location lacks contract assets {missing_assets}"
    for u, d in CONTRACT_EDGES:
        assert u in upstream[d] and d in downstream[u], f"lineage is missing {u} -> {d}"
    assert upstream["raw_traces"] == set()


def test_daemon_crash_mid_stream_loses_and_repeats_no_batch(stack):
    n = 6  # three before the crash, three after: each run is a subprocess (~3 s of CPU), so more batches add time, not proof
    batches = tiny_batches(n)
    names = [f"stream-{i:02d}.jsonl" for i in range(n)]
    dropped: list[str] = []
    errors: list[BaseException] = []
    first_half_dropped, daemon_restarted = threading.Event(), threading.Event()

    def producer():
        try:
            for i, (name, lines) in enumerate(zip(names, batches)):
                if i == n // 2:
                    first_half_dropped.set()
                    if not daemon_restarted.wait(120):
                        raise TimeoutError("the daemon was not restarted")
                drop(stack.inbox, name, lines)
                dropped.append(name)
                time.sleep(0.2)
        except BaseException as exc:  # re-raised in the test thread below
            errors.append(exc)

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    assert first_half_dropped.wait(30), errors
    # Crash the daemon (SIGKILL: no chance to finish a tick or a dequeue) once the sensor has
    # requested runs for the first half, start a new one, then let the second half arrive.
    stack.wait_for("the sensor to request runs for the first streamed batches",
                   lambda: stream_runs(stack), timeout_s=180)
    stack.procs["daemon"].stop(sig=signal.SIGKILL)
    stack.start("daemon")
    daemon_restarted.set()
    thread.join(30)
    assert not errors and dropped == names, errors

    def all_done():
        counts = materialized_counts(stack, "stream-")
        return counts if len(counts) == n and stack.runs_settled() else None

    counts = stack.wait_for(f"all {n} streamed batches to be materialised", all_done, timeout_s=420, every_s=1)
    assert sorted(k.rsplit("-", 1)[0] for k in counts) == [n.removesuffix(".jsonl") for n in names]
    assert set(counts.values()) == {1}, f"a batch was materialised more than once: {counts}"
    runs = stream_runs(stack)
    succeeded = Counter(r["tags"]["dagster/partition"] for r in runs if r["status"] == "SUCCESS")
    assert succeeded == Counter({k: 1 for k in counts}), "each batch has exactly one successful run"
    # A run the killed daemon had dequeued but not yet started sits in STARTING until run monitoring
    # fails it (start_timeout_seconds) and run retries launch it again: any run that did not
    # succeed must be such a failure, replaced by a retry naming it as its parent.
    parents = {r["tags"].get("dagster/parent_run_id") for r in runs}
    lost = [r for r in runs if r["status"] != "SUCCESS"]
    assert all(r["status"] == "FAILURE" and r["runId"] in parents for r in lost), lost


def test_mlflow_server_on_postgres_serves_the_tracking_api(stack):
    api = f"{stack.mlflow_url}/api/2.0/mlflow"
    created = requests.post(f"{api}/experiments/create", json={"name": "deploy-smoke"}, timeout=30)
    assert created.status_code == 200, created.text
    experiment_id = created.json()["experiment_id"]
    got = requests.get(f"{api}/experiments/get", params={"experiment_id": experiment_id}, timeout=30).json()
    assert got["experiment"]["name"] == "deploy-smoke"
    # DNS-rebinding guard: a request naming another host is refused
    refused = requests.get(f"{api}/experiments/get", params={"experiment_id": experiment_id},
                           headers={"Host": "attacker.example"}, timeout=30)
    assert refused.status_code in (400, 403), refused.status_code
    # the experiment lives in the Postgres backend store
    import psycopg2

    with psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname=f"{stack.db}_mlflow") as conn:
        with conn.cursor() as cur:
            cur.execute("SELECT name FROM experiments WHERE experiment_id = %s", (int(experiment_id),))
            assert cur.fetchone() == ("deploy-smoke",)
