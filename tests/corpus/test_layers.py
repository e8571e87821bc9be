"""The data engine's layers (``data_engine/engines.py``), held by its import graph: building blocks <- the
local engine and the Ray engine side by side <- ``engines``. No import circle, and no import inside a
function except a deferred optional dependency, named with its reason."""

import ast
from pathlib import Path

import grimp
import pytest

import training_assets.data_engine

PACKAGE = "training_assets.data_engine"
FOLDER = Path(training_assets.data_engine.__file__).parent
MODULES = sorted(p.stem for p in FOLDER.glob("*.py") if p.stem != "__init__")
RAY_ENGINE = [m for m in MODULES if m.startswith("ray_")]
LOCAL_ENGINE = ["local_engine"]
DISPATCH = ["engines"]
BUILDING_BLOCKS = [m for m in MODULES if m not in RAY_ENGINE + LOCAL_ENGINE + DISPATCH]
DEFERRABLE = {"ray", "datasets"}  # optional extras whose import costs seconds: imported where first needed


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("training_assets", cache_dir=None)  # no cache folder written into the repo


def _reaches(graph, importer, imported):
    return graph.find_shortest_chain(f"{PACKAGE}.{importer}", f"{PACKAGE}.{imported}")


def test_no_module_of_the_data_engine_reaches_itself(graph):
    circles = []
    for module in [PACKAGE, *(f"{PACKAGE}.{m}" for m in MODULES)]:
        for imported in graph.find_modules_directly_imported_by(module):
            back = graph.find_shortest_chain(imported, module)
            if back is not None:
                circles.append(" -> ".join((module, *back)))
    assert not circles, "import circles:\n" + "\n".join(circles)


@pytest.mark.parametrize("module", BUILDING_BLOCKS + LOCAL_ENGINE)
def test_the_local_side_never_imports_the_ray_engine(graph, module):
    chains = [_reaches(graph, module, ray) for ray in RAY_ENGINE]
    assert not any(chains), [c for c in chains if c]


@pytest.mark.parametrize("module", BUILDING_BLOCKS + RAY_ENGINE)
def test_only_the_dispatch_knows_the_local_engine(graph, module):
    chains = [_reaches(graph, module, upper) for upper in LOCAL_ENGINE + DISPATCH]
    assert not any(chains), [c for c in chains if c]


def test_the_package_runs_both_engines_through_the_dispatch():
    from training_assets.data_engine import curate, dedup, engines

    assert (curate, dedup) == (engines.curate, engines.dedup)


def _imports_inside_functions(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(function):
                if isinstance(node, ast.Import):
                    yield node, [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    yield node, [node.module or ""]


@pytest.mark.parametrize("module", MODULES)
def test_an_import_inside_a_function_only_defers_an_optional_dependency_and_says_so(module):
    path = FOLDER / f"{module}.py"
    lines = path.read_text(encoding="utf-8").splitlines()
    for node, names in _imports_inside_functions(path):
        where = f"{path.name} line {node.lineno}"
        assert all(n.split(".")[0] in DEFERRABLE for n in names), \
            f"{where}: imports {names} inside a function; import it at the top (only {sorted(DEFERRABLE)} may wait)"
        assert "#" in lines[node.lineno - 1], f"{where}: a deferred import needs a comment giving the reason"
