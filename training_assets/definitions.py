"""Dagster entry point: ``training_assets.definitions:defs``.

    DAGSTER_HOME=$PWD/dagster_home dagster dev -m training_assets.definitions -h 127.0.0.1
"""

from training_assets.defs import load_stage_definitions
from training_assets.defs.resources import default_resources

defs = load_stage_definitions(default_resources())
