"""The ``minhash`` resource: the one declaration of the MinHash shingling the corpus stage uses.

``minhash_signatures`` stores signatures and ``curated_corpus`` reuses them only when ``ngram``,
``num_perm`` and ``seed`` match; both assets take this one resource instead of repeating the
fields in two run configs, so they cannot disagree. Defaults come from the library's
``DedupParams``.
"""

from dataclasses import fields

import dagster as dg
from pydantic import Field

from training_assets import data_engine

DEDUP_DEFAULTS = {f.name: f.default for f in fields(data_engine.DedupParams)}


class MinhashShingling(dg.ConfigurableResource):
    """Shingles and MinHash signatures, shared by minhash_signatures and curated_corpus."""

    ngram: int = Field(DEDUP_DEFAULTS["ngram"], ge=1, description="Words per MinHash shingle.")
    num_perm: int = Field(DEDUP_DEFAULTS["num_perm"], ge=2, description="MinHash values per signature.")
    seed: int = Field(DEDUP_DEFAULTS["seed"], description="Seed of the MinHash salt.")

    def params(self, method: str = "minhash", threshold: float = DEDUP_DEFAULTS["threshold"]) -> data_engine.DedupParams:
        return data_engine.DedupParams(method=method, threshold=threshold, num_perm=self.num_perm, ngram=self.ngram,
                                      seed=self.seed)


@dg.definitions
def corpus_resources() -> dg.Definitions:
    return dg.Definitions(resources={"minhash": MinhashShingling()})
