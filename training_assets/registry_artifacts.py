"""How a registered version lies in MLflow's artifact store, and how it comes back to a local folder.

A version is the artifact path ``model/`` of its registration run, a real MLflow model:

    model/MLmodel         flavour ``training_assets_hf`` (kind, folders, base reference)
    model/manifest.json   the checkpoint's manifest, paths relative to ``model/``
    model/checkpoint/     HF weights + config (full model) or the PEFT adapter only
    model/tokenizer/
    model/base.json       adapter only: the registered base version it applies to + the base's content hash

An adapter never carries its base: the base is registered once, as a version of the registered
model ``<name>-base`` found by content hash, so every further adapter on it costs adapter-sized
storage. ``mlflow.artifacts.download_artifacts("models:/<name>@<role>")`` gives the folder above;
``load_hf_model`` turns it into a transformers / PEFT model (downloading the base it names).

For serving, a version is *materialised* into ``<serve_dir>/<registered model>/<run id>/`` with a
``manifest.json`` of absolute paths (what ``resolve_checkpoint`` and vLLM read): a local artifact
store is read in place (no copy), a remote one (``mlflow-artifacts:/``, proxied by ``mlflow server
--serve-artifacts``) is downloaded into ``model/`` there first. ``v<N>`` links name versions.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from training_assets.storage import sha256_tree, write_json_atomic
from training_assets.tracking import mlflow_client
from training_assets.checkpoint_loading import CheckpointDirs, load_tokenizer_dir, resolve_checkpoint
from training_assets.checkpoint_manifest import (MANIFEST_FILE, CheckpointManifest, folder_manifest, read_manifest_file,
                                               snapshot_manifest, write_manifest)

MODEL_DIR = "model"
FLAVOR = "training_assets_hf"
BASE_REF_FILE = "base.json"
_METRIC_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")
_NOT_TOKENIZER = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf", "config.json", "generation_config.json",
                  "*.safetensors.index.json", "adapter_config.json", "manifest.json", "MLmodel")


def is_local(artifact_uri: str) -> bool:
    return urllib.parse.urlparse(artifact_uri).scheme in ("", "file")


def content_hash(folder: str | os.PathLike[str]) -> str:
    """``sha256:<hex>`` over every file of ``folder`` (names and bytes): what identifies a base."""
    return "sha256:" + sha256_tree(folder)


def base_tokenizer_dir(dirs: CheckpointDirs) -> Path:
    """The base's own tokenizer when its folder has one, else the adapter's."""
    base = Path(dirs.base_model_dir)
    return base if (base / "tokenizer.json").is_file() else dirs.tokenizer_dir


def stage_version(staged: Path, checkpoint_dir: Path, tokenizer_dir: Path, manifest: CheckpointManifest,
                  run_id: str, base_ref: dict[str, Any] | None) -> Path:
    """Write the ``model/`` folder of a version under ``staged`` (copied, never linked)."""
    from mlflow.models import Model  # mlflow: seconds, only when a version is staged

    folder = staged / MODEL_DIR
    shutil.copytree(checkpoint_dir, folder / "checkpoint")
    # a tokenizer that lives in a model folder: its files only, never the weights beside it
    shutil.copytree(tokenizer_dir, folder / "tokenizer", ignore=shutil.ignore_patterns(*_NOT_TOKENIZER))
    write_manifest(folder, snapshot_manifest(manifest))
    if base_ref is not None:
        write_json_atomic(folder / BASE_REF_FILE, base_ref)
    flavour = {"kind": manifest.kind, "checkpoint": "checkpoint", "tokenizer": "tokenizer",
               "base": base_ref, "loader": "training_assets.registry_artifacts.load_hf_model"}
    Model(artifact_path=MODEL_DIR, run_id=run_id, flavors={FLAVOR: flavour}).save(str(folder / "MLmodel"))
    return folder


def delete_run_artifacts(client: Any, run_id: str, tracking_uri: str) -> None:
    """Remove a run's artifacts from the store (MLflow's ``delete_run`` only marks the run deleted)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository  # mlflow: seconds, only here

    uri = client.get_run(run_id).info.artifact_uri
    get_artifact_repository(uri, tracking_uri=tracking_uri).delete_artifacts()


def stored_folder(client: Any, run_id: str) -> Path | None:
    """The ``model/`` folder of a run in a local artifact store (read in place); None for a remote store."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository  # mlflow: seconds, only here

    uri = client.get_run(run_id).info.artifact_uri
    if not is_local(uri):
        return None
    return Path(get_artifact_repository(uri).download_artifacts(MODEL_DIR))  # local repo: its own path, no copy


def materialise(client: Any, run_id: str, target: Path, base_model_dir: Path | None = None) -> Path:
    """``target`` holding a manifest.json of absolute paths to the version of ``run_id`` (see module doc)."""
    if (target / MANIFEST_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    files = stored_folder(client, run_id)
    if files is not None:
        target.mkdir(exist_ok=True)
    else:
        partial = Path(tempfile.mkdtemp(prefix=f".{run_id}-", dir=target.parent))
        try:
            client.download_artifacts(run_id, MODEL_DIR, str(partial))
            target.mkdir(exist_ok=True)
            os.replace(partial / MODEL_DIR, target / MODEL_DIR)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        files = target / MODEL_DIR
    stored = read_manifest_file(files)
    if stored.is_adapter and base_model_dir is None:
        raise ValueError(f"run {run_id} holds an adapter: materialise its base first and pass base_model_dir")
    local = stored.model_copy(update={"checkpoint_dir": str(files / "checkpoint"), "tokenizer_dir": str(files / "tokenizer"),
                                      "base_model_dir": str(base_model_dir) if stored.is_adapter else None})
    write_manifest(target, local)  # last: a folder with a manifest is complete
    return target


def link_version(target: Path, version: int) -> Path:
    """``<target's parent>/v<version>`` -> ``target`` (relative link, replaced atomically)."""
    link = target.parent / f"v{version}"
    tmp = target.parent / f".v{version}.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    os.symlink(target.name, tmp)
    os.replace(tmp, link)
    return link


def resolve_model_uri(model_uri: str, tracking_uri: str | None) -> str:
    """``models:/<name>@<alias>`` or ``models:/<name>/<version>`` -> that version's artifact URI on ``tracking_uri``.

    MLflow's own ``models:/`` resolution asks the *global* registry URI (``MLFLOW_REGISTRY_URI`` /
    ``mlflow.set_registry_uri``) whatever ``registry_uri`` is passed; this asks the given server.
    """
    if not model_uri.startswith("models:/") or tracking_uri is None:
        return model_uri
    client = mlflow_client(tracking_uri)
    rest = model_uri.removeprefix("models:/")
    if "@" in rest:
        name, alias = rest.split("@", 1)
        version = client.get_model_version_by_alias(name, alias).version
    else:
        name, version = rest.rsplit("/", 1)
    return client.get_model_version_download_uri(name, version)


def load_hf_model(model_uri: str, tracking_uri: str | None = None, dst: str | os.PathLike[str] | None = None,
                  **kwargs: Any) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from ``models:/<name>@<role>`` (or any URI of a version's ``model/``).

    A full model loads with ``AutoModelForCausalLM``; an adapter downloads the base named in its
    ``base.json`` and applies itself with ``PeftModel``. Only safetensors are read.
    """
    from mlflow.artifacts import download_artifacts  # mlflow: seconds, only when a model is loaded
    from transformers import AutoModelForCausalLM  # the train extra: torch, ~2 s


    dst = Path(dst or tempfile.mkdtemp(prefix="registry-"))
    folder = Path(download_artifacts(artifact_uri=resolve_model_uri(model_uri, tracking_uri), dst_path=str(dst / "version"),
                                     tracking_uri=tracking_uri))
    tokenizer = load_tokenizer_dir(folder / "tokenizer")
    ref_file = folder / BASE_REF_FILE
    if not ref_file.is_file():
        return AutoModelForCausalLM.from_pretrained(str(folder / "checkpoint"), use_safetensors=True, **kwargs), tokenizer
    from peft import PeftModel  # the train extra: only for an adapter

    ref = json.loads(ref_file.read_text(encoding="utf-8"))
    base = Path(download_artifacts(artifact_uri=resolve_model_uri(ref["model_uri"], tracking_uri), dst_path=str(dst / "base"),
                                   tracking_uri=tracking_uri))
    if content_hash(base / "checkpoint") != ref["content_hash"]:
        raise ValueError(f"{ref['model_uri']} does not hold the base {model_uri} was trained on "
                         f"(content hash differs from {ref['content_hash']}); re-register the adapter")
    model = AutoModelForCausalLM.from_pretrained(str(base / "checkpoint"), use_safetensors=True, **kwargs)
    return PeftModel.from_pretrained(model, str(folder / "checkpoint")), tokenizer


def source_dirs(path: str | os.PathLike[str]) -> tuple[CheckpointDirs, CheckpointManifest]:
    """The folders of a checkpoint to register and its manifest (one made up for a plain HF folder)."""
    dirs = resolve_checkpoint(path)
    if (Path(path) / MANIFEST_FILE).is_file():
        return dirs, read_manifest_file(path)
    return dirs, folder_manifest(dirs.checkpoint_dir, dirs.tokenizer_dir, dirs.base_model_dir, Path(path).name)


def flat_numbers(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric leaves of a nested metrics dict as MLflow metric names (``suite.n_cases``)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = _METRIC_KEY.sub("_", f"{prefix}{key}")
        if isinstance(value, Mapping):
            out.update(flat_numbers(value, f"{name}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)
    return out


def remove_created(client: Any, tracking_uri: str, created: list[tuple[str, Any]]) -> str:
    """Remove what a failed registration created (``("version", (name, n))``, ``("run", id)``,
    ``("served", folder)``), newest first; say what was removed and what could not be."""
    done, failed = [], []
    for kind, item in reversed(created):
        try:
            if kind == "version":
                client.delete_model_version(*item)
                done.append(f"version {item[0]}/{item[1]}")
            elif kind == "run":
                client.delete_run(item)
                done.append(f"run {item}")
                if client.list_artifacts(item):
                    delete_run_artifacts(client, item, tracking_uri)
                    done.append("its artifacts")
            elif Path(item).exists():
                shutil.rmtree(item)
                done.append(f"served folder {item}")
        except Exception as exc:  # noqa: BLE001 - every failure is reported to the caller, never hidden
            failed.append(f"{kind} {item}: {exc}")
    text = "removed " + (", ".join(done) or "nothing")
    return text + (f"; COULD NOT REMOVE {'; '.join(failed)}" if failed else "")
