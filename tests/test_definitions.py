"""The code location loads, validates with Dagster's own CLI, and keeps its contract names."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import dagster as dg

from training_assets.definitions import defs

REPO = Path(__file__).resolve().parents[1]

# The contract other parts and users' scripts rely on (ARCHITECTURE.md); change it deliberately.
ASSET_KEYS = sorted([
    "raw_traces",
    "held_out_sets", "minhash_signatures", "curated_corpus",
    "tokenizer",
    "selected_traces", "sft_dataset", "preference_pairs", "grpo_groups", "pretrain_windows", "binary_feedback",
    "base_checkpoint", "sft_checkpoint", "dpo_checkpoint", "grpo_checkpoint", "kto_checkpoint", "orpo_checkpoint",
    "merged_adapter",
    "sft_eval_report", "dpo_eval_report", "grpo_eval_report", "kto_eval_report", "orpo_eval_report",
    "merged_eval_report", "agentic_eval_report",
    "registry_entry",
])
ROOT_ASSETS = ["base_model"]  # the pretrained weights (or random init): a root of its own, beside the traces


def test_every_asset_is_reachable_from_the_traces():
    """One connected lineage: every asset descends from raw_traces or the held-out sets (base_model is a root)."""
    graph = defs.resolve_asset_graph()
    roots = {dg.AssetKey("raw_traces"), dg.AssetKey("held_out_sets")}
    reached = set(roots)
    for key in graph.toposorted_asset_keys:
        if graph.get(key).parent_keys & reached:
            reached.add(key)
    assert {k.to_user_string() for k in reached} == set(ASSET_KEYS)


def test_asset_key_snapshot():
    assert sorted(k.to_user_string() for k in defs.resolve_all_asset_keys()) == sorted(ASSET_KEYS + ROOT_ASSETS)


def test_every_training_dataset_reads_the_one_selection_of_traces():
    graph = defs.resolve_asset_graph()
    for name in ("sft_dataset", "preference_pairs", "grpo_groups"):
        parents = {k.to_user_string() for k in graph.get(dg.AssetKey(name)).parent_keys}
        assert "selected_traces" in parents and "raw_traces" not in parents, (name, parents)
    assert {k.to_user_string() for k in graph.get(dg.AssetKey("selected_traces")).parent_keys} == {"raw_traces", "curated_corpus"}


def test_sensor_and_partitions_are_named_as_the_contract_says():
    sensor = defs.resolve_sensor_def("trace_batch_sensor")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    graph = defs.resolve_asset_graph()
    assert graph.get(dg.AssetKey("raw_traces")).partitions_def.name == "trace_batches"
    assert graph.get(dg.AssetKey("minhash_signatures")).partitions_def.name == "trace_batches"


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports, at the top or inside a function (``from a import b``: ``a.b`` and ``a``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return out


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_only_defs_and_orchestration_import_dagster():
    """defs/ defines the graph; orchestration/ is its one client (runs, run queries, the workflow driver)."""
    offenders = []
    for path in sorted((REPO / "training_assets").rglob("*.py")):
        rel = path.relative_to(REPO / "training_assets")
        if rel.parts[0] in {"defs", "orchestration"} or rel.name == "definitions.py":
            continue
        # dagster_pipes (the light protocol a Pipes subprocess speaks) is not dagster
        if re.search(r"^\s*(import dagster|from dagster)(\s|\.|$)", path.read_text(), re.MULTILINE):
            offenders.append(str(rel))
    assert offenders == []


def test_defs_holds_definitions_and_only_orchestration_reaches_into_it():
    """No run worker or helper program lives in defs/, and library code reaches the instance through
    orchestration/: outside it only a stage's ``config`` module (the assets' run-config classes, which
    the agent validates a tool's config against) may be imported from defs/."""
    programs = [str(p.relative_to(REPO)) for p in (REPO / "training_assets" / "defs").rglob("*.py")
                if "__main__" in p.read_text()]
    assert programs == [], "defs/ holds Dagster definitions, not programs: move them to training_assets/orchestration/"
    offenders = []
    for path in sorted((REPO / "training_assets").rglob("*.py")):
        rel = path.relative_to(REPO / "training_assets")
        if rel.parts[0] in {"defs", "orchestration"} or rel.name == "definitions.py":
            continue
        offenders += [f"{rel}: {m}" for m in _imports(path) if m.startswith("training_assets.defs.")
                      and not re.fullmatch(r"training_assets\.defs\.\w+\.config(\.\w+)?", m)]
    assert offenders == []


def test_no_import_cycle_among_the_agent_and_orchestration_modules():
    """Counting imports inside functions too: a cycle kept alive by a deferred import is still a cycle."""
    files = [p for d in ("agent", "orchestration") for p in (REPO / "training_assets" / d).rglob("*.py")]
    edges = {_module(p): {m for m in _imports(p)} for p in files}
    for module in edges:
        edges[module] &= set(edges) - {module}

    def cycle_from(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            module, chain = stack.pop()
            for nxt in sorted(edges[module]):
                if nxt == start:
                    return chain + [start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, chain + [nxt]))
        return None

    cycles = [" -> ".join(c) for c in map(cycle_from, sorted(edges)) if c]
    assert cycles == []


def test_kernels_import_only_numpy_numba_and_the_standard_library():
    for path in (REPO / "kernels").glob("*.py"):
        for line in path.read_text().splitlines():
            stripped = line.strip()
            if stripped.startswith(("import ", "from ")) and not stripped.startswith("from __future__"):
                target = stripped.split()[1]
                if target.startswith("."):  # a sibling kernel module
                    continue
                module = target.split(".")[0]
                allowed = module in {"numpy", "numba", "llvmlite", "training_assets_kernels"} or module in sys.stdlib_module_names
                assert allowed, f"kernels/{path.name} imports {module} (kernels use numpy/numba only): {line}"


def test_dagster_definitions_validate_passes(tmp_path):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-m", "training_assets.definitions"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
