"""``dataset_provenance``: the identity and history of a curated dataset.

A ``DatasetVersion`` id is a fingerprint of (input data versions, config, code version): the same
inputs curated the same way always get the same id, and any change to one of them a new one.
It also records counts per stage and drop reasons, so "where did these records go" has an answer
without rerunning anything.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from training_assets.data_engine.filters import Dropped
from training_assets.storage import fingerprint

# Bump when curation logic changes what a given input produces: it is the assets' code version.
CURATION_VERSION = "2"


@dataclass(frozen=True)
class DatasetVersion:
    id: str
    inputs: dict[str, str]  # input name -> its data version
    config: dict[str, Any]
    code_version: str
    stage_counts: dict[str, int] = field(default_factory=dict)  # records left after each stage, in order
    drop_reasons: dict[str, int] = field(default_factory=dict)  # "stage/reason" -> count

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def dataset_provenance(inputs: Mapping[str, str], config: Mapping[str, Any], stage_counts: Mapping[str, int],
                       dropped: Iterable[Dropped] | Mapping[str, int], code_version: str = CURATION_VERSION
                       ) -> DatasetVersion:
    """Build the DatasetVersion; its id depends only on inputs, config and code version.

    ``dropped``: the dropped records, or already their counts per ``"stage/reason"``.
    """
    reasons = Counter(dropped) if isinstance(dropped, Mapping) else Counter(f"{d.stage}/{d.reason}" for d in dropped)
    return DatasetVersion(
        id=fingerprint(dict(sorted(inputs.items())), dict(config), code_version),
        inputs=dict(sorted(inputs.items())), config=dict(config), code_version=code_version,
        stage_counts=dict(stage_counts), drop_reasons=dict(sorted(reasons.items())),
    )
