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


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test` runs ``-n 2 --dist loadgroup``) each test folder stays on one
    worker, so a folder's session fixtures (a trained tiny model, a materialised graph, a Dagster
    stack on PostgreSQL) are built once, not once per worker; folders run side by side, the
    longest (mostly waiting on servers and subprocesses) first so the two workers finish together."""
    if not config.pluginmanager.hasplugin("xdist") or not getattr(config.option, "numprocesses", None):
        return
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    longest_first = ["deploy", "agent", "trainers", "evaluation", "corpus", "kernels", "datasets"]

    def group(item):
        rel = os.path.relpath(str(item.path), tests_dir).split(os.sep)
        return rel[0] if len(rel) > 1 else rel[0].removesuffix(".py")

    for item in items:
        item.add_marker(pytest.mark.xdist_group(group(item)))
    rank = {name: i for i, name in enumerate(longest_first)}
    items.sort(key=lambda item: rank.get(group(item), len(rank)))  # stable: order within a folder kept
