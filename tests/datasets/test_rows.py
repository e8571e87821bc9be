"""``DatasetRows``: the memory-mapped rows equal the list loaders' rows; the Arrow cache is derived from the Parquet."""

import json

import numpy as np
import pyarrow as pa
import pytest

from training_assets.dataset_rows import DatasetRows, arrow_cache_path
from training_assets.storage import sha256_file
from training_assets.training_data import (
    dataset_path,
    load_grpo_groups,
    load_preference_pairs,
    load_pretrain_windows,
    load_sft_dataset,
    open_dataset_rows,
    read_dataset_info,
)
from training_assets.training_data.io import rows_to_table, windows_to_table, write_dataset

N = 37


def _sft_rows(n, shift=0):
    rng = np.random.default_rng(n + shift)
    rows = []
    for i in range(n):
        k = int(rng.integers(1, 9))
        rows.append({"id": f"s{i}", "task_id": f"t{i % 3}", "messages": json.dumps([{"role": "user", "content": str(i)}]),
                     "input_ids": (rng.integers(0, 400, k) + shift).tolist(), "assistant_mask": rng.integers(0, 2, k).tolist(),
                     "n_tokens": k, "source_batches": [f"b{i % 2}"] if i % 5 else []})
    return rows


@pytest.fixture
def root(tmp_path):
    write_dataset("sft_dataset", rows_to_table("sft_dataset", _sft_rows(N)), {"t": 1}, {}, tmp_path)
    pairs = [{"id": f"p{i}", "task_id": "t", "prompt": "[]", "chosen": f'"c{i}"', "rejected": f'"r{i}"', "failure_point": i,
              "source_batches": ["b0"]} for i in range(5)]
    write_dataset("preference_pairs", rows_to_table("preference_pairs", pairs), {"t": 1}, {}, tmp_path)
    groups = [{"group_id": f"g{i}", "task_id": "t", "prompt": "[]", "completions": ["a", "b"], "rewards": [1.0, 0.0],
               "advantages": [0.5, -0.5], "expected_answer": None if i else "1", "pass_rate": 0.5, "source_batches": []}
              for i in range(4)]
    write_dataset("grpo_groups", rows_to_table("grpo_groups", groups), {"t": 1}, {}, tmp_path)
    cols = {k: np.arange(6 * 8, dtype=np.int32).reshape(6, 8) - (k == "doc_ids") * 20
            for k in ("input_ids", "position_ids", "doc_ids", "labels")}
    write_dataset("pretrain_windows", windows_to_table(cols), {"t": 1}, {}, tmp_path)
    return tmp_path


@pytest.mark.parametrize("asset,loader", [("sft_dataset", load_sft_dataset), ("preference_pairs", load_preference_pairs),
                                          ("grpo_groups", load_grpo_groups), ("pretrain_windows", load_pretrain_windows)])
def test_rows_equal_the_list_loader_rows(root, asset, loader):
    expected = loader(root)
    rows = open_dataset_rows(asset, root)
    assert len(rows) == len(expected)
    assert list(rows) == expected
    assert [rows[i] for i in range(len(rows))] == expected
    assert rows[-1] == expected[-1]
    order = [len(expected) - 1, 0, 2, 0, 1]
    assert rows.take(order) == [expected[i] for i in order]
    assert rows.take([]) == []
    assert list(rows[1:4]) == expected[1:4] and list(rows[:2]) == expected[:2] and list(rows[::2]) == expected[::2]


def test_take_spans_several_record_batches_in_the_order_asked():
    rows = _sft_rows(30)
    parts = [rows_to_table("sft_dataset", rows[a:b]) for a, b in ((0, 7), (7, 8), (8, 30))]
    mapped = DatasetRows(pa.concat_tables(parts))
    assert mapped.table.column("input_ids").num_chunks == 3
    order = [29, 7, 0, 8, 6, 7, 15]
    assert mapped.take(order) == [rows[i] for i in order]
    assert mapped.list_lengths("input_ids").tolist() == [len(r["input_ids"]) for r in rows]
    assert [a.tolist() for a in mapped.token_ids("input_ids", order)] == [rows[i]["input_ids"] for i in order]
    assert list(mapped[5:20]) == rows[5:20]
    assert mapped[5:20].take([0, 14]) == [rows[5], rows[19]]
    assert mapped[5:20].list_lengths("input_ids").tolist() == [len(r["input_ids"]) for r in rows[5:20]]
    with pytest.raises(IndexError, match="row 30 is out of range"):
        mapped.take([1, 30])


def test_columns_come_back_as_numpy_without_python_lists(root):
    expected = load_sft_dataset(root)
    rows = open_dataset_rows("sft_dataset", root)
    n_tokens = rows.column("n_tokens")
    assert isinstance(n_tokens, np.ndarray) and n_tokens.tolist() == [r["n_tokens"] for r in expected]
    ids = rows.token_ids("input_ids", [3, 1])
    assert all(isinstance(a, np.ndarray) and a.dtype == np.int32 for a in ids)
    assert [a.tolist() for a in ids] == [expected[3]["input_ids"], expected[1]["input_ids"]]
    flat = [t for offsets, values in rows.list_chunks("assistant_mask")
            for a, b in zip(offsets[:-1], offsets[1:]) for t in values[a:b].tolist()]
    assert flat == [t for r in expected for t in r["assistant_mask"]]
    with pytest.raises(TypeError, match="holds lists"):
        rows.column("input_ids")
    with pytest.raises(KeyError, match="no column 'labels'"):
        rows.list_lengths("labels")


def test_sums_and_pickles_equal_the_list_loader(root):
    import pickle

    expected = load_sft_dataset(root)
    rows = open_dataset_rows("sft_dataset", root)
    assert rows.column_sum("n_tokens") == sum(r["n_tokens"] for r in expected)
    assert rows.list_total("input_ids") == sum(len(r["input_ids"]) for r in expected)
    assert rows[2:].list_total("input_ids") == sum(len(r["input_ids"]) for r in expected[2:])
    copy = pickle.loads(pickle.dumps(rows[1:4]))  # by value: a memory map cannot be pickled
    assert len(copy) == 3 and copy.take([0, 2]) == [expected[1], expected[3]]


def test_arrow_cache_is_keyed_by_the_parquet_sha256_and_leaves_the_dataset_untouched(root):
    parquet = dataset_path("sft_dataset", root)
    before_sha, before_version = sha256_file(parquet), read_dataset_info("sft_dataset", root).data_version
    rows = open_dataset_rows("sft_dataset", root)
    cache = arrow_cache_path(parquet)
    assert cache.name == f"{before_sha}.arrow" and cache.is_file()
    assert [p.name for p in cache.parent.iterdir()] == [cache.name]  # no temp file left behind
    assert sha256_file(parquet) == before_sha and read_dataset_info("sft_dataset", root).data_version == before_version
    mtime = cache.stat().st_mtime_ns
    assert list(open_dataset_rows("sft_dataset", root)) == list(rows) and cache.stat().st_mtime_ns == mtime  # reused

    # a rewritten dataset: a new cache from the new bytes, the old one gone with the old folder
    changed = _sft_rows(N, shift=1)
    write_dataset("sft_dataset", rows_to_table("sft_dataset", changed), {"t": 2}, {}, root)
    assert list(open_dataset_rows("sft_dataset", root)) == load_sft_dataset(root) == changed
    assert [p.name for p in cache.parent.iterdir()] == [f"{sha256_file(parquet)}.arrow"]
    assert list(rows)[0] != changed[0]  # the earlier mapping still reads the file it opened


def test_missing_dataset_names_the_asset_to_materialise(tmp_path):
    with pytest.raises(FileNotFoundError, match="materialise the `sft_dataset` asset"):
        open_dataset_rows("sft_dataset", tmp_path)
