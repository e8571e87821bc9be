"""Checkpoint assets: Dagster Pipes and in-process runs of base_checkpoint, the whole chain through ``run_training``."""

import pytest

from training_assets.checkpoint_loading import load_checkpoint
from training_assets.checkpoint_manifest import read_manifest
from training_assets.trainers import jobs


def _checkpoint_asset(key: str):
    """A checkpoint asset of the factory's list (one per kind of training_assets.kinds)."""
    from training_assets.defs.training.assets import checkpoint_assets

    return next(a for a in checkpoint_assets if a.key.to_user_string() == key)


@pytest.fixture
def upstream(data_root, write_upstream):
    """The assets the trainers read: tokenizer and the four datasets, written through their own libraries."""
    return write_upstream(data_root)


def test_asset_graph_deps_and_tags():
    import dagster as dg

    from training_assets.defs.training import assets

    expected = {"base_checkpoint": {"pretrain_windows", "tokenizer", "base_model"},
                "sft_checkpoint": {"sft_dataset", "base_checkpoint", "tokenizer"},
                "dpo_checkpoint": {"sft_checkpoint", "preference_pairs", "sft_eval_report", "tokenizer"},
                "grpo_checkpoint": {"sft_checkpoint", "grpo_groups", "sft_eval_report", "tokenizer"},
                "merged_adapter": {"dpo_checkpoint", "grpo_checkpoint", "dpo_eval_report", "grpo_eval_report"}}
    for name, deps in expected.items():
        spec = assets.merged_adapter if name == "merged_adapter" else _checkpoint_asset(name)
        assert {k.to_user_string() for k in spec.asset_deps[dg.AssetKey(name)]} == deps, name
        assert spec.op.pool == "training", name  # one training step at a time: the pool, not a run tag
    from training_assets.defs.training.jobs import training_job

    assert training_job.name == "training_job" and "training_assets/resource" not in training_job.tags


def test_base_checkpoint_trains_in_a_pipes_subprocess_and_in_the_runs_process_alike(upstream, write_upstream, tmp_path):
    """``launcher: subprocess`` trains through Pipes; ``auto`` on one CPU process trains in the run's
    process: the same losses and weights from the same inputs (a second data root, so neither resumes
    the other's run), the step lines in the run log, the process's torch thread count left as it was."""
    import dagster as dg
    import torch
    from safetensors.torch import load_file

    from training_assets import tracking
    from training_assets.defs.resources import DataRoot, MlflowTracking
    base_checkpoint = _checkpoint_asset("base_checkpoint")

    config = {"max_steps": 3, "batch_size": 4}
    result = dg.materialize([base_checkpoint], resources={"data_root": DataRoot(path=str(upstream)), "mlflow": MlflowTracking()},
                            run_config={"ops": {"base_checkpoint": {"config": {**config, "launcher": "subprocess"}}}})
    assert result.success
    meta = result.asset_materializations_for_node("base_checkpoint")[0].metadata
    assert meta["launcher"].value == "subprocess"
    assert meta["steps"].value == 3 and meta["loss_curve"].value.startswith("![loss curve](data:image/png;base64,")
    for key in ("plan", "final_loss", "tokens_per_s", "peak_rss_mb", "tracker_run_id", "checkpoint_uri"):
        assert key in meta
    manifest = read_manifest(upstream, "base_checkpoint")
    assert manifest.dagster_run_id == result.run_id and manifest.kind == "full" and manifest.tracker == "mlflow"
    assert manifest.train.losses and manifest.plan["planned_steps"] == 3 and manifest.train.resumed_from is None
    # MLflow, embedded default: a SQLite store under the data root
    assert manifest.tracking_uri == tracking.default_tracking_uri(upstream) == f"sqlite:///{upstream / 'mlflow' / 'mlflow.db'}"
    client = tracking.mlflow_client(manifest.tracking_uri)
    run = client.get_run(manifest.tracker_run_id)
    params, tags = run.data.params, run.data.tags
    assert run.info.status == "FINISHED" and params["max_steps"] == "3" and params["plan.planned_steps"] == "3"
    # per-step metrics
    assert [m.value for m in client.get_metric_history(run.info.run_id, "loss")] == manifest.train.losses
    assert tags["dagster_run_id"] == result.run_id and tags["checkpoint_dir"] == manifest.checkpoint_dir
    assert "loss_curve.png" in [a.path for a in client.list_artifacts(run.info.run_id)]
    # artifacts live next to the store under the data root, not in ./mlruns of the working directory
    assert list((upstream / "mlflow" / "artifacts").rglob("loss_curve.png"))
    model, tok = load_checkpoint(upstream / "base_checkpoint")
    assert model.config.vocab_size == len(tok)

    second = write_upstream(tmp_path / "second")
    threads = torch.get_num_threads()
    instance = dg.DagsterInstance.ephemeral()
    in_process = dg.materialize([base_checkpoint], instance=instance,
                                resources={"data_root": DataRoot(path=str(second)), "mlflow": MlflowTracking()},
                                run_config={"ops": {"base_checkpoint": {"config": config}}})
    assert in_process.success
    assert in_process.asset_materializations_for_node("base_checkpoint")[0].metadata["launcher"].value == "in_process"
    again = read_manifest(second, "base_checkpoint")
    assert again.train.resumed_from is None and again.train.losses == manifest.train.losses
    weights, reference = (load_file(f"{m.checkpoint_dir}/model.safetensors") for m in (again, manifest))
    assert weights.keys() == reference.keys() and all(torch.equal(weights[k], v) for k, v in reference.items())
    assert again.data_version == manifest.data_version  # the same bytes, whichever launcher wrote them
    lines = [entry.user_message for entry in instance.all_logs(in_process.run_id)]
    assert any(m.startswith("step 3 loss ") for m in lines)  # the loop's lines, as Pipes forwards them
    assert torch.get_num_threads() == threads  # DEMO trains on one thread; the run's process keeps its own count


def test_the_pipes_result_is_what_the_manifest_is_written_from(upstream, monkeypatch):
    """The asset reads the subprocess's Pipes message; without one it fails instead of guessing."""
    import dagster as dg

    from training_assets.defs.resources import DataRoot, MlflowTracking
    from training_assets.defs.training import assets
    from training_assets.trainers import accelerate_launch

    seen = []
    real = dg.PipesClientCompletedInvocation.get_custom_messages

    def spy(self):
        seen.append(real(self))
        return seen[-1]

    monkeypatch.setattr(dg.PipesClientCompletedInvocation, "get_custom_messages", spy)
    resources = {"data_root": DataRoot(path=str(upstream)), "mlflow": MlflowTracking(tracking_uri="")}
    config = {"ops": {"base_checkpoint": {"config": {"max_steps": 1, "batch_size": 4, "tracker": "none",
                                                     "launcher": "subprocess"}}}}
    assert dg.materialize([_checkpoint_asset("base_checkpoint")], resources=resources, run_config=config).success
    [[message]] = seen
    manifest = read_manifest(upstream, "base_checkpoint")
    assert message[accelerate_launch.RESULT_MESSAGE]["losses"] == manifest.train.losses
    assert message[accelerate_launch.RESULT_MESSAGE]["checkpoint_dir"] == manifest.checkpoint_dir

    monkeypatch.setattr(assets, "RESULT_MESSAGE", "something_else")  # the subprocess still sends "training_result"
    failed = dg.materialize([_checkpoint_asset("base_checkpoint")], resources=resources, raise_on_error=False,
                            run_config={"ops": {"base_checkpoint": {"config": {"max_steps": 2, "batch_size": 4,
                                                                                "tracker": "none", "launcher": "subprocess"}}}})
    assert not failed.success
    assert "without reporting a training result through Pipes" in failed.get_step_failure_events()[0].step_failure_data.error.message
    assert read_manifest(upstream, "base_checkpoint") == manifest  # nothing written from a run that reported nothing


def test_in_process_launcher_refuses_several_processes(upstream):
    import dagster as dg

    from training_assets.defs.resources import DataRoot, MlflowTracking
    base_checkpoint = _checkpoint_asset("base_checkpoint")

    config = {"max_steps": 1, "batch_size": 4, "tracker": "none", "launcher": "in_process", "num_processes": 2}
    result = dg.materialize([base_checkpoint], raise_on_error=False,
                            resources={"data_root": DataRoot(path=str(upstream)), "mlflow": MlflowTracking()},
                            run_config={"ops": {"base_checkpoint": {"config": config}}})
    assert not result.success
    message = result.get_step_failure_events()[0].step_failure_data.error.message
    assert "launcher='in_process' trains one process; num_processes=2" in message


def _train(asset, root, **overrides):
    return jobs.run_training(jobs.prepare_job(asset, root, overrides), dagster_run_id="test").manifest


def test_the_chain_base_sft_dpo_grpo_merge(upstream):
    import torch

    base = _train("base_checkpoint", upstream, max_steps=2, batch_size=4)
    sft = _train("sft_checkpoint", upstream, max_steps=2, batch_size=2, packing=True)
    lora = {"r": 4, "alpha": 8}
    dpo = _train("dpo_checkpoint", upstream, max_steps=2, batch_size=4, lora=lora)
    grpo = _train("grpo_checkpoint", upstream, max_steps=1, batch_size=2, lora=lora,
                  grpo={"num_generations": 2, "max_new_tokens": 4})
    merged = jobs.merge_job(upstream)
    assert sft.config["base_model"] == base.checkpoint_dir
    assert dpo.base_model_dir == grpo.base_model_dir == merged.base_model_dir == sft.checkpoint_dir
    assert dpo.data_versions["sft_checkpoint"] == sft.data_version
    assert dpo.examples == {"dataset": "preference_pairs", "root": str(upstream), "limit": None}
    model, tok = load_checkpoint(upstream / "merged_adapter")
    with torch.no_grad():
        assert model(input_ids=torch.tensor([tok("The answer")["input_ids"]])).logits.isfinite().all()

    # same inputs and config again: the finished run is found and resumed, not retrained
    again = _train("dpo_checkpoint", upstream, max_steps=2, batch_size=4, lora=lora)
    assert again.train.resumed_from and again.train.losses == dpo.train.losses
    assert again.data_version == dpo.data_version


def test_merge_refuses_full_checkpoints(upstream):
    _train("base_checkpoint", upstream, max_steps=1, batch_size=4)
    _train("sft_checkpoint", upstream, max_steps=1, batch_size=2)
    _train("dpo_checkpoint", upstream, max_steps=1, batch_size=4)
    _train("grpo_checkpoint", upstream, max_steps=1, batch_size=2, grpo={"num_generations": 2, "max_new_tokens": 2})
    with pytest.raises(ValueError, match="full checkpoints"):
        jobs.merge_job(upstream)


def test_training_in_the_runs_process_stops_once_its_run_is_canceling(monkeypatch):
    """The step callback asks the instance (at most once per CANCEL_POLL_S) and raises Dagster's interrupt,
    which Dagster records as CANCELED for a CANCELING run; no signal needed."""
    from types import SimpleNamespace

    import dagster as dg

    from training_assets.defs.training import assets

    status = {"value": dg.DagsterRunStatus.STARTED}
    asked, lines = [], []

    def get_run_by_id(run_id):
        asked.append(run_id)
        return SimpleNamespace(status=status["value"])

    context = SimpleNamespace(run_id="r1", instance=SimpleNamespace(get_run_by_id=get_run_by_id),
                              log=SimpleNamespace(info=lines.append))
    check = assets.stop_when_canceled(context)
    check(1, {})
    check(2, {})  # within CANCEL_POLL_S: not asked again
    assert asked == ["r1"]
    status["value"] = dg.DagsterRunStatus.CANCELING
    monkeypatch.setattr(assets, "CANCEL_POLL_S", 0.0)
    with pytest.raises(dg.DagsterExecutionInterruptedError):
        check(3, {})
    assert lines == ["run r1 is CANCELING: training stops at step 3"]
