"""Declarative automation on the production stack: batches dropped into the inbox become registry
versions with no manual launch, a batch of only bad lines stops at its quarantine check, and a
daemon killed mid-flow loses and repeats nothing. Driven only through the webserver's GraphQL API.

A stack of its own (``make_stack``: its own database and data root, the automation sensor running,
sensors every 2 s, MLflow in SQLite under the data root, lm-eval cut to 4 examples per task).
Three good batches, dropped one after another: the first trains everything (tokenizer, base, the
chain) through a daemon killed mid-flow; each of the next two retrains the fine-tuned chain with
the tokenizer and base kept, and every batch ends in a new gated registry version.
"""

import os
import shutil
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from training_assets.sample_traces import write_samples

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(3000)]

ENV = {"TRAINING_ASSETS_AUTOMATION": "running", "TRAINING_ASSETS_AUTOMATION_INTERVAL_S": "2",
       "TRAINING_ASSETS_SENSOR_INTERVAL_S": "2", "TRAINING_ASSETS_RETRAIN_MIN_TRACES": "1",
       "TRAINING_ASSETS_EVAL_BENCHMARK_LIMIT": "4"}
AUTOMATION_SENSOR = "training_automation_sensor"
# every asset the automation materialises once per good batch, and those trained once per tokenizer
PER_BATCH = ["curated_corpus", "selected_traces", "sft_dataset", "preference_pairs", "grpo_groups", "pretrain_windows",
             "sft_checkpoint", "sft_eval_report", "dpo_checkpoint", "grpo_checkpoint", "dpo_eval_report",
             "grpo_eval_report", "merged_adapter", "merged_eval_report", "registry_entry"]
ONCE = ["held_out_sets", "tokenizer", "base_checkpoint"]
FLOW_TIMEOUT_S = 900  # per batch; measured here 9 min for the first (load average ~10 on 2 cores)
STACK_DEADLINE_S = 3000  # no process of this module's stack outlives it
N_BATCHES = 3


@pytest.fixture(scope="module")
def batches(tmp_path_factory) -> list[Path]:
    """Three sample batches, written aside (the test drops them one at a time), and the held-out set."""
    staging = tmp_path_factory.mktemp("staging")
    written = write_samples(staging, n_batches=N_BATCHES)
    return [Path(p) for p in written["batches"]]


@pytest.fixture(scope="module")
def auto_stack(make_stack, tmp_path_factory, batches):
    tmp = tmp_path_factory.mktemp("automation")
    # the held-out set is in place before the stack starts: held_out_sets materialises once, at once
    shutil.copytree(batches[0].parent.parent / "held_out", tmp / "data" / "held_out")
    with make_stack(tmp, ENV, mlflow=False, deadline_s=STACK_DEADLINE_S) as stack:
        yield stack


def _drop(stack, source: Path) -> None:
    tmp = stack.inbox / f".{source.name}.tmp"
    shutil.copyfile(source, tmp)
    os.replace(tmp, stack.inbox / source.name)


def _count(stack, asset: str) -> Counter:
    return Counter(m["partition"] for m in stack.materializations(asset))


def _registry_versions(stack) -> list[int]:
    versions = []
    for m in stack.materializations("registry_entry"):
        versions += [e["intValue"] for e in m["metadataEntries"] if e["label"] == "version"]
    return sorted(versions)


def _wait_versions(stack, n: int, what: str) -> None:
    stack.wait_for(what, lambda: len(_registry_versions(stack)) >= n and stack.runs_settled(),
                   timeout_s=FLOW_TIMEOUT_S, every_s=2)


def _check_executions(stack, partition: str) -> list[dict]:
    data = stack.graphql("""query($key: AssetKeyInput!, $p: String) { assetCheckExecutions(assetKey: $key,
        checkName: "quarantine_rate_within_limit", partition: $p, limit: 10) { status runId evaluation { success } } }""",
                         key={"path": ["raw_traces"]}, p=partition)
    return data["assetCheckExecutions"]


def _automation_ticks_after(stack, since: float) -> int:
    data = stack.graphql("""query($sel: SensorSelector!) { sensorOrError(sensorSelector: $sel) {
        __typename ... on Sensor { sensorState { ticks(limit: 20) { timestamp status } } } } }""",
                         sel={"repositoryLocationName": "training_assets", "repositoryName": "__repository__",
                              "sensorName": AUTOMATION_SENSOR})
    ticks = data["sensorOrError"]["sensorState"]["ticks"]
    return sum(1 for t in ticks if t["timestamp"] > since and t["status"] in {"SUCCESS", "SKIPPED"})


def _labels(stack, asset: str) -> set[str]:
    data = stack.graphql("""query($key: AssetKeyInput!) { assetConditionEvaluationRecordsOrError(assetKey: $key,
        limit: 5) { __typename ... on AssetConditionEvaluationRecords { records { numRequested
        evaluationNodes { userLabel expandedLabel numTrue } } } } }""", key={"path": [asset]})
    records = data["assetConditionEvaluationRecordsOrError"]["records"]
    return {n["userLabel"] for r in records for n in r["evaluationNodes"] if n["userLabel"]}


def test_each_batch_flows_to_a_new_gated_registry_version_on_its_own_through_a_daemon_crash(auto_stack, batches):
    stack = auto_stack
    started = time.monotonic()
    _drop(stack, batches[0])
    # crash the daemon (SIGKILL) once the first batch's chain is under way, start a new one
    stack.wait_for("the batch's chain to reach the corpus",
                   lambda: _count(stack, "curated_corpus").total() == 1, timeout_s=FLOW_TIMEOUT_S, every_s=1)
    stack.procs["daemon"].stop(sig=signal.SIGKILL)
    stack.start("daemon")
    stack.wait_for("the restarted daemon's heartbeats", stack.daemon_healthy, timeout_s=120, every_s=1)
    _wait_versions(stack, 1, "the batch to reach registry version 1 with no manual launch")
    print(f"batch 1 -> registry v1 in {time.monotonic() - started:.0f} s, through a daemon crash")
    for n, batch in enumerate(batches[1:], start=2):  # each later batch: a new version, the tokenizer and base kept
        started = time.monotonic()
        _drop(stack, batch)
        _wait_versions(stack, n, f"batch {n} to reach registry version {n} with no manual launch")
        print(f"batch {n} -> registry v{n} in {time.monotonic() - started:.0f} s")

    assert _registry_versions(stack) == list(range(1, N_BATCHES + 1))
    for asset in PER_BATCH:  # nothing lost, nothing run twice for the same inputs: once per batch
        assert _count(stack, asset) == Counter({None: N_BATCHES}), (asset, _count(stack, asset))
    for asset in ONCE:
        assert _count(stack, asset) == Counter({None: 1}), (asset, _count(stack, asset))
    assert sorted(_count(stack, "raw_traces").values()) == [1] * N_BATCHES
    assert _count(stack, "minhash_signatures") == _count(stack, "raw_traces")
    runs = stack.runs()
    assert all(r["status"] == "SUCCESS" for r in runs), [(r["runId"], r["status"]) for r in runs]
    automated = [r for r in runs if r["tags"].get("dagster/sensor_name") == AUTOMATION_SENSOR]
    assert automated and all(r["tags"].get("dagster/sensor_name") in {AUTOMATION_SENSOR, "trace_batch_sensor"}
                             for r in runs), "every run came from a sensor, none was launched by hand"

    # why each asset ran (or not) is in the UI's automation evaluations, with the policy's label
    labels = _labels(stack, "sft_checkpoint")
    assert any("new_valid_traces >= 1" in label for label in labels), labels
    assert any("tokenizer kept fixed" in label for label in _labels(stack, "tokenizer"))


def test_a_batch_of_only_bad_lines_stops_at_its_quarantine_check(auto_stack):
    stack = auto_stack
    runs_before = {r["runId"] for r in stack.runs()}
    bad = stack.tmp / "traces-bad.jsonl"
    bad.write_bytes(b"not json\n{\"trace_id\": 3}\n\xff\xfe\n")
    _drop(stack, bad)
    partition = stack.wait_for("the bad batch's raw_traces partition", lambda: next(
        (p for p in _count(stack, "raw_traces") if p.startswith("traces-bad")), None), timeout_s=300, every_s=1)
    # an execution shows up IN_PROGRESS before its evaluation is recorded: wait for the evaluation
    executions = stack.wait_for("its quarantine check's evaluation", lambda: (
        lambda found: found if found and all(e["evaluation"] for e in found) else None)(
        _check_executions(stack, partition)), timeout_s=120)
    assert [e["evaluation"]["success"] for e in executions] == [False]
    checked_at = time.time()
    stack.wait_for("two automation ticks after the failed check",
                   lambda: _automation_ticks_after(stack, checked_at) >= 2 and stack.runs_settled(), timeout_s=180)
    new_runs = [r for r in stack.runs() if r["runId"] not in runs_before]
    assert [r["tags"].get("dagster/sensor_name") for r in new_runs] == ["trace_batch_sensor"], new_runs
    assert partition not in _count(stack, "minhash_signatures")
    assert (_count(stack, "curated_corpus").total() == N_BATCHES
            and _registry_versions(stack) == list(range(1, N_BATCHES + 1)))
