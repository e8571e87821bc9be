"""Which engine runs a curation or a dedup: ``data_engine.curate`` and ``data_engine.dedup``.

    curate(root, CurationConfig(engine="ray"))     # config.engine: "local" (default) or "ray"
    dedup(records, method="minhash", engine="ray")

The data engine has three layers, imports pointing down only (``tests/corpus/test_layers.py``):

1. building blocks: ``filters``, ``render``, ``sources``, ``provenance``, ``decontam``, ``dedup``
   (with ``dedup_runtime``), ``staged``, and ``corpus`` (the config, report and files both engines share);
2. the engines, side by side, neither importing the other: the local one (``local_engine``, and
   ``dedup.dedup`` in memory) and the Ray one (``ray_engine`` over its ``ray_*`` stages);
3. this module, the only one that knows both. Each engine gives the same answer its own way, so
   the choice is a run setting, never part of the DatasetVersion.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from training_assets.data_engine import local_engine, ray_engine
from training_assets.data_engine.corpus import ENGINES, CurationConfig, CurationReport
from training_assets.data_engine.dedup import DEFAULT_SEED, DedupParams, DedupResult, Features, unique_ids
from training_assets.data_engine.dedup import dedup as dedup_in_process


def curate(root: str | os.PathLike[str] | None = None, config: CurationConfig | None = None) -> CurationReport:
    """Curate the data root into ``<root>/curated_corpus/`` on ``config.engine`` (``local_engine.curate``
    or ``ray_engine.curate_on_ray``: the same files and report; Ray adds ``engine_info``)."""
    config = config or CurationConfig()
    if config.engine == "ray":
        return ray_engine.curate_on_ray(root, config)
    return local_engine.curate(root, config)


def dedup(records: Sequence[dict[str, Any]], method: str = "minhash", threshold: float = 0.8, num_perm: int = 128,
          ngram: int = 5, seed: int = DEFAULT_SEED, target_recall: float = 0.995,
          features: Features | None = None, timings: dict[str, float] | None = None, engine: str = "local",
          ray_address: str | None = None) -> DedupResult:
    """Remove exact and near duplicates from ``records`` (dicts with ``id`` and ``text``): ``dedup.dedup``
    in this process, or with ``engine="ray"`` the same result on a Ray cluster (``ray_engine.dedup_on_ray``;
    ``ray_address`` or ``$RAY_ADDRESS``; MinHash only; ``features`` and ``timings`` do not apply there).

    Bad parameters, then repeated ids, then an unknown engine are refused in that order, whichever engine."""
    if engine == "local":
        return dedup_in_process(records, method, threshold, num_perm, ngram, seed, target_recall, features, timings)
    params = DedupParams(method, threshold, num_perm, ngram, seed, target_recall)
    unique_ids(records)
    if engine not in ENGINES:
        raise ValueError(f"dedup engine {engine!r} is not 'local' or 'ray'")
    return ray_engine.dedup_on_ray(list(records), params, ray_address)
