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
