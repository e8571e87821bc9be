"""What the seed's examples take from a real deployment, made tiny so they run on a CPU host.

The seed's examples start from a real base model (Qwen2.5-1.5B-Instruct), ~10k synthesised
trajectories, the live model registry and a running vLLM. Here:

* ``tiny_base()`` — a random-init Qwen2 decoder (hidden 64, 2 layers) and a byte-level BPE
  tokenizer trained on the sample traces, saved as one Hugging Face folder under ``MODELS``;
* ``sample_traces()`` — the first bundled sample batch's valid traces (about a hundred), as plain
  dicts of the trace schema;
* ``reliability_cases()`` — the shipped reliability suite; ``curated_records()`` — some of those
  traces rendered to ``{"text"}`` records by the data engine (a few windows of 2048 tokens);
* ``MODELS`` — where the seed writes models (``/models``); ``$TRAINING_ASSETS_MODELS`` moves it.

Nothing is downloaded.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

MODELS = Path(os.environ.get("TRAINING_ASSETS_MODELS", "/models"))


def sample_traces() -> list[dict[str, Any]]:
    from training_assets.sample_traces import make_batches
    from training_assets.traces import read_batch

    batches, _ = make_batches()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "traces-0001.jsonl"
        path.write_bytes(b"\n".join(batches[0]) + b"\n")
        return [t.model_dump(mode="json") for t in read_batch(path).valid]  # its junk lines are quarantined


def curated_records(n: int = 40) -> list[dict[str, Any]]:
    from training_assets.data_engine import render_trace
    from training_assets.traces import Trace

    return [{"id": t["trace_id"], "text": render_trace(Trace.model_validate(t))} for t in sample_traces()[:n]]


def reliability_cases() -> list[Any]:
    from training_assets.evaluation import load_cases

    return load_cases()


def tiny_base() -> str:
    """A tiny random-init base model with its tokenizer (built once under ``MODELS/tiny-base``)."""
    folder = MODELS / "tiny-base"
    if (folder / "config.json").is_file():
        return str(folder)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from training_assets.tokenizer_trainer import train_tokenizer
    from training_assets.trainers import PretrainSpec

    tokenizer = train_tokenizer([r["text"] for r in curated_records()], vocab_size=1024)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen2", **PretrainSpec().config_kwargs(len(tokenizer))))
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return str(folder)
