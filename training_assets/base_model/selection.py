"""Which pretrained model the graph starts from: the ``base_model`` asset's record under the data root.

    record = select_base_model(root, "smollm2-135m-instruct")   # the asset's work: resolve, verify, record
    current_base_model(root)                                     # what tokenizer and base_checkpoint read

An empty source records "random init": the graph trains its own BPE and pretrains a decoder from
scratch (the demo's path). A model (a fetched recipe or any HF model folder) makes the tokenizer
asset adopt the base's tokenizer with the tool-call template (no new BPE) and ``base_checkpoint``
the base's weights (no pretraining), so every later checkpoint starts from the real weights and
its lineage names their hash.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from training_assets import paths
from training_assets.base_model import fetch
from training_assets.checkpoint_manifest import CheckpointManifest, adopted_manifest, write_asset_manifest
from training_assets.base_model.template import TOOL_TEMPLATE, template_hash, with_tool_template
from training_assets.storage import atomic_dir, sha256_tree, write_json_atomic

ASSET = "base_model"
RECORD_FILE = "base_model.json"
RANDOM_INIT = "random-init"
WEIGHT_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json")


PREPARED_DIR = "model"  # <root>/base_model/model: the weights (linked) and the tokenizer with the tool template


@dataclass(frozen=True)
class BaseModelRecord:
    source: str  # what the config named: a recipe, a folder, or "" (random init)
    folder: str | None  # the prepared HF model folder the graph uses and the loop serves (None: random init)
    model_hash: str  # the data version: the weights' and tokenizer's hash, or "random-init"
    model_type: str | None = None
    parameters: int | None = None  # from the safetensors headers (no weights read)
    source_folder: str | None = None  # where the weights were fetched to (the models cache) or brought

    @property
    def is_pretrained(self) -> bool:
        return self.folder is not None


def _parameter_count(folder: Path) -> int | None:
    """Parameters from the safetensors headers (8-byte length + JSON): no tensor is read."""
    total = 0
    files = sorted(folder.glob("*.safetensors"))
    for file in files:
        with open(file, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(size))
        for name, info in header.items():
            if name != "__metadata__":
                count = 1
                for dim in info["shape"]:
                    count *= dim
                total += count
    return total if files else None


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)  # same filesystem: no second copy of the weights
    except OSError:
        shutil.copy2(source, target)


def prepare_folder(source: Path, target: Path, digest: str) -> Path:
    """``target``: the base's weight and config files (hard-linked, copied across filesystems) and its
    tokenizer with the tool-call template, so the base trains, evaluates and serves with one text
    format. Rebuilt only when the base (its hash) or the template changes; appears whole."""
    key = {"model_hash": digest, "template": template_hash(TOOL_TEMPLATE)}
    stamp = target / "prepared.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == key:
        return target
    from transformers import AutoTokenizer  # the [train] extra: only when a pretrained base is prepared

    with atomic_dir(target) as tmp:
        tmp = Path(tmp)
        for file in sorted(source.iterdir()):
            if file.is_file() and (file.suffix == ".safetensors" or file.name in WEIGHT_FILES):
                _link_or_copy(file, tmp / file.name)
        with_tool_template(AutoTokenizer.from_pretrained(str(source))).save_pretrained(str(tmp))
        write_json_atomic(tmp / "prepared.json", key)
    return target


def select_base_model(root: str | os.PathLike[str] | None, source: str) -> BaseModelRecord:
    """Resolve ``source`` (a recipe must be fetched: ``training-assets models fetch``), verify it and
    record it for the graph; ``""`` records random init."""
    if not source:
        record = BaseModelRecord("", None, RANDOM_INIT)
    else:
        folder = fetch.resolve_model(source, root)
        if (folder / fetch.MANIFEST).is_file():
            fetch.verify(folder)
            digest = fetch.model_hash(folder)
        else:  # a folder brought by hand: hash its files (weights included) once per selection
            digest = sha256_tree(folder)[:16]
        config = json.loads((folder / "config.json").read_text())
        prepared = prepare_folder(folder, paths.asset_dir(ASSET, root) / PREPARED_DIR, digest)
        record = BaseModelRecord(source, str(prepared), digest, config.get("model_type"), _parameter_count(folder),
                                 str(folder))
    write_json_atomic(paths.asset_dir(ASSET, root) / RECORD_FILE, asdict(record))
    return record


def current_base_model(root: str | os.PathLike[str] | None = None) -> BaseModelRecord | None:
    """The recorded base model, or None when the ``base_model`` asset was never materialised."""
    path = paths.asset_dir(ASSET, root) / RECORD_FILE
    if not path.is_file():
        return None
    return BaseModelRecord(**json.loads(path.read_text()))


def adopt_checkpoint(root: str | os.PathLike[str] | None, record: BaseModelRecord, tokenizer_dir: str | os.PathLike[str],
                     tokenizer_hash: str, asset: str = "base_checkpoint", dagster_run_id: str | None = None) -> CheckpointManifest:
    """``asset``'s manifest naming the base's weights (trained from nothing: it is the pretrained model)."""
    if record.folder is None:
        raise ValueError("the base_model asset records random init: there are no pretrained weights to adopt; "
                         "set base_model's config `model` (e.g. smollm2-135m-instruct) or pretrain")
    manifest = adopted_manifest(asset, record.folder, tokenizer_dir, {ASSET: record.model_hash, "tokenizer": tokenizer_hash},
                                dagster_run_id=dagster_run_id)
    write_asset_manifest(root, manifest)
    return manifest
