"""Training on the memory-mapped dataset (``DatasetRows``) equals training on its list of dicts, bit for bit,
reads only each micro-batch's rows, and resumes at the saved position without reading the rows before it."""

import pytest

from training_assets.checkpoint_manifest import trained_manifest
from training_assets.dataset_rows import DatasetRows
from training_assets.training_data import load_preference_pairs, load_pretrain_windows, load_sft_dataset, open_dataset_rows
from training_assets.trainers import TrainConfig, get_trainer
from training_assets.trainers.accelerate_launch import load_examples
from training_assets.trainers.base import LazyRows
from training_assets.trainers.loop import DataSchedule


@pytest.fixture(scope="module")
def root(tmp_path_factory, write_upstream):
    return write_upstream(tmp_path_factory.mktemp("data"))


def _recording(monkeypatch):
    """Every index list ``DatasetRows.take`` is asked for."""
    calls = []
    original = DatasetRows.take

    def take(self, indices):
        calls.append(list(indices))
        return original(self, indices)

    monkeypatch.setattr(DatasetRows, "take", take)
    return calls


def _train(kind, config, examples, tokenizer):
    trainer = get_trainer(kind, config, tokenizer=tokenizer)
    return trainer.plan(examples), trainer.train(examples)


@pytest.mark.parametrize("kind,packing", [("sft", False), ("sft", True), ("pretrain", False)])
def test_mapped_rows_train_the_list_trajectory_reading_one_micro_batch_at_a_time(tmp_path, root, tokenizer, monkeypatch,
                                                                              kind, packing):
    listed = load_sft_dataset(root) if kind == "sft" else load_pretrain_windows(root)
    common = dict(max_steps=3, batch_size=4, grad_accum=2, lr=3e-3, seed=7, packing=packing, max_seq_len=64, torch_threads=1)
    plan_list, from_list = _train(kind, TrainConfig(output_dir=str(tmp_path / "list"), **common), listed, tokenizer)
    calls = _recording(monkeypatch)
    mapped = open_dataset_rows("sft_dataset" if kind == "sft" else "pretrain_windows", root)
    plan_mapped, from_mapped = _train(kind, TrainConfig(output_dir=str(tmp_path / "mapped"), **common), mapped, tokenizer)
    assert from_mapped.loop.losses == from_list.loop.losses  # bit for bit
    assert from_mapped.loop.tokens == from_list.loop.tokens
    assert plan_mapped == plan_list
    assert len(calls) == 3 * 2  # one take per micro-batch, nothing read up front
    assert max(map(len, calls)) <= (4 * 64 if packing else 4)  # packed: a row's examples, else the batch's
    if not packing:
        schedule = DataSchedule(len(mapped), 4, 7)
        assert calls == [schedule.indices(p) for p in range(6)]


def test_resume_continues_at_the_saved_position_without_reading_earlier_rows(tmp_path, root, tokenizer, monkeypatch):
    rows = open_dataset_rows("pretrain_windows", root)
    common = dict(max_steps=6, batch_size=4, lr=3e-3, seed=3, save_steps=2, save_total_limit=5, torch_threads=1)
    whole = get_trainer("pretrain", TrainConfig(output_dir=str(tmp_path / "whole"), **common),
                        tokenizer=tokenizer).train(load_pretrain_windows(root))
    first = get_trainer("pretrain", TrainConfig(output_dir=str(tmp_path / "run"), **{**common, "max_steps": 4}),
                        tokenizer=tokenizer).train(rows)
    assert first.loop.losses == whole.loop.losses[:4]

    calls = _recording(monkeypatch)
    resumed = get_trainer("pretrain", TrainConfig(output_dir=str(tmp_path / "run"), resume_from="auto", **common),
                          tokenizer=tokenizer).train(rows)
    assert resumed.loop.resumed_from.endswith("checkpoint-000004")
    assert resumed.loop.losses == whole.loop.losses  # the same trajectory, bit for bit
    schedule = DataSchedule(len(rows), 4, 3)
    assert calls == [schedule.indices(p) for p in (4, 5)]  # positions 0-3 are never read again


def test_jobs_load_datasets_mapped_and_dpo_prepares_from_them_as_from_the_list(tmp_path, root, base_model_dir):
    mapped = load_examples({"dataset": "preference_pairs", "root": str(root), "limit": 12})
    assert isinstance(mapped, DatasetRows) and len(mapped) == 12
    listed = load_preference_pairs(root)[:12]
    common = dict(base_model=str(base_model_dir), max_steps=2, batch_size=4, torch_threads=1)
    a = get_trainer("dpo", TrainConfig(output_dir=str(tmp_path / "list"), **common)).train(listed)
    b = get_trainer("dpo", TrainConfig(output_dir=str(tmp_path / "mapped"), **common)).train(mapped)
    assert b.loop.losses == a.loop.losses
    trainer = get_trainer("sft", TrainConfig(output_dir=str(tmp_path / "x")))
    assert isinstance(trainer.prepare(open_dataset_rows("sft_dataset", root), None), LazyRows)


@pytest.mark.parametrize("max_seq_len", [8, 100_000])
def test_sft_counts_the_examples_it_truncates_the_same_from_the_list_and_the_mapped_rows(tmp_path, root, tokenizer,
                                                                                      max_seq_len):
    listed, mapped = load_sft_dataset(root), open_dataset_rows("sft_dataset", root)
    longer = sum(len(e["input_ids"]) > max_seq_len for e in listed)
    counts = []
    for examples in (listed, mapped):
        trainer = get_trainer("sft", TrainConfig(output_dir=str(tmp_path), max_seq_len=max_seq_len), tokenizer=tokenizer)
        rows = trainer.prepare(examples, tokenizer)
        first = rows[0] if isinstance(rows, list) else rows.take([0])[0]
        assert len(first["input_ids"]) <= max_seq_len
        counts.append(trainer.result_extra()["truncated"])
    assert counts == [longer, longer]
    assert (longer > 0) == (max_seq_len == 8)


def test_the_truncated_count_reaches_the_checkpoint_manifest(tmp_path, root, tokenizer):
    listed = load_sft_dataset(root)
    result = get_trainer("sft", TrainConfig(output_dir=str(tmp_path), max_seq_len=8, max_steps=1, batch_size=2,
                                            torch_threads=1), tokenizer=tokenizer).train(listed)
    manifest = trained_manifest("sft_checkpoint", result, {}, {"sft_dataset": "v"})
    assert manifest.train.truncated == sum(len(e["input_ids"]) > 8 for e in listed) > 0
