"""stream_corpus over every input kind, ids kept or assigned."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from training_assets.data_engine import stream_corpus


def test_lists_jsonl_txt_and_parquet(tmp_path):
    assert [r["id"] for r in stream_corpus(["a", {"id": "k", "text": "b"}], name="mem")] == ["mem:0", "k"]
    jl = tmp_path / "docs.jsonl"
    jl.write_text(json.dumps({"id": "j1", "text": "one"}) + "\n\n" + json.dumps({"text": "two"}) + "\n")
    assert [(r["id"], r["text"], r["source"]) for r in stream_corpus(jl)] == [("j1", "one", "docs"), ("docs:1", "two", "docs")]
    txt = tmp_path / "notes.txt"
    txt.write_text("first block\nstill first\n\n\nsecond block\n")
    assert [r["text"] for r in stream_corpus(txt)] == ["first block\nstill first", "second block"]
    pqf = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": ["p0", "p1"], "other": [1, 2]}), pqf)
    assert [r["id"] for r in stream_corpus(pqf)] == ["t:0", "t:1"]


def test_hugging_face_datasets_streaming_from_local_files(tmp_path):
    jl = tmp_path / "hf.jsonl"
    jl.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(3)))
    records = list(stream_corpus({"hf": "json", "data_files": [str(jl)], "name": "hfdocs"}))
    assert [r["text"] for r in records] == ["doc 0", "doc 1", "doc 2"] and records[0]["id"] == "hfdocs:0"


def test_errors_name_the_source(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        list(stream_corpus(tmp_path / "nope.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{oops\n')
    with pytest.raises(ValueError, match="bad.jsonl line 2: not JSON"):
        list(stream_corpus(bad))
    with pytest.raises(ValueError, match="expected a string or an object with a string 'text'"):
        list(stream_corpus([{"body": "x"}]))
    with pytest.raises(ValueError, match="only local files"):
        list(stream_corpus({"hf": "json", "data_files": [str(tmp_path / "missing.jsonl")]}))
