"""Plan by default: plans write nothing and start no run; bad input is a one-line tool error (in memory)."""

import dagster as dg
import pytest

from tests.agent.conftest import call, calls, error_text, instance_runs, snapshot
from training_assets.agent.server import build_server


def test_plans_write_nothing_start_no_run_and_say_what_would_run(agent_env):
    root, home = agent_env["root"], agent_env["home"]
    before = snapshot(root)
    server = build_server()
    results = dict(zip(
        ["curate", "dedup", "decon", "tok", "sft_data", "reward", "pretrain", "sft", "dpo", "grpo", "workflow"],
        calls(server, [
            ("curate_corpus", {}), ("dedup_corpus", {"config": {"threshold": 0.7}}),
            ("decontaminate_corpus", {"config": {"decontam_ngram": 8}}), ("train_tokenizer", {"config": {"vocab_size": 1024}}),
            ("build_training_dataset", {"kind": "sft"}),
            ("compose_reward", {"config": {"reward_weights": {"success": 1.0, "length": 0.5}},
                                "completions": [{"completion": "The answer is 4.", "success": True}]}),
            ("pretrain_model", {"config": {"max_steps": 2}}), ("train_sft", {"config": {"max_steps": 3, "lora": {"r": 4}}}),
            ("train_dpo", {}), ("train_grpo", {}), ("execute_workflow", {"name": "train_model"}),
        ])))
    for name, r in results.items():
        assert not r.is_error, (name, r.content)
    assert snapshot(root) == before, "a plan wrote under the data root"
    assert instance_runs(home) == [], "a plan started a Dagster run"

    sft = results["sft"].structured_content
    assert sft["executed"] is False and sft["run_id"] is None and sft["targets"] == ["sft_checkpoint"]
    reasons = {s["asset"]: s["reason"] for s in sft["materialize"]}
    assert reasons["sft_checkpoint"] == "config given" and reasons["tokenizer"] == "missing"
    assert {"curated_corpus", "sft_dataset", "base_checkpoint"} <= set(reasons)
    assert sft["run_config"]["ops"]["sft_checkpoint"]["config"] == {"max_steps": 3, "lora": {"r": 4}}
    assert sft["details"]["trace_batches"]["new_in_inbox"] and sft["config_fields"]["max_steps"]["default"] == 6
    assert "execute" in sft["next_step"]
    dedup = results["dedup"].structured_content
    assert dedup["run_config"]["ops"]["curated_corpus"]["config"] == {"threshold": 0.7}
    reward = results["reward"].structured_content["details"]["reward"]
    assert reward["weights"] == {"length": 0.5, "success": 1.0}
    assert reward["scores"][0]["success"] == 1.0 and reward["scores"][0]["total"] >= 1.0
    plan = results["workflow"].structured_content
    assert plan["status"] == "PLANNED" and plan["executed"] is False
    stages = {s["name"]: s for s in plan["stages"]}
    assert len(stages["prepare_corpus"]["partitions"]) == 2
    assert stages["eval"]["gates"][0]["report"] == "sft_eval_report"
    assert stages["eval"]["gates"][0]["thresholds"]["max_bpb_vs_uniform"] == 0.97
    assert [s["owner"] for s in plan["stages"]][-1] == "ml_orchestrator"


ONE_LINE_ERRORS = [
    ("train_sft", {"config": {"max_stpes": 3}}, ["config.max_stpes", "did you mean max_steps"]),
    ("train_sft", {"config": {"max_steps": "many"}}, ["config.max_steps", "integer"]),
    ("train_sft", {"config": {"base_model": "/models/x"}}, ["config.base_model", "set by the asset graph"]),
    ("train_sft", {"config": {"attn_impl": "eager"}}, ["config.attn_impl", "does not expose"]),
    ("train_sft", {"config": {"lora": {"rank": 8}}}, ["config.lora.rank"]),
    ("train_sft", {"options": {"execute": "yes"}}, ["options.execute", "boolean"]),
    ("train_sft", {"options": {"exec": True}}, ["options.exec", "unknown field"]),
    ("train_sft", {"optons": {"execute": True}}, ["optons", "unknown argument"]),
    ("evaluate_checkpoint", {"checkpoint": "sft_checkpoint"}, ["sft_checkpoint was never materialised", "train_sft"]),
    ("evaluate_checkpoint", {"checkpoint": "sft_checkpoint", "config": {"min_pass_rate": 3}},
     ["config.min_pass_rate", "less than or equal to 1"]),
    ("merge_adapters_ties", {}, ["was never materialised", "train_dpo"]),
    ("register_model", {"options": {"execute": True}}, ["was never materialised, and register_model does not build it"]),
    ("dataset_lineage", {"asset": "tokenizer"}, ["asset: tokenizer was never materialised"]),
    ("dataset_lineage", {"record_id": "arith-0001-a0"}, ["record_id", "curate_corpus"]),
    ("build_training_dataset", {"kind": "rlhf"}, ["kind"]),
    ("list_assets", {"keys": ["checkpoint"]}, ["keys", "unknown asset 'checkpoint'"]),
    ("get_run", {"run_id": "0000-not-a-run"}, ["run_id", "no run '0000-not-a-run'"]),
    ("cancel_run", {"run_id": "wf-000000000000"}, ["run_id", "no workflow"]),
    ("pick_for_role", {"role": "generator"}, ["role", "nothing was ever registered"]),
    ("rollback_role", {"role": "generator"}, ["role", "nothing was ever registered"]),
    ("execute_workflow", {"name": "train_everything"}, ["name", "unknown workflow"]),
    ("execute_workflow", {"task": {"trian": "sft"}}, ["task.trian", "unknown task key"]),
    ("execute_workflow", {"task": {"config": {"sft_checkpoint": {"max_stpes": 2}}}},
     ["task.config.sft_checkpoint.max_stpes", "did you mean max_steps"]),
    ("compose_reward", {"config": {"reward_weights": {"vibes": 1.0}}}, ["config.reward_weights", "unknown reward components"]),
    # run config reaches only the data root (or $TRAINING_ASSETS_SOURCE_DIRS) and allowed Ray hosts
    ("decontaminate_corpus", {"config": {"paths": ["/etc/passwd"]}},
     ["config.paths[0]: /etc/passwd is outside the data root", "put the file under the data root",
      "TRAINING_ASSETS_SOURCE_DIRS"]),
    ("curate_corpus", {"config": {"extra_sources": ["/etc/hosts"]}}, ["config.extra_sources[0]: /etc/hosts is outside"]),
    ("curate_corpus", {"config": {"ray_address": "ray://203.0.113.5:10001"}},
     ["config.ray_address", "TRAINING_ASSETS_RAY_HOSTS"]),
    ("evaluate_checkpoint", {"checkpoint": "sft_checkpoint", "config": {"cases_path": "/etc/passwd"}},
     ["config.cases_path: /etc/passwd is outside"]),
    ("execute_workflow", {"task": {"config": {"held_out_sets": {"paths": ["/etc/*.conf"]}}}},
     ["task.config.held_out_sets.paths[0]: /etc is outside"]),
]


def test_bad_input_is_a_one_line_tool_error_naming_the_input_and_the_server_keeps_serving(agent_env, monkeypatch):
    for name in ("RAY_ADDRESS", "TRAINING_ASSETS_RAY_HOSTS", "TRAINING_ASSETS_SOURCE_DIRS"):
        monkeypatch.delenv(name, raising=False)
    root, home = agent_env["root"], agent_env["home"]
    before = snapshot(root)
    server = build_server()
    results = calls(server, [(name, args) for name, args, _ in ONE_LINE_ERRORS] + [("list_assets", {"group": "training"})])
    for (name, args, expected), result in zip(ONE_LINE_ERRORS, results):
        text = error_text(result)
        assert "\n" not in text and "Traceback" not in text, (name, text)
        assert not text.startswith("Error executing tool"), "one shape for every tool error: no SDK prefix"
        for fragment in expected:
            assert fragment in text, (name, args, text)
    assert not results[-1].is_error and {a["asset"] for a in results[-1].structured_content["assets"]} >= {"sft_checkpoint"}
    assert snapshot(root) == before and instance_runs(home) == []


def test_a_persona_sees_only_its_tools_and_is_refused_the_others(agent_env):
    judge = build_server(persona="eval_judge")
    refused = error_text(call(judge, "train_sft", {}))
    assert "not available to persona eval_judge" in refused and "training_engineer" in refused
    assert "unknown tool" in error_text(call(judge, "train_everything", {}))
    curator = build_server(persona="data_curator")
    assert "ml_orchestrator" in error_text(call(curator, "register_model", {"options": {"execute": True}}))
    assert instance_runs(agent_env["home"]) == []


def test_execute_while_a_run_of_the_same_asset_is_in_flight_is_refused_and_cancel_stops_it(agent_env):
    from training_assets.orchestration.catalog import defs, get_instance

    job = defs.resolve_implicit_global_asset_job_def()
    pending = get_instance().create_run_for_job(job_def=job, asset_selection={dg.AssetKey("tokenizer")},
                                                tags={"training_assets/launched_by": "someone-else"})
    server = build_server(persona="data_curator")
    text = error_text(call(server, "train_tokenizer", {"options": {"execute": True}}))
    assert f"tokenizer is already being materialised by run {pending.run_id} (NOT_STARTED)" in text
    assert [r.run_id for r in instance_runs(agent_env["home"])] == [pending.run_id], "nothing else was launched"
    canceled = call(server, "cancel_run", {"run_id": pending.run_id})
    assert canceled.structured_content == {"run_id": pending.run_id, "status": "CANCELED"}
    assert "already finished with CANCELED" in error_text(call(server, "cancel_run", {"run_id": pending.run_id}))


@pytest.mark.parametrize("persona,expected", [(None, "mcp:any"), ("ml_orchestrator", "mcp:ml_orchestrator")])
def test_runs_are_tagged_with_the_persona_that_launched_them(agent_env, persona, expected):
    assert build_server(persona=persona).runtime.launched_by == expected


@pytest.mark.parametrize("asset", ["base_checkpoint", "curated_corpus"])
def test_dataset_lineage_answers_without_serializer_warnings(data_root, asset):
    import warnings

    from tests.agent.test_workflow_driver import ScriptedBackend
    from training_assets.agent.runtime import Runtime

    server = build_server(runtime=Runtime(backend=ScriptedBackend()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a pydantic serializer warning fails the call
        result = call(server, "dataset_lineage", {"asset": asset})
    assert not result.is_error, result.content
    answer = result.structured_content
    assert answer["asset"]["asset"] == asset and answer["upstream"][0]["reason"] == "FRESH"
    assert all(c["asset"] == asset for c in answer["asset"]["checks"])
