"""Lineage that cannot miss a batch: every dataset row names the trace batches it came from, and
``contributing_batches`` lists exactly the batches that contributed a row, no other."""

import json

import numpy as np
import pytest

from training_assets import data_engine, inbox, ingest, paths, sample_traces, tokenizer_trainer
from training_assets.training_data import (
    builders,
    contributing_batches,
    load_grpo_groups,
    load_preference_pairs,
    load_pretrain_windows,
    load_sft_dataset,
    selection,
)

DATASETS = ["sft_dataset", "preference_pairs", "grpo_groups", "pretrain_windows"]


@pytest.fixture(scope="module")
def lineage_root(tmp_path_factory):
    """Four batches: a1 and a2 ordinary; b only junk lines (every line quarantined); c only
    re-logged copies of a1's traces under new ids (every trace an exact repeat, dropped)."""
    root = tmp_path_factory.mktemp("lineage") / "data"
    box = paths.inbox_dir(root)
    box.mkdir(parents=True)
    batches, held = sample_traces.make_batches(n_batches=2, tasks_per_batch=8, attempts=4, seed=5, held_out_tasks=1)
    for name, lines in (("a1", batches[0]), ("a2", batches[1])):
        (box / f"{name}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (box / "b.jsonl").write_bytes(b"\n".join(sample_traces.JUNK_LINES) + b"\n")
    copies = []
    for line in batches[0]:
        try:
            trace = json.loads(line)
        except ValueError:
            continue
        if isinstance(trace, dict) and "outcome" in trace and "messages" in trace:
            copies.append(json.dumps({**trace, "trace_id": f"{trace['trace_id']}-copy"}).encode())
    (box / "c.jsonl").write_bytes(b"\n".join(copies) + b"\n")
    ids = {}
    for batch in inbox.scan_inbox(root=root).new:
        ingest.ingest_batch(batch.batch_id, root)
        ids[batch.name.removesuffix(".jsonl")] = batch.batch_id
    (root / "held_out").mkdir()
    (root / "held_out" / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held))
    data_engine.write_held_out_sets([root / "held_out" / "eval.jsonl"], root)
    data_engine.curate(root)
    selection.select_traces(root)
    rows = data_engine.load_curated_corpus(root).select(["id", "text"]).to_pylist()
    tokenizer_trainer.build_tokenizer(rows, data_engine.corpus_version(root), tokenizer_trainer.TokenizerConfig(600),
                                      tokenizer_trainer.tokenizer_dir(root))
    for build in (builders.build_sft_dataset, builders.build_preference_dataset, builders.build_grpo_dataset,
                  builders.build_pretrain_dataset):
        build(root, builders.PretrainConfig(window=64)) if build is builders.build_pretrain_dataset else build(root)
    return root, ids


def test_the_fixture_has_a_quarantined_and_a_wholly_dropped_batch(lineage_root):
    root, ids = lineage_root
    assert ingest.partition_manifest(ids["b"], root)["valid"] == 0  # every line quarantined
    decisions = [d for d in selection.load_selection_decisions(root).to_pylist() if d["batch_id"] == ids["c"]]
    assert decisions and not any(d["kept"] for d in decisions)
    assert {d["reason"] for d in decisions} <= {"exact_duplicate", "near_duplicate", "held_out_overlap"}


@pytest.mark.parametrize("dataset", DATASETS)
def test_exactly_the_batches_that_contributed_a_row_appear(lineage_root, dataset):
    root, ids = lineage_root
    assert contributing_batches(dataset, root) == sorted([ids["a1"], ids["a2"]])


def test_each_row_names_the_batches_of_the_traces_it_was_built_from(lineage_root):
    root, ids = lineage_root
    batch_of = {r["trace_id"]: r["batch_id"] for r in ingest.read_traces_table(root=root).to_pylist()}
    for row in load_sft_dataset(root):
        assert row["source_batches"] == [batch_of[row["id"]]]
    for row in load_preference_pairs(root):
        chosen, rejected = row["id"].split(">")
        assert row["source_batches"] == sorted({batch_of[chosen], batch_of[rejected]})
    kept_task_batches: dict[str, set[str]] = {}
    for trace in selection.load_selected_traces(root):  # a task's attempts all come in one batch here
        kept_task_batches.setdefault(trace["task_id"], set()).add(trace["batch_id"])
    groups = load_grpo_groups(root)
    assert groups
    for row in groups:
        assert row["source_batches"] == sorted(kept_task_batches[row["task_id"]])
    corpus_batches = data_engine.load_curated_corpus(root).column("batch_id").to_pylist()
    for window in load_pretrain_windows(root):
        docs = sorted({d for d in window["doc_ids"] if d >= 0})
        assert window["source_batches"] == sorted({corpus_batches[d] for d in docs})


def test_limit_counts_only_the_first_rows_as_a_limited_training_run_does(lineage_root):
    root, _ = lineage_root
    rows = load_sft_dataset(root)
    assert contributing_batches("sft_dataset", root, limit=1) == rows[0]["source_batches"]
    assert contributing_batches("sft_dataset", root, limit=0) == contributing_batches("sft_dataset", root)
    first_three = sorted({b for r in rows[:3] for b in r["source_batches"]})
    assert contributing_batches("sft_dataset", root, limit=3) == first_three


def test_window_batches_skip_padding_and_documents_without_a_batch():
    doc_ids = np.array([[0, 0, 1, 1], [1, 2, -1, -1], [3, 3, 3, 3]], dtype=np.int32)
    assert builders.window_batches(doc_ids, ["b1", "b2", None, "b1"]) == [["b1", "b2"], ["b2"], ["b1"]]
