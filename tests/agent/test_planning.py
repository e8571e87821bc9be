"""The pure parts: run-or-reuse decisions, the config mapping onto the graph's assets, task parsing."""

import pytest

from training_assets.agent import graph_map, workflow
from training_assets.agent.errors import ToolInputError
from training_assets.agent.planning import ancestors, decide

GRAPH = {  # a small graph in dependency order, shaped like describe_graph()
    "traces": {"parents": [], "partitioned": True, "config": {}},
    "corpus": {"parents": ["traces"], "partitioned": False, "config": {"threshold": {"default": 0.8}}},
    "tokenizer": {"parents": ["corpus"], "partitioned": False, "config": {"vocab_size": {"default": 2048}}},
    "dataset": {"parents": ["corpus", "tokenizer"], "partitioned": False, "config": {}},
    "model": {"parents": ["dataset", "tokenizer"], "partitioned": False, "config": {"max_steps": {"default": 6}}},
    "other": {"parents": [], "partitioned": False, "config": {}},
}


def state(status, version="v1", **extra):
    return {"stale_status": status, "data_version": version, "stale_causes": extra.get("causes", []),
            "partitions": extra.get("partitions")}


def test_ancestors_are_in_dependency_order_and_exclude_unrelated_assets():
    assert ancestors(GRAPH, ["model"]) == ["traces", "corpus", "tokenizer", "dataset", "model"]


def test_missing_stale_forced_and_downstream_of_a_run_run_fresh_is_reused():
    states = {"traces": state("FRESH", partitions={"missing": [], "total": 2}), "corpus": state("FRESH"),
              "tokenizer": state("STALE", causes=["corpus: updated data version"]), "dataset": state("FRESH"),
              "model": state("FRESH")}
    decision = decide(GRAPH, states, ancestors(GRAPH, ["model"]), {"model": "requested"})
    assert [(s.asset, s.reason) for s in decision.materialize] == [
        ("tokenizer", "stale: corpus: updated data version"), ("dataset", "upstream will run (tokenizer)"),
        ("model", "requested")]
    assert [(s.asset, s.data_version) for s in decision.reused] == [("traces", None), ("corpus", "v1")]  # per partition


def test_missing_partitions_are_reported_apart_and_make_nothing_run_by_themselves():
    states = {"traces": state("MISSING", partitions={"missing": ["b1", "b2"], "total": 2}), "corpus": state("FRESH")}
    decision = decide(GRAPH, states, ["traces", "corpus"], {})
    assert decision.materialize == [] and decision.partitions[0].asset == "traces"
    assert "2 trace batch(es)" in decision.partitions[0].reason
    carried = decide(GRAPH, states, ["corpus"], {}, will_run={"traces"})
    assert [s.reason for s in carried.materialize] == ["upstream will run (traces)"]


def test_the_config_mapping_uses_the_assets_fields_and_the_trainconfig_spellings():
    graph = {"sft_checkpoint": {"config": {"max_steps": {}, "lora": {}}, "parents": []}}
    assert graph_map.to_run_config("train_sft", {"max_steps": 4, "lora": {"r": 8, "alpha": 16}}, graph) == {
        "sft_checkpoint": {"max_steps": 4, "lora": {"r": 8, "alpha": 16}}}
    with pytest.raises(ToolInputError, match=r"config.max_step: unknown field for train_sft; did you mean max_steps"):
        graph_map.to_run_config("train_sft", {"max_step": 4}, graph)
    with pytest.raises(ToolInputError, match="config.output_dir: set by the asset graph"):
        graph_map.to_run_config("train_sft", {"output_dir": "/tmp/x"}, graph)
    assert graph_map.dagster_run_config({"sft_checkpoint": {"max_steps": 4}, "tokenizer": {}}) == {
        "ops": {"sft_checkpoint": {"config": {"max_steps": 4}}}}
    fields = graph_map.train_config_fields("sft_checkpoint", {"max_steps": 4, "lora": {"r": 8, "alpha": 16},
                                                             "num_processes": 1})
    assert fields["max_steps"] == 4 and fields["packing"] is True
    assert fields["lora"]["r"] == 8 and fields["lora"]["alpha"] == 16  # the rest: LoraSpec's defaults
    assert fields["lora"]["dropout"] == 0.0 and "num_processes" not in fields
    dpo = graph_map.train_config_fields("dpo_checkpoint", {"dpo": {"beta": 0.25}})
    assert dpo["dpo"]["beta"] == 0.25 and dpo["dpo"]["loss_type"] == "sigmoid"


def test_dedup_and_decontaminate_own_only_their_part_of_the_corpus_config():
    from training_assets.orchestration.catalog import describe_graph

    graph = describe_graph()
    dedup = graph_map.accepted_fields("dedup_corpus", ("curated_corpus",), graph)
    assert set(dedup) == {"method", "threshold", "min_dedup_rate", "max_dedup_rate"}
    with pytest.raises(ToolInputError, match="config.min_chars: unknown field for dedup_corpus"):
        graph_map.to_run_config("dedup_corpus", {"min_chars": 5}, graph)
    decon = graph_map.to_run_config("decontaminate_corpus", {"paths": ["h.jsonl"], "decontam_ngram": 8}, graph)
    assert decon == {"held_out_sets": {"paths": ["h.jsonl"]}, "curated_corpus": {"decontam_ngram": 8}}
    every = graph_map.accepted_fields("curate_corpus", ("held_out_sets", "curated_corpus"), graph)
    assert {"min_chars", "threshold", "paths", "decontam_ngram"} <= set(every)


def test_a_task_picks_the_variants_and_checks_each_assets_config():
    from training_assets.orchestration.catalog import describe_graph

    graph = describe_graph()
    spec = workflow.load_workflow()
    task = workflow.parse_task(spec, {"train": "pretrain", "align": ["grpo"],
                                      "config": {"sft_checkpoint": {"lora": {"r": 4}}}}, graph)
    stages = {s.name: s for s in workflow.resolve_stages(spec, task)}
    assert stages["train"].force == ["base_checkpoint"] and stages["align"].assets == ["grpo_checkpoint"]
    assert [g.asset for g in stages["align_eval"].gates] == ["grpo_eval_report"]
    assert task.config == {"sft_checkpoint": {"lora": {"r": 4}}}
    with pytest.raises(ToolInputError, match="task.align"):
        workflow.parse_task(spec, {"align": ["ppo"]}, graph)
    with pytest.raises(ToolInputError, match="merge_adapters needs dpo_checkpoint"):
        workflow.check_merge_inputs(task, {"dpo_checkpoint": {"materialized": False}})
