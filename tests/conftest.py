"""Shared fixtures: every test gets its own data root and an offline Hugging Face stack."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture
def data_root(tmp_path, monkeypatch):
    """A fresh, empty data root; ``$TRAINING_ASSETS_DATA`` points at it for the test."""
    root = tmp_path / "data"
    root.mkdir()
    monkeypatch.setenv("TRAINING_ASSETS_DATA", str(root))
    return root


_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="session")
def fake_vllm_lib():
    """``tests/fake_vllm.py`` as a module (``FakeVllm`` in-process, ``spawn`` as a process): test
    modules cannot import each other under importlib mode."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fake_vllm", os.path.join(_TESTS_DIR, "fake_vllm.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
# Folders whose session fixtures are expensive (a Dagster stack on PostgreSQL, trained tiny models,
# a materialised graph) are one unit of scheduling; elsewhere each file is one (tests/trainers' session
# fixtures, a tokenizer and a tiny base, cost seconds: its files spread). test_automation.py starts a
# stack of its own, so it is a unit apart from the rest of tests/deploy.
_WHOLE_FOLDERS = {"deploy", "evaluation", "datasets"}
_OWN_UNITS = {"tests/deploy/test_automation.py"}
# the longest units (mostly waiting on servers and subprocesses) go first
_LONGEST_FIRST = ["tests/deploy/test_automation.py", "tests/agent/test_end_to_end.py", "deploy",
                  "tests/trainers/test_determinism.py", "trainers", "evaluation", "agent", "corpus", "datasets"]


def _unit_of(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    parts = path.split("/")
    if path in _OWN_UNITS:
        return path
    if len(parts) > 2 and parts[1] in _WHOLE_FOLDERS:
        return parts[1]
    return path


def _rank(nodeid: str) -> int:
    unit = _unit_of(nodeid)
    for i, name in enumerate(_LONGEST_FIRST):
        if unit == name or unit.startswith(f"tests/{name}/"):
            return i
    return len(_LONGEST_FIRST)


def pytest_xdist_make_scheduler(config, log):
    """`make test` runs ``-n N --dist loadgroup``: a folder with expensive session fixtures stays on
    one worker (they are built once, not once per worker), other files spread over the workers.
    (xdist's own ``xdist_group`` marks rename node ids, which this pytest no longer allows.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # xdist hands units out by their number of tests (its default, kept): forcing the longest first
    # started the three server-heavy units (automation, agent e2e, deploy) together, whose daemons
    # and code servers then shared the 2 cores: 23 min 50 s from a fresh clone against 21 min 43 s

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit_of(nodeid)

    return UnitScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """Within a worker's share, the longest units first (order within a unit kept)."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: _rank(item.nodeid))
