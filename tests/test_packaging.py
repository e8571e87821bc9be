"""Packaging: the kernels' import name cannot collide, and every package ships."""

import importlib
import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    """pyproject lists packages by hand (kernels/ maps to another import name); a new folder must be added."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "training_assets").rglob("__init__.py")
             if "__pycache__" not in p.parts}
    assert found - listed == set(), f"add these packages to [tool.setuptools] packages: {sorted(found - listed)}"
    assert "training_assets_kernels" in listed


def test_hugging_face_kernels_and_ours_import_side_by_side_from_the_repo_root():
    """`kernels` is Hugging Face's hub-kernels package (transformers imports it on GPU hosts); this
    project's kernels/ folder is `training_assets_kernels` and must not shadow it, even with the
    repository root first on sys.path (python -m / dagster dev from a checkout)."""
    assert importlib.metadata.packages_distributions()["kernels"] == ["kernels"]
    code = (
        "import kernels, training_assets_kernels.dedup as ours, transformers.integrations.hub_kernels as hk\n"
        "import numpy as np\n"
        "assert 'site-packages' in kernels.__file__, kernels.__file__\n"
        "assert hasattr(kernels, 'get_kernel'), dir(kernels)\n"
        "from transformers.utils.import_utils import _is_package_available\n"
        "assert _is_package_available('kernels'), 'transformers does not find the hub-kernels distribution'\n"
        "print(ours.__file__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).resolve() == (REPO / "kernels" / "dedup.py").resolve()
