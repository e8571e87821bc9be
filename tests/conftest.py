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
# folders that take longest (mostly waiting on servers and subprocesses) go first
_LONGEST_FIRST = ["deploy", "agent", "trainers", "evaluation", "corpus", "kernels", "datasets"]


def _folder_of(nodeid: str) -> str:
    parts = nodeid.split("::")[0].split("/")
    return parts[1] if len(parts) > 2 else parts[-1].removesuffix(".py")


def pytest_xdist_make_scheduler(config, log):
    """`make test` runs ``-n 2 --dist loadgroup``: each test folder is one unit of scheduling and
    stays on one worker, so a folder's session fixtures (a trained tiny model, a materialised graph,
    a Dagster stack on PostgreSQL) are built once, not once per worker; folders run side by side.
    (xdist's own ``xdist_group`` marks rename node ids, which this pytest no longer allows.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FolderScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _folder_of(nodeid)

    return FolderScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """The longest folders first, so the two workers finish together (order within a folder kept)."""
    if hasattr(config, "workerinput"):
        rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(_folder_of(item.nodeid), len(rank)))
