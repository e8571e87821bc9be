"""A dataset file changed after it was built is refused before anything reads it, naming the file and the rebuild."""

import json

import pytest

from training_assets import cli
from training_assets.storage import write_parquet
from training_assets.training_data import dataset_path, load_sft_dataset, open_dataset_rows
from training_assets.training_data.io import DatasetChangedError, rows_to_table, write_dataset

ROWS = [{"id": f"s{i}", "task_id": "t", "messages": "[]", "input_ids": [5, 6, 7 + i], "assistant_mask": [0, 1, 1],
         "n_tokens": 3, "source_batches": ["b0"]} for i in range(40)]
REFUSAL = ("sft_dataset/data.parquet: SHA-256 differs from the one recorded when it was built",
           "rebuild it with `training-assets build-dataset sft` or re-materialise sft_dataset")


@pytest.fixture
def root(tmp_path):
    write_dataset("sft_dataset", rows_to_table("sft_dataset", ROWS), {"t": 1}, {}, tmp_path)
    return tmp_path


def _refused(root):
    for read in (open_dataset_rows, lambda key, r: load_sft_dataset(r)):
        with pytest.raises(DatasetChangedError) as caught:
            read("sft_dataset", root)
        assert all(part in str(caught.value) for part in REFUSAL), caught.value


def test_a_rewritten_file_that_still_parses_is_refused_not_trained_on(root):
    edited = [dict(r, input_ids=[5, 6, 99]) if i == 3 else r for i, r in enumerate(ROWS)]  # one changed token
    write_parquet(dataset_path("sft_dataset", root), rows_to_table("sft_dataset", edited))
    _refused(root)


def test_a_flipped_byte_is_refused_before_pyarrow_reads_it(root):
    path = dataset_path("sft_dataset", root)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    _refused(root)


def test_a_dataset_recorded_before_the_sha256_was_is_checked_through_its_data_version(root):
    info_file = dataset_path("sft_dataset", root).parent / "dataset.json"
    info = json.loads(info_file.read_text())
    info_file.write_text(json.dumps({k: v for k, v in info.items() if k != "sha256"}))
    assert len(open_dataset_rows("sft_dataset", root)) == len(ROWS)  # intact: opens
    write_parquet(dataset_path("sft_dataset", root), rows_to_table("sft_dataset", ROWS[1:]))
    with pytest.raises(DatasetChangedError, match="no longer gives the recorded data version"):
        open_dataset_rows("sft_dataset", root)


def test_train_refuses_a_changed_dataset_in_one_line(root, capsys):
    write_parquet(dataset_path("sft_dataset", root), rows_to_table("sft_dataset", ROWS[:-1]))
    assert cli.main(["train", "sft", "--root", str(root), "--set", "base_model=unused"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(part in err for part in REFUSAL), err
