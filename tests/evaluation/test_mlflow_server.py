"""The registry against a real ``mlflow server`` with proxied artifacts (``mlflow-artifacts:/``).

One server per module (127.0.0.1, a free port, a SQLite backend copied from the migrated template,
``--artifacts-destination`` in a temp folder, ``--serve-artifacts``); its job runner is off, so it
starts no worker processes. Starting it is most of this module's time.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from training_assets.deploy import DeploymentTarget
from training_assets.registry import ModelRegistry, RegistryError, register_checkpoint, uri_path
from training_assets.registry_artifacts import load_hf_model

TARGET = DeploymentTarget("generator", "agent")
START_TIMEOUT_S = 150


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory, mlflow_template):
    folder = tmp_path_factory.mktemp("mlflow-server")
    shutil.copy(mlflow_template, folder / "mlflow.db")  # already migrated: the server skips MLflow's migrations
    artifacts = folder / "artifacts"
    port = _free_port()
    executable = Path(sys.executable).with_name("mlflow")
    command = [str(executable if executable.exists() else shutil.which("mlflow")), "server", "--host", "127.0.0.1",
               "--port", str(port), "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
               "--artifacts-destination", str(artifacts), "--serve-artifacts", "--workers", "1"]
    log = (folder / "server.log").open("wb")
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while not _up(url):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = (folder / "server.log").read_text(errors="replace")[-3000:]
                pytest.fail(f"mlflow server did not come up on {url} (exit code {process.poll()}):\n{tail}")
            time.sleep(0.3)
        yield SimpleNamespace(url=url, artifacts=artifacts)
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # the server and its uvicorn worker share the session
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


@pytest.fixture
def registry(mlflow_server, tmp_path, request):
    # one registered model per test: the server is shared by the module
    return ModelRegistry(mlflow_server.url, f"m-{request.node.name[5:30].replace('_', '-')}", serve_dir=tmp_path / "served")


def _stored(server, artifact_uri: str) -> Path:
    """Where the server keeps a run's proxied artifacts (mlflow-artifacts:/<path> -> destination/<path>)."""
    assert artifact_uri.startswith("mlflow-artifacts:/"), artifact_uri
    return server.artifacts / artifact_uri.removeprefix("mlflow-artifacts:/").lstrip("/")


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _logits(model, tokenizer):
    import torch

    with torch.no_grad():
        return model(**tokenizer("What is 12 * 7 + 3?", return_tensors="pt")).logits


def test_register_reregister_hand_over_and_load_by_alias(registry, mlflow_server, tiny_checkpoints, tmp_path,
                                                         monkeypatch):
    import torch
    from mlflow.artifacts import download_artifacts
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from training_assets.checkpoint_loading import load_checkpoint, load_tokenizer_dir

    first = register_checkpoint(registry, tiny_checkpoints["adapter"], TARGET, "ck-1")
    assert register_checkpoint(registry, tiny_checkpoints["adapter"], TARGET, "ck-1").version == first.version == 1
    other = tmp_path / "adapter2"
    shutil.copytree(tiny_checkpoints["adapter"], other)
    second = register_checkpoint(registry, other, TARGET, "ck-2")
    assert second.version == 2 and registry.pick_for_role("generator").version == 2  # the role was handed over
    assert [r["version"] for r in registry.list()] == [1, 2]

    # proxied artifacts on the server's disk; an adapter version holds the adapter, not its base
    client = registry.client
    adapter_run = client.get_run(second.run_id).info.artifact_uri
    base_version = client.get_model_version(registry.base_model_name, "1")
    base_bytes = _bytes(_stored(mlflow_server, client.get_run(base_version.run_id).info.artifact_uri))
    assert _bytes(_stored(mlflow_server, adapter_run)) * 5 < base_bytes
    assert len(client.search_model_versions(f"name='{registry.base_model_name}'")) == 1

    # served: downloaded into serve_dir (what vLLM reads), with a v<N> link
    served = uri_path(second.checkpoint_uri)
    assert (served / "model" / "checkpoint" / "adapter_model.safetensors").is_file()
    assert (registry.serve_dir / registry.model_name / "v2").resolve() == served.resolve()

    # any MLflow client pointed at the server (models:/ resolves through the global registry URI):
    # download by alias, read the base it names, apply the adapter with PEFT
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", mlflow_server.url)
    folder = Path(download_artifacts(artifact_uri=f"models:/{registry.model_name}@generator",
                                     dst_path=str(tmp_path / "dl")))
    assert (folder / "MLmodel").is_file() and "training_assets_hf" in (folder / "MLmodel").read_text()
    ref = __import__("json").loads((folder / "base.json").read_text())
    base_folder = Path(download_artifacts(artifact_uri=ref["model_uri"], dst_path=str(tmp_path / "base")))
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_folder / "checkpoint"), folder / "checkpoint")
    tokenizer = load_tokenizer_dir(folder / "tokenizer")
    expected, _ = load_checkpoint(other)
    assert torch.equal(_logits(model.eval(), tokenizer), _logits(expected, tokenizer))
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.delenv("MLFLOW_REGISTRY_URI")  # the helper asks the server it is given, not the globals
    helper, _ = load_hf_model(f"models:/{registry.model_name}@generator", mlflow_server.url, tmp_path / "helper")
    assert torch.equal(_logits(helper.eval(), tokenizer), _logits(expected, tokenizer))

    # rollback moves the alias back; the served folder of a version can be rebuilt from the server
    entry, _ = registry.rollback("generator")
    assert entry.version == 1 and registry.pick_for_role("generator").version == 1
    shutil.rmtree(uri_path(entry.checkpoint_uri))
    assert (registry.local_dir(entry) / "manifest.json").is_file()


def test_a_full_model_loads_with_transformers(registry, mlflow_server, tiny_checkpoints, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    entry = register_checkpoint(registry, tiny_checkpoints["base"], DeploymentTarget("base", "base"), "base-1")
    assert entry.base == {} and entry.adapter_uri is None and entry.run_url.startswith(mlflow_server.url)
    model, tokenizer = load_hf_model(f"models:/{registry.model_name}@base", mlflow_server.url, tmp_path / "dl")
    expected = AutoModelForCausalLM.from_pretrained(tiny_checkpoints["base"])
    assert torch.equal(_logits(model.eval(), tokenizer), _logits(expected.eval(), tokenizer))


def test_a_failure_mid_way_leaves_no_artifacts_on_the_server(registry, mlflow_server, tiny_checkpoints, monkeypatch):
    uploaded = []
    log_artifacts = registry.client.log_artifacts

    def recording(run_id, *args, **kwargs):
        uploaded.append(run_id)
        return log_artifacts(run_id, *args, **kwargs)

    def broken(*args, **kwargs):
        raise RuntimeError("database is locked")

    monkeypatch.setattr(registry.client, "log_artifacts", recording)
    monkeypatch.setattr(registry.client, "set_model_version_tag", broken)
    with pytest.raises(RegistryError, match="database is locked.*nothing registered.*its artifacts"):
        register_checkpoint(registry, tiny_checkpoints["adapter"], TARGET, "ck-1")
    monkeypatch.undo()
    assert uploaded, "the failure came after the upload"
    for run_id in uploaded:
        stored = _stored(mlflow_server, registry.client.get_run(run_id).info.artifact_uri)
        assert not stored.exists() or _bytes(stored) == 0, f"{stored} left behind"
    assert registry.list() == [] and registry.client.search_model_versions(f"name='{registry.base_model_name}'") == []
    assert register_checkpoint(registry, tiny_checkpoints["adapter"], TARGET, "ck-1").version >= 1  # and it can retry


def test_registry_entry_against_the_server_links_the_run_and_logs_the_gate(mlflow_server, upstream, tmp_path, monkeypatch):
    """Issue 12's setup: the asset registering into a proxied-artifact server, as in compose."""
    import dagster as dg
    from mlflow import MlflowClient

    from training_assets import evaluation, paths
    from training_assets.defs.registry.assets import registry_entry
    from training_assets.defs.registry.resources import VllmDeployment
    from training_assets.defs.resources import DataRoot, MlflowTracking
    from training_assets.storage import write_json_atomic
    from training_assets.checkpoint_manifest import read_manifest

    monkeypatch.setenv("TRAINING_ASSETS_SERVE_DIR", str(tmp_path / "served"))
    monkeypatch.delenv("VLLM_BASE_URL", raising=False)
    manifest = read_manifest(upstream, "merged_adapter")
    write_json_atomic(paths.asset_dir("merged_eval_report", upstream) / evaluation.REPORT_FILE,
                      {"checkpoint_asset": "merged_adapter", "checkpoint_data_version": manifest.data_version,
                       "metrics": {"pass_rate": 0.5}, "gate": {"passed": True, "reasons": ["pass_rate 0.5 >= 0.4"]}})
    write_json_atomic(paths.asset_dir("agentic_eval_report", upstream) / "report.json",  # random init: not applied
                      {"checkpoint_data_version": manifest.data_version, "applied": False,
                       "gate": {"passed": True, "reasons": ["the base is random init"]}})
    resources = {"data_root": DataRoot(path=str(upstream)), "deployment": VllmDeployment(),
                 "mlflow": MlflowTracking(tracking_uri=mlflow_server.url)}
    result = dg.materialize([registry_entry], resources=resources, instance=dg.DagsterInstance.ephemeral(),
                            run_config={"ops": {"registry_entry": {"config": {"model_name": "entry-model"}}}})
    [event] = result.asset_materializations_for_node("registry_entry")
    link = event.metadata["mlflow_run"]
    assert isinstance(link, dg.UrlMetadataValue) and link.url.startswith(f"{mlflow_server.url}/#/experiments/")
    assert event.metadata["model_uri"].value == "models:/entry-model/1"
    assert event.metadata["base_model_uri"].value == "models:/entry-model-base/1"
    run = MlflowClient(mlflow_server.url).get_run(event.metadata["mlflow_run_id"].value)
    assert run.data.metrics["pass_rate"] == 0.5 and run.data.tags["gate.passed"] == "true"
    assert run.info.artifact_uri.startswith("mlflow-artifacts:/")
