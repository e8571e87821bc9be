"""The trainers' and evaluation's layers, held by the import graph (grimp counts imports inside functions too).

Inside ``trainers/``: config, plan <- checkpoints, modeling <- loop <- base <- the kind trainers, no
circle. Evaluation sits beside the trainers and below them: ``trainers.eval_hooks`` imports it, it
imports nothing from ``training_assets.trainers``; a checkpoint's manifest and loading sit below
both. An import inside a function only defers a heavy optional dependency, and says so.
"""

import ast
from pathlib import Path

import grimp
import pytest

import training_assets

TRAINERS = "training_assets.trainers"
EVALUATION = "training_assets.evaluation"
BELOW_BOTH = ("training_assets.checkpoint_manifest", "training_assets.checkpoint_loading")
# top to bottom; a lower layer never reaches a higher one, the modules of a layer never reach each other
TRAINER_LAYERS = [grimp.Layer("dpo", "grpo"), grimp.Layer("pretrain", "sft"), grimp.Layer("base"), grimp.Layer("loop"),
                  grimp.Layer("checkpoints", "modeling"), grimp.Layer("plan"), grimp.Layer("config")]
# optional extras (train, eval, gpu) and Numba, each a second or more to import: the only reasons to wait
DEFERRABLE = {"torch", "transformers", "peft", "accelerate", "safetensors", "tokenizers", "huggingface_hub",
              "matplotlib", "lm_eval", "liger_kernel", "numba", "training_assets_kernels"}
ROOT = Path(training_assets.__file__).parent
FILES = sorted([*(ROOT / "trainers").glob("*.py"), *(ROOT / "evaluation").glob("*.py"),
                *(ROOT / f"{m.rsplit('.', 1)[1]}.py" for m in BELOW_BOTH)])


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("training_assets", cache_dir=None)  # no cache folder written into the repo


def test_no_trainers_module_reaches_itself(graph):
    circles = []
    for module in sorted(m for m in graph.modules if m == TRAINERS or m.startswith(TRAINERS + ".")):
        for imported in graph.find_modules_directly_imported_by(module):
            back = graph.find_shortest_chain(imported, module)
            if back is not None:
                circles.append(" -> ".join((module, *back)))
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_trainers_import_one_way_down_their_layers(graph):
    illegal = graph.find_illegal_dependencies_for_layers(TRAINER_LAYERS, containers={TRAINERS})
    assert not illegal, sorted(f"{d.importer} reaches {d.imported}" for d in illegal)


def test_evaluation_never_reaches_the_trainers(graph):
    # as packages: importing any trainers.* module would run trainers/__init__ (the whole training side)
    assert not graph.find_shortest_chains(EVALUATION, TRAINERS)


@pytest.mark.parametrize("module", BELOW_BOTH)
def test_checkpoint_manifest_and_loading_sit_below_trainers_and_evaluation(graph, module):
    assert not graph.find_shortest_chains(module, TRAINERS) and not graph.find_shortest_chains(module, EVALUATION)


def _module_file(name):
    """The source file of a ``training_assets`` module (a package's ``__init__.py``), else None."""
    if name.split(".")[0] != "training_assets":
        return None
    path = ROOT.joinpath(*name.split(".")[1:])
    return next((p for p in (path.with_suffix(".py"), path / "__init__.py") if p.is_file()), None)


def _imported_names(node):
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    # ``from training_assets.trainers import modeling`` imports the submodule
    return [f"{node.module}.{a.name}" if _module_file(f"{node.module}.{a.name}") else node.module for a in node.names]


def _heavy(name, seen=None):
    """Whether importing ``name`` imports a deferrable package (at the top level of it or of a module it imports)."""
    if name.split(".")[0] in DEFERRABLE:
        return True
    path, seen = _module_file(name), set() if seen is None else seen
    if path is None or name in seen:
        return False
    seen.add(name)
    tops = [n for n in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(n, ast.Import | ast.ImportFrom)]
    return any(_heavy(imported, seen) for node in tops for imported in _imported_names(node))


def _imports_inside_functions(path):
    for function in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from (n for n in ast.walk(function) if isinstance(n, ast.Import | ast.ImportFrom))


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_an_import_inside_a_function_only_defers_a_heavy_dependency_and_says_so(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    problems = []
    for node in _imports_inside_functions(path):
        where = f"{path.parent.name}/{path.name} line {node.lineno}"
        light = sorted({n for n in _imported_names(node) if not _heavy(n)})
        if light:
            problems.append(f"{where}: imports {light} inside a function; import it at the top "
                            "(only a module that imports a DEFERRABLE package may wait)")
        elif not any("#" in line for line in lines[node.lineno - 1:node.end_lineno]):
            problems.append(f"{where}: a deferred import needs a comment giving the reason")
    assert not problems, "\n".join(problems)
