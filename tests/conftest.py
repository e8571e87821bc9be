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
# started before every other unit: the longest one (~200 s of a ~430 s suite on a quiet machine,
# its own stack's daemon polling); xdist otherwise hands units out by test count, and this one, with
# three tests, started last and set the suite's end
_FIRST = {"tests/deploy/test_automation.py"}


def _unit_of(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    parts = path.split("/")
    if path in _OWN_UNITS:
        return path
    if len(parts) > 2 and parts[1] in _WHOLE_FOLDERS:
        return parts[1]
    return path


def pytest_xdist_make_scheduler(config, log):
    """`make test` runs ``-n N --dist loadgroup``: a folder with expensive session fixtures stays on
    one worker (they are built once, not once per worker), other files spread over the workers.
    (xdist's own ``xdist_group`` marks rename node ids, which this pytest no longer allows.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # The queue follows the workers' collection order (``pytest_collection_modifyitems``: the
    # automation unit, then xdist's own order by test count). Forcing every long unit first had
    # started the three server-heavy ones (automation, agent e2e, deploy) together, whose daemons
    # and code servers then shared the 2 cores: 23 min 50 s from a fresh clone against 21 min 43 s.
    config.option.loadscopereorder = False

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit_of(nodeid)

    return UnitScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """On the workers (whose collection order the scheduler's queue follows): ``_FIRST``, then units by
    their number of tests, most first, as xdist orders them; a unit's own order is kept."""
    if hasattr(config, "workerinput"):
        from collections import Counter

        counts = Counter(_unit_of(item.nodeid) for item in items)
        items.sort(key=lambda item: (_unit_of(item.nodeid) not in _FIRST, -counts[_unit_of(item.nodeid)]))
