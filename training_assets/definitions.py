"""Dagster entry point: ``training_assets.definitions:defs``.

    DAGSTER_HOME=$PWD/dagster_home dagster dev -m training_assets.definitions -h 127.0.0.1

Everything under ``training_assets/defs/`` is discovered by Dagster's own loader, configured by
the ``[tool.dg]`` section of ``pyproject.toml`` (the project root is this package's parent).
"""

from pathlib import Path

import dagster as dg

defs = dg.load_from_defs_folder(path_within_project=Path(__file__).resolve().parent)
