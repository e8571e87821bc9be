"""Security defaults that are properties of the source: nothing unpickles a file it did not make
safely, nothing runs code shipped inside a model directory, and the local UI binds loopback."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(REPO / "training_assets").rglob("*.py"), *(REPO / "kernels").rglob("*.py")])


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    return ""


def keyword(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name and isinstance(kw.value, ast.Constant):
            return kw.value.value
    return None


def unsafe_loads(source: str) -> list[str]:
    """Each call that can execute code from a file's contents, with why."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = dotted(node.func)
        where = f"line {node.lineno}: {name}"
        if name in {"pickle.load", "pickle.loads", "cloudpickle.load", "cloudpickle.loads", "dill.load",
                    "dill.loads", "joblib.load", "pd.read_pickle", "pandas.read_pickle", "torch.serialization.load"}:
            found.append(f"{where} unpickles")
        elif name == "torch.load" and keyword(node, "weights_only") is not True:
            found.append(f"{where} without weights_only=True")
        elif name in {"np.load", "numpy.load"} and keyword(node, "allow_pickle") is True:
            found.append(f"{where} with allow_pickle=True")
        elif keyword(node, "trust_remote_code") is True:
            found.append(f"{where} with trust_remote_code=True")
        elif keyword(node, "use_safetensors") is False:
            found.append(f"{where} with use_safetensors=False")
    return found


def test_the_checker_catches_each_unsafe_pattern():
    bad = """
import pickle, torch, numpy as np
pickle.load(f)
torch.load(p)
torch.load(p, weights_only=False)
np.load(p, allow_pickle=True)
AutoModel.from_pretrained(d, trust_remote_code=True)
AutoModel.from_pretrained(d, use_safetensors=False)
"""
    assert len(unsafe_loads(bad)) == 6
    assert unsafe_loads("import torch\ntorch.load(p, weights_only=True)\nnp.load(p)\n") == []


def test_no_source_file_unpickles_or_runs_shipped_code():
    assert SOURCES, "no sources found"
    problems = {str(p.relative_to(REPO)): unsafe_loads(p.read_text(encoding="utf-8")) for p in SOURCES}
    problems = {path: found for path, found in problems.items() if found}
    assert not problems, f"unsafe deserialisation: {problems}"


def test_local_ui_binds_loopback():
    makefile = (REPO / "Makefile").read_text()
    ui_lines = [line for line in makefile.splitlines() if "dagster dev" in line or "dagster-webserver" in line]
    assert ui_lines and all("-h 127.0.0.1" in line for line in ui_lines), ui_lines


def test_registry_entry_takes_its_server_from_the_deployment_resource(tmp_path, monkeypatch):
    """A run config naming a server the instance does not allow fails before anything is read or sent."""
    import dagster as dg

    from training_assets.defs.registry.assets import registry_entry
    from training_assets.defs.registry.resources import VllmDeployment
    from training_assets.defs.resources import DataRoot, MlflowTracking

    monkeypatch.delenv("VLLM_BASE_URL", raising=False)
    monkeypatch.setenv("TRAINING_ASSETS_DEPLOY_ALLOWED_URLS", "http://vllm:8000")
    resources = {"data_root": DataRoot(path=str(tmp_path)), "deployment": VllmDeployment(),
                 "mlflow": MlflowTracking(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")}
    result = dg.materialize([registry_entry], resources=resources, raise_on_error=False,
                            run_config={"ops": {"registry_entry": {"config": {"base_url": "http://evil.example:8000"}}}})
    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    text = str(failure.step_failure_data.error)
    assert "base_url" in text and "not in the allow-list ['http://vllm:8000']" in text
    # the resource's own server and the listed ones are what a run may use
    resource = VllmDeployment(base_url="http://vllm:8000/v1", allowed_urls=["https://models.internal"])
    assert resource.target("generator", "agent").base_url == "http://vllm:8000"
    assert resource.target("generator", "agent", "https://models.internal/v1").base_url == "https://models.internal"
    with pytest.raises(dg.Failure, match="not in the allow-list"):
        resource.target("generator", "agent", "http://127.0.0.1:8000")
