"""The architecture as contracts: import-linter's layers (pyproject ``[tool.importlinter]``) and no import circles.

The layers, top to bottom: cli, commands, agent, orchestration, definitions, defs, then the library
from the whole-run pipeline down to storage, paths, settings and the kinds table. A module may
import only layers below its own; ``lint-imports`` counts imports inside functions too.
"""

import ast
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[1]


def test_the_import_linter_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_of_the_package_reaches_itself_through_its_imports():
    graph = grimp.build_graph("training_assets", cache_dir=None)
    assert _cycles(graph) == []


def test_every_top_level_module_has_its_layer():
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    placed = {name.strip() for layer in layers for name in layer.split("|")}
    package = REPO / "training_assets"
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    modules |= {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    assert modules - placed == set(), "give these a layer in pyproject's [tool.importlinter] layers contract"


# lint pragmas say nothing about why an import waits: the reason is the words left after them
PRAGMA = re.compile(r"noqa(:\s*[\w, ]+)?|type:\s*ignore(\[[^\]]*\])?|pragma:[^#]*")


def _reason_by_line(path: Path) -> dict[int, str]:
    """Each line's comment, pragmas removed (tokenize: a ``#`` inside a string is not a comment)."""
    with path.open("rb") as f:
        comments = [(t.start[0], t.string) for t in tokenize.tokenize(f.readline) if t.type == tokenize.COMMENT]
    return {line: PRAGMA.sub("", text).strip("#():; ") for line, text in comments}


def _unexplained_deferred_imports(path: Path) -> list[str]:
    tree, reasons = ast.parse(path.read_text(encoding="utf-8")), _reason_by_line(path)
    deferred = {node.lineno: node for function in ast.walk(tree) if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
                for node in ast.walk(function) if isinstance(node, ast.Import | ast.ImportFrom)}
    return [f"{path.relative_to(REPO)} line {line}" for line, node in sorted(deferred.items())
            if not any(reasons.get(n) for n in range(node.lineno, node.end_lineno + 1))]


def test_every_import_inside_a_function_says_what_it_defers_and_why():
    """An import waits inside a function only to keep a heavy dependency off a light path (the CLI's
    --help, the MCP server's start, ``import training_assets.trainers`` without torch), and its
    line says which and why: ``import torch  # the train extra: ~2 s, only when training``."""
    unexplained = [where for path in sorted((REPO / "training_assets").rglob("*.py"))
                   for where in _unexplained_deferred_imports(path)]
    assert not unexplained, ("imports inside a function without a comment on their line saying what they defer and "
                             "why (or move them to the top of the module):\n" + "\n".join(unexplained))
