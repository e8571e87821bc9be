"""A small self-training loop on the real base: fetch, template, masks, serving, harness, graph, gate, registry.

Tiny sizes (a few tasks, a few steps): what is checked is that every step happens for real and is
accounted for, not the gain (`make loop` and the README measure that).
"""

import json

import dagster as dg
import pytest

from training_assets import paths
from training_assets.orchestration.self_training import CHAIN, LoopError, run_loop
from training_assets.settings import LoopSettings

TINY = LoopSettings(generations=1, teacher_tasks=12, collect_tasks=3, attempts=1, held_out_tasks=3, concurrency=3,
                    engine="transformers", sft_steps=2, dpo_steps=1, grpo_steps=1, batch_size=2, max_seq_len=512)


@pytest.fixture
def loop_env(smol, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINING_ASSETS_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "home").mkdir()
    return tmp_path / "data"


def test_one_generation_runs_every_step_as_a_dagster_run_on_the_real_model(loop_env):
    lines: list[str] = []
    summary = run_loop(TINY, log=lines.append)
    root = loop_env
    # generation 0: the base served, its attempts and the teacher batch came in through the inbox and the sensor
    inbox = sorted(p.name for p in paths.inbox_dir(root).iterdir())
    assert inbox == ["loop-g0-base.jsonl", "loop-teacher.jsonl"]
    traces = [json.loads(line) for line in (paths.inbox_dir(root) / "loop-g0-base.jsonl").read_text().splitlines()]
    assert len(traces) == 3 and {t["metadata"]["model"] for t in traces} == {"base"}
    assert all(t["metadata"]["tools"] and t["metadata"]["generation"] == 0 for t in traces)
    assert any(t["messages"][2]["role"] == "assistant" for t in traces if len(t["messages"]) > 2)
    # the chain ran: every asset of it materialised once (whatever the gates then decided)
    instance = dg.DagsterInstance.get()
    for key in CHAIN[:-1]:
        assert instance.get_latest_materialization_event(dg.AssetKey(key)) is not None, key
    runs = instance.get_runs(filters=dg.RunsFilter(tags={"training_assets/loop": "g1"}))
    assert runs, "the generation's training was a tagged Dagster run"
    # the agentic report compared the candidate with the base on the same held-out tasks, with intervals
    report = json.loads((root / "agentic_eval_report" / "report.json").read_text())
    assert report["applied"] and report["baseline"]["label"] == "base" and report["candidate"]["n_tasks"] == 3
    assert set(report["candidate"]["families"]) == {"calculator", "lists", "units"}
    rows = summary["generations"]
    assert [r["generation"] for r in rows] == [0, 1]
    assert all(0.0 <= r["overall"]["low"] <= r["overall"]["rate"] <= r["overall"]["high"] <= 1.0 for r in rows)
    # promoted exactly when every gate passed, and then the role serves it
    registered = rows[1]["promoted"]
    assert registered == (instance.get_latest_materialization_event(dg.AssetKey("registry_entry")) is not None)
    assert (root / "loop" / "summary.json").is_file() and (root / "loop" / "success.png").read_bytes()[:4] == b"\x89PNG"
    assert any(line.startswith("generation 1: held-out") for line in lines)
    assert summary["targets"]["g1_overall_ge_0.60_every_family_ge_0.50"] in (True, False)  # measured, not asserted here
    assert summary["targets"]["two_generations_le_20_min"] is None


def test_a_base_that_is_not_fetched_stops_the_loop_in_one_line(loop_env, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINING_ASSETS_MODELS", str(tmp_path / "no-models"))
    with pytest.raises(LoopError, match="setup failed: .*training-assets models fetch smollm2-135m-instruct"):
        run_loop(TINY, log=lambda _line: None)
