"""Loading a checkpoint: where its weights, base and tokenizer are, and the model + tokenizer themselves.

    dirs = resolve_checkpoint("data/merged_adapter")        # manifest folder, HF model dir or PEFT adapter dir
    model, tokenizer = load_checkpoint("data/merged_adapter", merge_adapter=True)

The one place that loads checkpoints, for evaluation, the registry (snapshots, rollback) and the
trainers (tokenizers): below all three, so evaluation loads a checkpoint without importing the
training code (``tests/trainers/test_layers.py``). Accepted: a folder with a ``manifest.json`` (a checkpoint asset, a pipeline
or CLI run, a registry snapshot with relative paths), a Hugging Face model folder
(``config.json``) or a PEFT adapter folder (``adapter_config.json`` naming a local base).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training_assets.checkpoint_manifest import MANIFEST_FILE, read_manifest_file

GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


@dataclass(frozen=True)
class CheckpointDirs:
    """Where a checkpoint's pieces live: the weights (full or adapter), its base and its tokenizer."""

    checkpoint_dir: Path
    base_model_dir: Path | None  # set for an adapter
    tokenizer_dir: Path

    @property
    def is_adapter(self) -> bool:
        return self.base_model_dir is not None


def resolve_checkpoint(path: str | os.PathLike[str]) -> CheckpointDirs:
    """The pieces of a manifest folder, a HF model dir or a PEFT adapter dir (no weights are read)."""
    path = Path(path)
    if (path / MANIFEST_FILE).is_file():  # relative paths (registry snapshots) are relative to the manifest's folder
        m = read_manifest_file(path).resolved(path)
        return CheckpointDirs(Path(m.checkpoint_dir), Path(m.base_model_dir) if m.base_model_dir else None,
                              Path(m.tokenizer_dir))
    adapter_config = path / "adapter_config.json"
    if adapter_config.is_file():
        base = json.loads(adapter_config.read_text(encoding="utf-8")).get("base_model_name_or_path")
        if not base or not Path(base).is_dir():
            raise FileNotFoundError(f"{adapter_config}: base_model_name_or_path {base!r} is not a local folder; "
                                    "load it through the checkpoint's manifest.json, which names the base")
        has_tokenizer = (path / "tokenizer_config.json").is_file()
        return CheckpointDirs(path, Path(base), path if has_tokenizer else Path(base))
    if (path / "config.json").is_file():
        return CheckpointDirs(path, None, path)
    raise FileNotFoundError(f"{path}: neither {MANIFEST_FILE}, adapter_config.json nor config.json; "
                            "pass a checkpoint asset folder or a Hugging Face model/adapter folder")


def load_tokenizer_dir(path: str | os.PathLike[str]) -> Any:
    """Load a tokenizer dir without letting a neighbouring config.json change it.

    In transformers 5, ``AutoTokenizer`` on a dir whose config.json says ``model_type: qwen2``
    returns ``Qwen2Tokenizer``, which rebuilds the pre-tokenizer (splitting digits) and encodes
    our own BPE differently. A tokenizer saved as the generic class is therefore loaded as
    ``PreTrainedTokenizerFast`` (exactly its tokenizer.json); a model-specific one (a hub model)
    goes through ``AutoTokenizer`` as usual.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast  # the [train] extra, only when a tokenizer loads

    config_path = Path(path) / "tokenizer_config.json"
    if config_path.is_file() and json.loads(config_path.read_text()).get("tokenizer_class") in GENERIC_TOKENIZER_CLASSES:
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path))


def load_checkpoint(path: str | os.PathLike[str], merge_adapter: bool = False, **kwargs: Any) -> tuple[Any, Any]:
    """``(model in eval mode, tokenizer)``; an adapter is loaded on its base (PEFT), merged when asked.

    ``merge_adapter=True`` folds the adapter into the base (``merge_and_unload``): same outputs,
    faster generation and a plain ``PreTrainedModel`` (what lm-eval wants). ``kwargs`` go to
    ``from_pretrained`` (e.g. ``dtype=torch.float32``).
    """
    from transformers import AutoModelForCausalLM  # the [train] extra, only when weights load (resolving needs none)

    dirs = resolve_checkpoint(path)
    tokenizer = load_tokenizer_dir(dirs.tokenizer_dir)
    if dirs.is_adapter:
        from peft import PeftModel  # the [train] extra, only for an adapter

        base = AutoModelForCausalLM.from_pretrained(str(dirs.base_model_dir), **kwargs)
        model = PeftModel.from_pretrained(base, str(dirs.checkpoint_dir))
        if merge_adapter:
            model = model.merge_and_unload()
    else:
        model = AutoModelForCausalLM.from_pretrained(str(dirs.checkpoint_dir), **kwargs)
    return model.eval(), tokenizer
