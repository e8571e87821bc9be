"""Corpus curation engine (pure library, no Dagster).

``stream_corpus`` -> ``normalize`` -> ``quality_filter`` -> ``decontaminate`` -> ``dedup`` ->
``dataset_provenance``; ``curate`` runs them all over a data root and writes
``<root>/curated_corpus/``, read back with ``load_curated_corpus`` / ``corpus_version`` /
``lineage``. The hot loops are Numba kernels in ``kernels/dedup.py``. ``curate`` and ``dedup`` run
in this process or on a Ray cluster (``engine``); ``engines`` says how the modules are layered.
"""

from training_assets.data_engine.corpus import (
    CurationConfig,
    CurationReport,
    corpus_version,
    lineage,
    load_curated_corpus,
    load_held_out_sets,
    write_held_out_sets,
)
from training_assets.data_engine.decontam import DecontamResult, HeldOutExample, build_index, decontaminate, load_held_out
from training_assets.data_engine.dedup import DedupParams, DedupResult, lsh_params
from training_assets.data_engine.engines import curate, dedup
from training_assets.data_engine.filters import Dropped, QualityConfig, default_filters, normalize, quality_filter
from training_assets.data_engine.provenance import CURATION_VERSION, DatasetVersion, dataset_provenance
from training_assets.data_engine.render import render_trace, trace_record
from training_assets.data_engine.sources import stream_corpus

__all__ = [
    "CURATION_VERSION", "CurationConfig", "CurationReport", "DatasetVersion", "DecontamResult", "DedupParams",
    "DedupResult", "Dropped", "HeldOutExample", "QualityConfig", "build_index", "corpus_version", "curate",
    "dataset_provenance", "decontaminate", "dedup", "default_filters", "lineage", "load_curated_corpus",
    "load_held_out", "load_held_out_sets", "lsh_params", "normalize", "quality_filter", "render_trace",
    "stream_corpus", "trace_record", "write_held_out_sets",
]
