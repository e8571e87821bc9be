"""Where things live under the data root.

The data root is ``$TRAINING_ASSETS_DATA`` (default ``./data``). Every stage owns one folder
under it, named after its asset key, so a stage never writes into another's folder:

    data/
      inbox/                       trace batches arrive here (watched by the sensor)
      inbox/_rejected/             entries the sensor refused (unsafe names, symlinks, non-regular
                                   files), each with a .reason file
      batches/<batch_id>.jsonl[.gz] immutable snapshot of each staged batch (staged by its run)
      batches/<batch_id>.json       its staging record: source name, size, mtime, sha256, duplicate_of
      batches/by_sha256/<sha256>    the batch id that first staged those bytes
      raw_traces/<batch_id>/        traces.parquet + quarantine.jsonl + partition.json per partition
      <asset_key>/...               everything downstream
      slots/<pool>.<i>.lock         the training pool's slots, held while a step trains (``slots``)
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_ENV = "TRAINING_ASSETS_DATA"


def data_root(root: str | os.PathLike[str] | None = None) -> Path:
    """Resolve the data root: the explicit argument, else ``$TRAINING_ASSETS_DATA``, else ``./data``."""
    if root is not None:
        return Path(root).resolve()
    return Path(os.environ.get(DATA_ENV, "data")).resolve()


def inbox_dir(root: str | os.PathLike[str] | None = None) -> Path:
    return data_root(root) / "inbox"


def rejected_dir(root: str | os.PathLike[str] | None = None) -> Path:
    return inbox_dir(root) / "_rejected"


def batches_dir(root: str | os.PathLike[str] | None = None) -> Path:
    return data_root(root) / "batches"


def asset_dir(asset_key: str, root: str | os.PathLike[str] | None = None) -> Path:
    """The folder a stage owns: ``<data root>/<asset_key>``."""
    if not asset_key or "/" in asset_key or asset_key.startswith("."):
        raise ValueError(f"asset key {asset_key!r} is not a plain folder name")
    return data_root(root) / asset_key


def slots_dir(root: str | os.PathLike[str] | None = None) -> Path:
    return data_root(root) / "slots"
