"""End to end on the sample traces, through MCP, on the project's dagster.yaml with no daemon running:
plan (nothing written, no run), execute the whole train_model workflow (a registry entry, every run
tagged), a workflow stopped by an impossible SFT gate (nothing registered), the agent loop against a
scripted OpenAI-compatible server, cancelling a running training run, and the --dagster-url path
against a real dagster-webserver."""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import anyio
import pytest
import requests

from tests.agent.conftest import BIN, REPO, call, error_text, free_port, instance_runs, make_home, snapshot, write_samples
from tests.chat_server import ScriptedChat
from training_assets import kinds
from training_assets.agent.server import build_server

LAUNCHED_BY = "training_assets/launched_by"
# The demo's config, with the lm-eval tasks cut to 10 examples each (the evals' cost on CPU).
TASK = {"config": {"sft_eval_report": {"benchmark_limit": 10}, "merged_eval_report": {"benchmark_limit": 10}}}
# 1% of a uniform guess's bits per byte: no model reaches it
IMPOSSIBLE_SFT_GATE = {"sft_eval_report": {"max_bpb_vs_uniform": 0.01, "benchmark_limit": 5}}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agent_e2e")
    home, root = make_home(tmp), tmp / "data"
    root.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(home))
        mp.setenv("TRAINING_ASSETS_DATA", str(root))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        write_samples(root)
        server = build_server(persona="ml_orchestrator")
        before, runs_before = snapshot(root), instance_runs(home)
        plan = call(server, "execute_workflow", {"name": "train_model", "task": TASK})
        after_plan, runs_after_plan = snapshot(root), instance_runs(home)
        progress: list[tuple[float, float | None, str | None]] = []

        async def on_progress(value, total, message):
            progress.append((value, total, message))

        started = time.monotonic()
        result = call(server, "execute_workflow", {"name": "train_model", "task": TASK,
                                                   "options": {"execute": True, "wait_s": 1800}}, progress=on_progress)
        yield {"home": home, "root": root, "server": server, "plan": plan, "before": before, "after_plan": after_plan,
               "runs_before": runs_before, "runs_after_plan": runs_after_plan, "result": result, "progress": progress,
               "elapsed_s": time.monotonic() - started}


def test_a_plan_call_before_left_the_data_root_and_the_run_list_unchanged(trained):
    assert not trained["plan"].is_error and trained["plan"].structured_content["status"] == "PLANNED"
    assert trained["after_plan"] == trained["before"]
    assert trained["runs_after_plan"] == trained["runs_before"] == []


def test_the_executed_workflow_ends_with_a_registry_entry_and_every_run_tagged(trained):
    result = trained["result"]
    assert not result.is_error, result.content
    report = result.structured_content
    assert report["status"] == "SUCCESS", (report["stopped_at"], report["reason"])
    assert report["registry_version"] == 1
    assert [s["status"] for s in report["stages"]] == ["SUCCESS"] * 11
    gates = {g["report"]: g for s in report["stages"] for g in s["gates"]}
    assert set(gates) == {"sft_eval_report", "dpo_eval_report", "grpo_eval_report", "merged_eval_report",
                          "agentic_eval_report"}
    assert all(g["passed"] is True and g["run_id"] for g in gates.values())
    train = next(s for s in report["stages"] if s["name"] == "train")
    assert train["metrics"]["sft_checkpoint"]["steps"] == 6 and train["metrics"]["sft_checkpoint"]["final_loss"] > 0
    stage_runs = [r for s in report["stages"] for r in s["run_ids"]]
    runs = {r.run_id: r for r in instance_runs(trained["home"])}
    assert set(stage_runs) == set(runs), "every run in the instance is a stage run of this workflow"
    for run in runs.values():
        assert run.status.value == "SUCCESS"
        assert run.tags[LAUNCHED_BY] == "mcp:ml_orchestrator"
        assert run.tags["training_assets/workflow"] == report["workflow_id"]
    assert len([r for r in runs.values() if r.tags.get("dagster/partition")]) == 2, "one run per trace batch"
    values = [p[0] for p in trained["progress"]]
    assert values == sorted(values) and values[-1] == 11 and trained["progress"][-1][1] == 11
    print(f"train_model workflow: {trained['elapsed_s']:.0f} s, {len(runs)} runs, load {os.getloadavg()[0]:.1f}")


def test_get_run_and_the_registry_tools_read_back_what_the_workflow_did(trained):
    server, report = trained["server"], trained["result"].structured_content
    stages = {s["name"]: s for s in report["stages"]}
    train = call(server, "get_run", {"run_id": stages["train"]["run_ids"][-1]}).structured_content
    assert train["status"] == "SUCCESS" and {m["asset"] for m in train["metrics"]} == {"base_checkpoint", "sft_checkpoint"}
    sft_metric = next(m for m in train["metrics"] if m["asset"] == "sft_checkpoint")
    assert sft_metric["step"] == 6 and sft_metric["loss"] > 0 and sft_metric["tokens_per_s"] > 0
    uri = next(o["uri"] for o in train["outputs"] if o["asset"] == "sft_checkpoint")
    assert (Path(uri) / "model.safetensors").is_file()
    registered = call(server, "get_run", {"run_id": stages["register_model"]["run_ids"][-1]}).structured_content
    assert registered["registry_version"] == 1
    workflow = call(server, "get_run", {"run_id": report["workflow_id"]}).structured_content
    assert workflow["status"] == "SUCCESS" and workflow["workflow"]["registry_version"] == 1
    versions = call(server, "registry_list", {}).structured_content["versions"]
    assert [(v["version"], v["roles"]) for v in versions] == [(1, ["generator"])]
    entry = call(server, "pick_for_role", {"role": "generator"}).structured_content
    assert entry["version"] == 1 and entry["checkpoint_id"].startswith("merged_adapter-")
    assets = call(server, "list_assets", {}).structured_content["assets"]
    # the align kinds the task did not choose (kto, orpo) were never trained; everything else is fresh
    unchosen = {asset for k in kinds.KINDS.values() if k.name not in ("pretrain", "sft", "dpo", "grpo")
                for asset in (k.checkpoint, k.gate)}
    assert {a["asset"] for a in assets if a["stale_status"] != "FRESH"} <= unchosen, [
        (a["asset"], a["stale_status"], a["stale_causes"]) for a in assets if a["stale_status"] != "FRESH"]
    assert all(a["data_version"] is None for a in assets if a["asset"] in unchosen)
    rollback = call(server, "rollback_role", {"role": "generator"})
    assert "only version 1" in error_text(rollback), "a single version has nothing to roll back to"
    report_text, registry_text, catalog_text = read_resources(server, ["training-assets://eval-reports/merged_eval_report",
                                                                       "training-assets://registry",
                                                                       "training-assets://assets"])
    assert json.loads(report_text)["gate"]["passed"] is True
    assert json.loads(registry_text)["versions"][0]["version"] == 1
    assert len(json.loads(catalog_text)["assets"]) == len(assets)


def read_resources(server, uris):
    from mcp import Client

    async def main():
        async with Client(server) as client:
            return [(await client.read_resource(u)).contents[0].text for u in uris]

    return anyio.run(main)


def test_a_workflow_whose_sft_gate_is_impossibly_high_stops_at_that_gate_and_registers_nothing(trained):
    server, home = trained["server"], trained["home"]
    runs_before = {r.run_id for r in instance_runs(home)}
    result = call(server, "execute_workflow", {"task": {"config": IMPOSSIBLE_SFT_GATE},
                                               "options": {"execute": True, "wait_s": 900}})
    report = result.structured_content
    assert report["status"] == "STOPPED_AT_GATE" and report["stopped_at"].startswith("eval (sft_eval_report.eval_gate)")
    assert "bpb_vs_uniform" in report["reason"] and "> max 0.01" in report["reason"], report["reason"]
    statuses = {s["name"]: s["status"] for s in report["stages"]}
    assert statuses["eval"] == "GATE_FAILED" and statuses["train"] == "REUSED"
    assert all(statuses[s] == "SKIPPED" for s in ("align", "align_eval", "merge_adapters", "final_eval", "register_model"))
    new = [r for r in instance_runs(home) if r.run_id not in runs_before]
    assert [sorted(k.to_user_string() for k in r.asset_selection) for r in new] == [["sft_eval_report"]]
    assert [v["version"] for v in call(server, "registry_list", {}).structured_content["versions"]] == [1]


def stage_script(script: dict[str, list[dict]]):
    """A ScriptedChat reply answering each stage's requests with its pre-written turns, in order."""
    turns_left = {k: list(v) for k, v in script.items()}

    def reply(body: dict, _index: int) -> tuple[int, bytes]:
        stage = body["messages"][1]["content"].split("stage ", 1)[1].split(".", 1)[0]
        turns = turns_left.get(stage) or [{"content": f"{stage}: nothing to do"}]
        message = {"role": "assistant", **turns.pop(0)}
        return 200, json.dumps({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}).encode()

    return reply


def tool_call(i: int, name: str, arguments: dict) -> dict:
    return {"tool_calls": [{"id": f"call_{i}", "type": "function",
                            "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def test_the_agent_loop_drives_each_persona_with_its_own_tools_and_stops_at_a_failed_gate(trained):
    from training_assets.agent.driver import ChatEndpoint, run_agent

    script = stage_script({
        "curate": [tool_call(1, "curate_corpus", {}), {"content": "corpus is fresh"}],
        "train": [tool_call(2, "register_model", {"options": {"execute": True}}),
                  tool_call(3, "train_sft", {}), {"content": "sft is fresh"}],
        "eval": [tool_call(4, "evaluate_checkpoint", {"checkpoint": "sft_checkpoint",
                                                      "config": {"min_pass_rate": 1.0, "benchmark_tasks": []},
                                                      "options": {"execute": True, "wait_s": 600}}),
                 {"content": "the gate failed"}],
        "align": [tool_call(5, "train_dpo", {"options": {"execute": True}})],
    })
    with ScriptedChat(script) as model:
        report = anyio.run(lambda: run_agent("train_model", ChatEndpoint(model.url, "scripted"), log=lambda _m: None))
    stages = {s.name: s for s in report.stages}
    assert report.status == "STOPPED_AT_GATE" and report.stopped_at.startswith("eval")
    assert "pass_rate" in report.reason and "< min 1.000" in report.reason and list(stages)[-1] == "eval", \
        "no stage after the failed gate ran"
    asked = {r["messages"][1]["content"].split("stage ", 1)[1].split(".", 1)[0] for r in model.requests}
    assert "align" not in asked
    for request in model.requests:
        persona = next(p for p in ("data_curator", "training_engineer", "eval_judge", "ml_orchestrator")
                       if f"({p})" in request["messages"][0]["content"])
        from training_assets.agent.personas import load_persona

        assert {t["function"]["name"] for t in request["tools"]} == set(load_persona(persona).tools)
    refused, planned = stages["train"].calls[0], stages["train"].calls[1]
    assert refused.tool == "register_model" and refused.is_error and "not available to persona training_engineer" in refused.result
    assert planned.tool == "train_sft" and not planned.is_error and planned.structured["executed"] is False
    assert stages["curate"].calls[0].structured["targets"] == ["curated_corpus"]
    verdict = stages["eval"].gates[0]
    assert verdict.passed is False and any("< min 1.000" in r for r in verdict.reasons)
    assert [v["version"] for v in call(trained["server"], "registry_list", {}).structured_content["versions"]] == [1]


def test_cancel_run_stops_a_running_training_run(trained):
    server = build_server(persona="training_engineer")
    launched = call(server, "train_dpo", {"config": {"max_steps": 400}, "options": {"execute": True}}).structured_content
    run_id = launched["run_id"]
    deadline = time.monotonic() + 240
    while call(server, "get_run", {"run_id": run_id}).structured_content["status"] != "STARTED":
        assert time.monotonic() < deadline, "the run never started"
        time.sleep(1)
    assert call(server, "cancel_run", {"run_id": run_id}).structured_content["status"] in ("CANCELING", "CANCELED")
    final = call(server, "get_run", {"run_id": run_id, "wait_s": 180}).structured_content
    assert final["status"] == "CANCELED", (final["failures"], [ln["message"] for ln in final["log_lines"]])
    assert final["outputs"] == [] and "already finished with CANCELED" in error_text(
        call(server, "cancel_run", {"run_id": run_id}))
    dpo = call(server, "list_assets", {"keys": ["dpo_checkpoint"]}).structured_content["assets"][0]
    assert dpo["run_id"] != run_id, "a canceled run materialised nothing"


@pytest.fixture
def webserver(trained, tmp_path):
    """A dagster-webserver on 127.0.0.1 over a copy of the trained instance, launching runs at once
    (DefaultRunCoordinator: no daemon needed), killed at the end whatever happens."""
    home = tmp_path / "web_home"
    shutil.copytree(trained["home"], home, ignore=shutil.ignore_patterns("agent_workers"))
    (home / "dagster.yaml").write_text("run_coordinator:\n  module: dagster.core.run_coordinator\n"
                                       "  class: DefaultRunCoordinator\ntelemetry:\n  enabled: false\n")
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "TRAINING_ASSETS_DATA": str(trained["root"]),
           "DAGSTER_TELEMETRY_DISABLED": "1"}
    log = (tmp_path / "webserver.log").open("wb")
    proc = subprocess.Popen(["timeout", "-s", "KILL", "600", str(BIN / "dagster-webserver"), "-m",
                             "training_assets.definitions", "-h", "127.0.0.1", "-p", str(port)],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, (tmp_path / "webserver.log").read_text()[-3000:]
            try:
                if requests.post(f"{url}/graphql", json={"query": "{ assetNodes { id } }"}, timeout=5).json() \
                        .get("data", {}).get("assetNodes"):
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, (tmp_path / "webserver.log").read_text()[-3000:]
            time.sleep(1)
        yield {"url": url, "home": home}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_with_dagster_url_runs_go_through_a_real_webserver(trained, webserver):
    server = build_server(persona="data_curator", dagster_url=webserver["url"])
    before = {r.run_id for r in instance_runs(webserver["home"])}
    plan = call(server, "build_training_dataset", {"kind": "dpo", "config": {"max_pairs_per_task": 3}}).structured_content
    assert [s["asset"] for s in plan["materialize"]] == ["preference_pairs"], "read from the webserver: the rest is fresh"
    done = call(server, "build_training_dataset", {"kind": "dpo", "config": {"max_pairs_per_task": 3},
                                                    "options": {"execute": True, "wait_s": 300}}).structured_content
    assert done["status"] == "SUCCESS" and done["run"]["tags"][LAUNCHED_BY] == "mcp:data_curator"
    assert any(o["asset"] == "preference_pairs" for o in done["run"]["outputs"])
    assert {c["check"] for c in done["run"]["checks"]} >= {"chosen_differs_from_rejected"}
    new = [r for r in instance_runs(webserver["home"]) if r.run_id not in before]
    assert [r.run_id for r in new] == [done["run_id"]], "the webserver's instance holds the run"
    states = {a["asset"]: a for a in call(server, "list_assets", {"keys": ["preference_pairs", "dpo_checkpoint"]})
              .structured_content["assets"]}
    assert states["preference_pairs"]["run_id"] == done["run_id"]
    assert states["dpo_checkpoint"]["stale_status"] == "STALE" and states["dpo_checkpoint"]["stale_causes"]
    assert "no run" in error_text(call(server, "get_run", {"run_id": "not-a-run"}))


def test_rollback_role_plans_then_moves_the_role_back(trained):
    from training_assets.deploy import DeploymentTarget
    from training_assets.registry import ModelRegistry, register_checkpoint

    root = trained["root"]
    registry = ModelRegistry(f"sqlite:///{root / 'mlflow' / 'mlflow.db'}")
    second = register_checkpoint(registry, root / "merged_adapter", DeploymentTarget("generator", "agent-generator"),
                                 checkpoint_id="merged_adapter-second-registration")
    assert second.version == 2
    server = build_server(persona="ml_orchestrator")
    plan = call(server, "rollback_role", {"role": "generator"}).structured_content
    assert (plan["executed"], plan["from_version"], plan["to_version"]) == (False, 2, 1)
    assert registry.pick_for_role("generator").version == 2, "a plan moves nothing"
    done = call(server, "rollback_role", {"role": "generator", "options": {"execute": True}}).structured_content
    assert done["executed"] and done["to_version"] == 1 and done["entry"]["version"] == 1
    assert call(server, "pick_for_role", {"role": "generator"}).structured_content["version"] == 1
    assert "to_version" in error_text(call(server, "rollback_role", {"role": "generator", "to_version": 9}))
