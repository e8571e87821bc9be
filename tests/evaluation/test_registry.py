"""The role-bound MLflow registry: idempotent registration, lineage, rollback, all-or-nothing."""

import pytest

from training_assets.checkpoint_manifest import CheckpointManifest
from training_assets.deploy import DeploymentTarget
from training_assets.lineage import Lineage, LineageError, collect_lineage
from training_assets.registry import ModelRegistry, RegistryError, promotion_verdict, register_checkpoint, uri_path

TARGET = DeploymentTarget("generator", "agent")


@pytest.fixture
def registry(tracking_uri):
    return ModelRegistry(tracking_uri)


def test_same_checkpoint_id_gives_the_same_version(registry, tiny_checkpoints):
    first = register_checkpoint(registry, tiny_checkpoints["adapter"], TARGET, "ck-1", Lineage(trace_partitions=("b1",)))
    again = register_checkpoint(registry, tiny_checkpoints["adapter"], TARGET, "ck-1")
    assert first.version == again.version == 1
    assert "already registered" in again.note
    assert [r["version"] for r in registry.list()] == [1]
    assert again.lineage.trace_partitions == ("b1",)  # the stored entry, not the second call's arguments


def test_pick_for_role_follows_the_alias_and_rollback_moves_it_back(registry, tiny_checkpoints):
    assert registry.serving("generator") is None  # nothing promoted yet: the first registration for the role
    with pytest.raises(RegistryError, match="no model registered for role 'generator'"):
        registry.pick_for_role("generator")
    register_checkpoint(registry, tiny_checkpoints["adapter"], TARGET, "ck-1")
    assert registry.serving("generator").checkpoint_id == "ck-1"
    register_checkpoint(registry, tiny_checkpoints["base"], TARGET, "ck-2")
    assert registry.pick_for_role("generator").checkpoint_id == "ck-2"
    assert registry.history("generator") == [1, 2]
    entry, reason = registry.rollback("generator")
    assert entry.checkpoint_id == "ck-1" and "version 2 -> 1" in reason
    assert registry.pick_for_role("generator").version == 1
    with pytest.raises(RegistryError, match="nothing to roll back to"):
        registry.rollback("generator")
    entry, _ = registry.rollback("generator", to_version=2)  # promote a chosen version again
    assert registry.pick_for_role("generator").version == 2
    # re-registering a known checkpoint never re-promotes it behind the operator's back
    registry.rollback("generator")
    register_checkpoint(registry, tiny_checkpoints["base"], TARGET, "ck-2")
    assert registry.pick_for_role("generator").version == 1


def test_roles_are_independent_aliases(registry, tiny_checkpoints):
    register_checkpoint(registry, tiny_checkpoints["adapter"], TARGET, "ck-1")
    register_checkpoint(registry, tiny_checkpoints["base"], DeploymentTarget("judge", "judge"), "ck-2")
    assert registry.pick_for_role("generator").version == 1
    assert registry.pick_for_role("judge").version == 2
    assert {r["version"]: r["roles"] for r in registry.list()} == {1: ["generator"], 2: ["judge"]}
    with pytest.raises(RegistryError, match="no model registered for role 'critic'"):
        registry.pick_for_role("critic")


def test_registered_checkpoint_is_a_snapshot_that_retraining_cannot_change(registry, tiny_checkpoints, tmp_path):
    import shutil

    from training_assets.checkpoint_loading import resolve_checkpoint

    source = tmp_path / "adapter"
    shutil.copytree(tiny_checkpoints["adapter"], source)
    entry = register_checkpoint(registry, source, TARGET, "ck-1")
    (source / "adapter_model.safetensors").write_bytes(b"retrained")
    dirs = resolve_checkpoint(uri_path(entry.checkpoint_uri))
    assert dirs.is_adapter and (dirs.checkpoint_dir / "adapter_model.safetensors").read_bytes() != b"retrained"
    assert (dirs.tokenizer_dir / "tokenizer.json").is_file() and (dirs.base_model_dir / "config.json").is_file()
    assert entry.source_uri.endswith("/adapter")
    assert f"--lora-modules agent={dirs.checkpoint_dir}" in entry.deployment["serve_command"]


def test_register_is_public_and_the_stored_model_keeps_the_typed_manifest(registry, upstream):
    from training_assets.registry_artifacts import stored_folder
    from training_assets.checkpoint_loading import resolve_checkpoint
    from training_assets.checkpoint_manifest import read_manifest, read_manifest_file

    entry = registry.register(upstream / "merged_adapter", TARGET, "merged-1", Lineage(trace_partitions=("b1",)))
    assert register_checkpoint(registry, upstream / "merged_adapter", TARGET, "merged-1").version == entry.version
    model_dir = stored_folder(registry.client, entry.run_id)
    stored = read_manifest_file(model_dir)
    source = read_manifest(upstream, "merged_adapter")
    # relative paths, valid wherever the artifacts land; provenance of the source kept; a real MLflow model
    assert (stored.checkpoint_dir, stored.tokenizer_dir) == ("checkpoint", "tokenizer")
    assert (stored.data_version, stored.data_versions, stored.tracker_run_id) == (
        source.data_version, source.data_versions, source.tracker_run_id)
    assert (model_dir / "MLmodel").is_file() and not (model_dir / "base_model").exists()
    served = resolve_checkpoint(uri_path(entry.checkpoint_uri))
    assert served.checkpoint_dir == model_dir / "checkpoint"
    assert entry.base["model_uri"] == "models:/agent-model-base/1" and entry.base["content_hash"].startswith("sha256:")


def _artifact_bytes(client, run_id, path=""):
    total = 0
    for info in client.list_artifacts(run_id, path or None):
        total += _artifact_bytes(client, run_id, info.path) if info.is_dir else info.file_size
    return total


def test_an_adapter_version_stores_the_adapter_and_names_its_registered_base(registry, tiny_checkpoints, tmp_path):
    import shutil

    other = tmp_path / "adapter2"
    shutil.copytree(tiny_checkpoints["adapter"], other)  # a second adapter (a re-training) on the same base
    first = register_checkpoint(registry, tiny_checkpoints["adapter"], TARGET, "ck-1")
    second = register_checkpoint(registry, other, TARGET, "ck-2")
    assert first.base == second.base, "one base version, found again by its content hash"
    base_versions = registry.client.search_model_versions("name='agent-model-base'")
    assert [int(v.version) for v in base_versions] == [1]
    base_bytes = _artifact_bytes(registry.client, base_versions[0].run_id, "model/checkpoint")
    adapter_bytes = _artifact_bytes(registry.client, second.run_id, "model")
    assert adapter_bytes * 5 < base_bytes, (adapter_bytes, base_bytes)
    version = registry.client.get_model_version("agent-model", "2")
    assert version.tags["base_model_uri"] == "models:/agent-model-base/1" and version.tags["kind"] == "adapter"


def test_eval_metrics_and_the_gate_are_on_the_run_and_the_version(registry, tiny_checkpoints):
    lineage = Lineage(eval_summary={"metrics": {"pass_rate": 0.75, "suite": {"n_cases": 8}, "label": "x"},
                                    "gate": {"passed": True, "reasons": ["pass_rate 0.75 >= 0.5"]}})
    entry = register_checkpoint(registry, tiny_checkpoints["base"], TARGET, "ck-1", lineage)
    run = registry.client.get_run(entry.run_id)
    assert run.data.metrics == {"pass_rate": 0.75, "suite.n_cases": 8.0}
    assert run.data.tags["gate.passed"] == "true" and run.data.tags["gate.reasons"] == "pass_rate 0.75 >= 0.5"
    tags = registry.client.get_model_version("agent-model", str(entry.version)).tags
    assert tags["metric.pass_rate"] == "0.75" and tags["gate.passed"] == "true" and tags["kind"] == "full"
    assert entry.model_uri == "models:/agent-model/1" and entry.run_url is None  # a SQLite store has no UI address


def test_a_failure_mid_registration_leaves_the_registry_as_it_was(registry, tiny_checkpoints, monkeypatch):
    register_checkpoint(registry, tiny_checkpoints["adapter"], TARGET, "ck-1")

    def broken(*args, **kwargs):
        raise RuntimeError("database is locked")

    monkeypatch.setattr(registry.client, "set_model_version_tag", broken)
    with pytest.raises(RegistryError, match="database is locked.*nothing registered"):
        register_checkpoint(registry, tiny_checkpoints["base"], TARGET, "ck-2")
    monkeypatch.undo()
    runs = registry.client.search_runs([registry._experiment_id()], run_view_type=3)  # ViewType.ALL
    failed = [r for r in runs if r.data.tags.get("checkpoint_id") == "ck-2"]
    assert [r.info.lifecycle_stage for r in failed] == ["deleted"]
    assert not uri_path(failed[0].info.artifact_uri).exists() or not any(uri_path(failed[0].info.artifact_uri).iterdir())
    assert not (registry.serve_dir / "agent-model" / failed[0].info.run_id).exists()
    assert [r["checkpoint_id"] for r in registry.list()] == ["ck-1"]
    assert registry.pick_for_role("generator").checkpoint_id == "ck-1"
    assert registry.history("generator") == [1]
    assert registry.find("ck-2") is None
    assert register_checkpoint(registry, tiny_checkpoints["base"], TARGET, "ck-2").version > 1  # and it can retry


def test_bad_role_or_checkpoint_id_is_refused_before_anything_happens(registry, tiny_checkpoints):
    with pytest.raises(ValueError, match="role 'Gen Erator'"):
        register_checkpoint(registry, tiny_checkpoints["adapter"], DeploymentTarget("Gen Erator", "x"), "ck-1")
    with pytest.raises(ValueError, match="checkpoint_id"):
        register_checkpoint(registry, tiny_checkpoints["adapter"], TARGET, "ck' or '1'='1")


def test_lineage_answers_which_traces_trained_the_model(upstream, registry):
    """Exactly the batches behind the rows each checkpoint of the chain trained on: traces-0003-cc
    reached only an SFT row past the run's example limit, so it is not named."""
    lineage = collect_lineage(upstream, "merged_adapter", {"metrics": {"pass_rate": 0.5}})
    assert lineage.trace_partitions == ("traces-0001-aa", "traces-0002-bb")
    sft_only = collect_lineage(upstream, "sft_checkpoint")
    assert sft_only.trace_partitions == ("traces-0001-aa", "traces-0002-bb")  # its base trained on windows of both
    assert lineage.corpus_version == "corpus-v1" and len(lineage.tokenizer_hash) >= 16
    assert lineage.dataset_versions == {"grpo_groups": "gg-1", "preference_pairs": "pp-1", "pretrain_windows": "pw-1",
                                        "sft_dataset": "sft-1"}
    assert set(lineage.training_run_ids) == {"base_checkpoint", "sft_checkpoint", "dpo_checkpoint", "grpo_checkpoint",
                                             "merged_adapter"}
    assert lineage.training_run_ids["sft_checkpoint"]["mlflow"] == "mlflow-sft_checkpoint"
    entry = register_checkpoint(registry, upstream / "merged_adapter", TARGET, "merged-1", lineage)
    picked = registry.pick_for_role("generator")
    assert picked.lineage == entry.lineage and picked.lineage.eval_summary["metrics"]["pass_rate"] == 0.5


def test_lineage_refuses_a_chain_whose_upstream_was_retrained(upstream):
    from training_assets.checkpoint_manifest import read_manifest, write_asset_manifest

    manifest = read_manifest(upstream, "sft_checkpoint")
    write_asset_manifest(upstream, manifest.model_copy(update={"data_version": "dv-sft-retrained"}))
    with pytest.raises(LineageError, match="sft_checkpoint is now dv-sft-retrained"):
        collect_lineage(upstream, "merged_adapter")


@pytest.mark.parametrize(("report", "ok", "why"), [
    ({"checkpoint_data_version": "dv-1", "gate": {"passed": True, "reasons": []}}, True, "gate passed"),
    ({"checkpoint_data_version": "dv-1", "gate": {"passed": False, "reasons": ["pass_rate 0.1 < min 0.5"]}}, False,
     "pass_rate 0.1 < min 0.5"),
    ({"checkpoint_data_version": "dv-0", "gate": {"passed": True, "reasons": []}}, False, "re-materialise the eval report"),
])
def test_only_a_checkpoint_whose_own_gate_passed_is_promotable(report, ok, why):
    manifest = CheckpointManifest(asset="merged_adapter", kind="adapter", checkpoint_dir="a", base_model_dir="b",
                                  tokenizer_dir="t", data_version="dv-1")
    verdict, reason = promotion_verdict(report, manifest)
    assert verdict is ok and why in reason
