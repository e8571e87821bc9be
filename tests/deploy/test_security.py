"""Security defaults that are properties of the source: nothing unpickles a file it did not make
safely, nothing runs code shipped inside a model directory, and the local UI binds loopback."""

import ast
from pathlib import Path

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
