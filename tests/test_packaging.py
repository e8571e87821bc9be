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


# Folders whose scripts run as `python FOLDER/x.py`: Python puts FOLDER first on sys.path, so a file
# there named like an installed package (benchmarks/kernels.py once shadowed Hugging Face's `kernels`
# and broke every transformers import in benchmarks/) or a stdlib module replaces it for the script.
SCRIPT_FOLDERS = ("benchmarks", "examples", "deploy")
# kernels/ is the one deliberate exception: a namespace folder (no __init__.py), which the import
# system ranks below any regular package of that name, and installed as training_assets_kernels.
NAMESPACE_EXCEPTIONS = {"kernels"}


def _taken_top_level_names() -> set[str]:
    """Top-level import names of the stdlib and of every installed distribution but this project."""
    owners = importlib.metadata.packages_distributions()
    return {name for name, dists in owners.items() if set(dists) != {"training-assets"}} | set(sys.stdlib_module_names)


def test_no_script_or_top_level_module_takes_a_name_an_installed_package_owns():
    taken = _taken_top_level_names()
    clashes = [str(p.relative_to(REPO)) for folder in SCRIPT_FOLDERS for p in sorted((REPO / folder).glob("*.py"))
               if p.stem in taken]
    clashes += [p.name for p in sorted(REPO.iterdir())
                if (p.suffix == ".py" or (p.is_dir() and p.name.isidentifier())) and p.stem in taken
                and p.name not in NAMESPACE_EXCEPTIONS]
    assert clashes == [], f"rename these: installed packages or the stdlib own their names: {clashes}"
    assert not (REPO / "kernels" / "__init__.py").exists(), "kernels/ must stay a namespace folder (see above)"


def test_a_benchmark_script_sees_the_installed_packages_not_its_neighbours():
    """What `python benchmarks/x.py` sees: its folder first on sys.path, then transformers' hub-kernels import."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import kernels, transformers.integrations.hub_kernels\n"
        "assert 'site-packages' in kernels.__file__, kernels.__file__\n"
    )
    for folder in SCRIPT_FOLDERS:
        proc = subprocess.run([sys.executable, "-c", code, str(REPO / folder)], cwd="/", capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, f"{folder}/: {proc.stderr[-800:]}"
