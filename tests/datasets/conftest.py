"""Fixtures: hand-made traces, and a data root holding every upstream asset the datasets read.

The sample root is built once per session: sample traces ingested into ``raw_traces``,
``held_out_sets``, ``curated_corpus`` and ``selected_traces`` through the library, and a small
tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from training_assets import data_engine, inbox, ingest, sample_traces, tokenizer_trainer
from training_assets.traces import Trace
from training_assets.training_data import selection

SYSTEM = "You solve tasks with tools."


def _make_trace(task_id: str, n: int, success: bool, score: float | None = None, answer: str = "42",
                tool_result: str = "42", thought: str = "I will compute it.", failure_point: int | None = None,
                prompt: str | None = None, expected: str | None = "42", tool: bool = True) -> Trace:
    call_id = f"c-{task_id}-{n}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": prompt or f"What is 6 * 7? ({task_id})"}]
    if tool:
        messages += [
            {"role": "assistant", "content": thought, "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": "calculator", "arguments": json.dumps({"expression": "6 * 7"})}}]},
            {"role": "tool", "tool_call_id": call_id, "name": "calculator", "content": tool_result},
        ]
    messages.append({"role": "assistant", "content": f"The answer is {answer}."})
    return Trace.model_validate({
        "trace_id": f"{task_id}-a{n}", "task_id": task_id, "messages": messages, "final_answer": answer,
        "outcome": {"success": success, "score": score, "failure_point": failure_point},
        "metadata": {"source": "test", "expected_answer": expected},
    })


@pytest.fixture
def make_trace():
    return _make_trace


def build_sample_root(root: Path, seed: int = 0, vocab_size: int = 1024) -> Path:
    sample_traces.write_samples(root, seed=seed)
    for batch in inbox.scan_inbox(root=root).new:
        ingest.ingest_batch(batch.batch_id, root)
    data_engine.write_held_out_sets(sorted((root / "held_out").glob("*.jsonl")), root)
    data_engine.curate(root)
    selection.select_traces(root)
    rows = data_engine.load_curated_corpus(root).select(["id", "text"]).to_pylist()
    tokenizer_trainer.build_tokenizer(rows, data_engine.corpus_version(root), tokenizer_trainer.TokenizerConfig(vocab_size),
                                      tokenizer_trainer.tokenizer_dir(root))
    return root


@pytest.fixture(scope="session")
def sample_root(tmp_path_factory) -> Path:
    """A data root with raw_traces, held_out_sets, curated_corpus, selected_traces and tokenizer (read-only)."""
    return build_sample_root(tmp_path_factory.mktemp("sample") / "data")
