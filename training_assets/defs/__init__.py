"""Dagster definitions: the only package that imports dagster.

One folder per stage (``traces/``, ``corpus/``, ...), each with ``assets.py`` / ``checks.py`` /
``sensors.py``. ``load_stage_definitions`` discovers every asset, check, sensor, schedule and job\n(and merges any module-level ``dg.Definitions``, for asset jobs) under this package, so
a new stage is a new folder and nothing else; stage folders never import each other (they refer
to upstream assets by key).
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import dagster as dg


def _stage_modules() -> list[ModuleType]:
    modules = []
    for info in pkgutil.walk_packages(__path__, prefix=f"{__name__}."):
        modules.append(importlib.import_module(info.name))
    return modules


def load_stage_definitions(resources: dict[str, object]) -> dg.Definitions:
    modules = _stage_modules()
    objects = [value for module in modules for value in vars(module).values()]

    def unique(kind: type) -> list:
        seen: dict[int, object] = {}
        for value in objects:
            if isinstance(value, kind):
                seen.setdefault(id(value), value)
        return list(seen.values())

    discovered = dg.Definitions(
        assets=dg.load_assets_from_modules(modules),
        asset_checks=dg.load_asset_checks_from_modules(modules),
        sensors=unique(dg.SensorDefinition),
        schedules=unique(dg.ScheduleDefinition),
        jobs=unique(dg.JobDefinition),
        resources=resources,
        # Steps of a run execute in the run's own process: a multiprocess executor would start one
        # more process per step, each re-importing torch and the code location (measured: a 6-batch
        # sensor stream took 72–78 s with it and 50 s without, under load). Training steps that
        # need isolation launch their own subprocess through Dagster Pipes.
        executor=dg.in_process_executor,
    )
    # A stage that needs asset jobs (define_asset_job) declares them in a module-level Definitions.
    return dg.Definitions.merge(discovered, *unique(dg.Definitions))
