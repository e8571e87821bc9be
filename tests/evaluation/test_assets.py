"""The Dagster layer: eval report assets, their blocking gates, and registry_entry."""

import json

import dagster as dg
import pytest

from training_assets.defs.evaluation.assets import kind_eval_reports, merged_eval_report
from training_assets.defs.evaluation.agentic import agentic_eval_report
from training_assets.defs.registry.assets import registry_entry
from training_assets.defs.registry.resources import VllmDeployment
from training_assets.defs.resources import DataRoot, MlflowTracking
from training_assets.deploy import DeploymentTarget
from training_assets import evaluation
from training_assets.checkpoint_manifest import read_manifest, write_asset_manifest
from training_assets.lineage import Lineage
from training_assets.registry import ModelRegistry, register_checkpoint

REPORTS = {a.key.to_user_string(): a for a in kind_eval_reports}
sft_eval_report = REPORTS["sft_eval_report"]
FAST = {"benchmark_tasks": [], "max_bpb_vs_uniform": None, "max_new_tokens": 4}


def _run(root, tracking_uri, merged_config, assets=(sft_eval_report, merged_eval_report, agentic_eval_report, registry_entry)):
    config = {"merged_eval_report": {"config": merged_config}, "sft_eval_report": {"config": FAST}}
    return dg.materialize(list(assets), resources={"data_root": DataRoot(path=str(root)), "deployment": VllmDeployment(),
                                                   "mlflow": MlflowTracking(tracking_uri=tracking_uri)},
                          run_config={"ops": {k: v for k, v in config.items() if any(a.key.path[-1] == k for a in assets)}},
                          instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)


def _gate(result, asset):
    [evaluation] = [e for e in result.get_asset_check_evaluations() if e.asset_key == dg.AssetKey(asset)]
    return evaluation


def test_gate_passes_then_the_merged_adapter_is_registered_with_its_lineage(upstream, tracking_uri):
    # the fixture model is random-init, at chance on perplexity: the demo's bpb_vs_uniform gate is lifted here
    result = _run(upstream, tracking_uri, {"benchmark_limit": 2, "max_new_tokens": 4, "max_bpb_vs_uniform": 1.2})
    assert result.success
    assert _gate(result, "sft_eval_report").passed and _gate(result, "merged_eval_report").passed
    [report_event] = result.asset_materializations_for_node("merged_eval_report")
    assert {"pass_rate_by_category", "benchmarks", "chart", "failed_cases"} <= set(report_event.metadata)
    assert report_event.metadata["chart"].value.startswith("![pass rates](data:image/png;base64,")
    [entry_event] = result.asset_materializations_for_node("registry_entry")
    assert entry_event.metadata["version"].value == 1
    entry = ModelRegistry(tracking_uri).pick_for_role("generator")
    assert entry.lineage.trace_partitions == ("traces-0001-aa", "traces-0002-bb")
    assert entry.lineage.eval_summary["gate"]["passed"]
    assert "ta_held_out_perplexity/bits_per_byte" in entry.lineage.eval_summary["metrics"]
    stored = json.loads((upstream / "registry_entry" / "entry.json").read_text())
    assert stored["checkpoint_id"] == entry.checkpoint_id == "merged_adapter-dv-merged_adapter"
    # the same checkpoint again: the same version, no duplicate
    again = _run(upstream, tracking_uri, FAST, assets=(merged_eval_report, agentic_eval_report, registry_entry))
    assert again.asset_materializations_for_node("registry_entry")[0].metadata["version"].value == 1
    assert len(ModelRegistry(tracking_uri).list()) == 1


def test_failed_gate_blocks_registration_and_says_why(upstream, tracking_uri):
    result = _run(upstream, tracking_uri, {**FAST, "min_pass_rate": 1.0, "min_category_pass_rate": {"safety": 1.0}},
                  assets=(merged_eval_report, agentic_eval_report, registry_entry))
    gate = _gate(result, "merged_eval_report")
    assert not gate.passed
    assert "pass_rate" in gate.description and "< min 1.000" in gate.description
    assert result.asset_materializations_for_node("registry_entry") == []
    assert ModelRegistry(tracking_uri).list() == []


def test_a_checkpoint_worse_than_the_registered_model_is_not_promoted(upstream, tracking_uri, tiny_checkpoints):
    registry = ModelRegistry(tracking_uri)
    same_setup = evaluation.eval_config_id(evaluation.load_cases(), [], 30, FAST["max_new_tokens"])
    register_checkpoint(registry, tiny_checkpoints["base"], DeploymentTarget("generator", "agent"), "incumbent",
                        Lineage(eval_summary={"metrics": {"pass_rate": 0.99, "pass_rate/safety": 1.0},
                                              "eval_config": same_setup}))
    result = _run(upstream, tracking_uri, FAST, assets=(merged_eval_report, agentic_eval_report, registry_entry))
    gate = _gate(result, "merged_eval_report")
    assert not gate.passed and "worse than registered v1 (incumbent)" in gate.description
    assert result.asset_materializations_for_node("registry_entry") == []
    assert registry.pick_for_role("generator").checkpoint_id == "incumbent"


def test_an_incumbent_measured_another_way_is_evaluated_again_before_comparing(upstream, tracking_uri, tiny_checkpoints):
    registry = ModelRegistry(tracking_uri)
    register_checkpoint(registry, tiny_checkpoints["adapter"], DeploymentTarget("generator", "agent"), "incumbent",
                        Lineage(eval_summary={"metrics": {"pass_rate": 0.99}, "eval_config": "another-suite"}))
    result = _run(upstream, tracking_uri, FAST, assets=(merged_eval_report,))
    assert _gate(result, "merged_eval_report").passed  # the same weights, measured the same way: no regression
    [event] = result.asset_materializations_for_node("merged_eval_report")
    assert event.metadata["compared_to"].value == "v1 (incumbent), re-evaluated"


def test_registry_entry_refuses_a_report_about_another_checkpoint(upstream, tracking_uri):
    assert _run(upstream, tracking_uri, FAST, assets=(merged_eval_report,)).success
    manifest = read_manifest(upstream, "merged_adapter")
    write_asset_manifest(upstream, manifest.model_copy(update={"data_version": "dv-retrained"}))
    result = _run(upstream, tracking_uri, FAST, assets=(registry_entry,))
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "re-materialise the eval report" in str(failure.event_specific_data.error.message)
    assert ModelRegistry(tracking_uri).list() == []


def test_a_failed_align_gate_blocks_the_merge(upstream, tracking_uri):
    """Issue 11: merged_adapter depends on the DPO and GRPO eval reports, so their blocking gates stop it."""
    dpo_eval_report, grpo_eval_report = REPORTS["dpo_eval_report"], REPORTS["grpo_eval_report"]
    from training_assets.defs.training.assets import merged_adapter

    before = read_manifest(upstream, "merged_adapter")
    strict = {**FAST, "min_pass_rate": 1.0}
    result = dg.materialize([dpo_eval_report, grpo_eval_report, merged_adapter], raise_on_error=False,
                            resources={"data_root": DataRoot(path=str(upstream)),
                                       "mlflow": MlflowTracking(tracking_uri=tracking_uri)},
                            run_config={"ops": {"dpo_eval_report": {"config": strict},
                                                "grpo_eval_report": {"config": FAST}}},
                            instance=dg.DagsterInstance.ephemeral())
    assert not _gate(result, "dpo_eval_report").passed and _gate(result, "grpo_eval_report").passed
    assert result.asset_materializations_for_node("merged_adapter") == []
    assert read_manifest(upstream, "merged_adapter") == before  # the merge did not run


@pytest.mark.parametrize("key", ["sft_eval_report", "merged_eval_report", "dpo_eval_report", "grpo_eval_report",
                                 "registry_entry"])
def test_assets_are_in_the_code_location_with_their_gates(key):
    from training_assets.definitions import defs

    graph = defs.resolve_asset_graph()
    assert graph.has(dg.AssetKey(key))
    if key != "registry_entry":
        [check] = [c for c in graph.asset_check_keys if c.asset_key == dg.AssetKey(key)]
        assert check.name == "eval_gate"
