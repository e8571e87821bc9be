"""decontaminate: held-out n-gram overlap, reasons naming the eval set and example."""

import json

import pytest

from training_assets.data_engine import build_index, decontaminate, load_held_out
from training_assets.sample_traces import make_batches

LONG_PROMPT = ("Write a function that returns the longest palindromic substring of a string and explain "
               "its time complexity in one short paragraph")


def test_record_sharing_a_13gram_is_dropped_with_eval_set_and_example_id():
    held = [{"eval_set": "code_eval", "id": "ex-7", "text": LONG_PROMPT}]
    records = [
        {"id": "copy", "text": "Sure! Task: " + " ".join(LONG_PROMPT.split()[2:16]) + " and more."},
        {"id": "near", "text": " ".join(LONG_PROMPT.split()[:12]) + " unrelated ending"},  # only 12 words shared
        {"id": "clean", "text": "A recipe for bread with flour water salt and yeast."},
    ]
    result = decontaminate(records, held, ngram=13)
    assert [r["id"] for r in result.kept] == ["near", "clean"]
    (drop,) = result.dropped
    assert (drop.id, drop.stage, drop.reason) == ("copy", "decontaminate", "held_out_overlap")
    assert "code_eval/ex-7" in drop.detail and "13-gram" in drop.detail


def test_overlap_ignores_ascii_case_and_whitespace_layout():
    held = [{"id": "h", "text": LONG_PROMPT}]
    shouted = "\n".join(LONG_PROMPT.upper().split())
    assert decontaminate([{"id": "r", "text": shouted}], held).dropped[0].detail.endswith("held_out/h")


def test_short_examples_are_indexed_whole_and_very_short_ones_reported():
    held = [{"id": "short", "text": "Convert 12.5 miles to kilometers."}, {"id": "tiny", "text": "Say hi"}]
    index = build_index(held, ngram=13, min_ngram=5)
    assert set(index.by_n) == {5} and index.too_short == [("held_out", "tiny")]
    result = decontaminate([{"id": "r", "text": "user: convert 12.5 miles to kilometers. thanks"},
                            {"id": "s", "text": "say hi to everyone in the room today please"}], index)
    assert [d.id for d in result.dropped] == ["r"]
    assert result.stats["too_short"] == ["held_out/tiny"]


def test_planted_sample_contamination_is_found():
    batches, eval_rows = make_batches()
    records = [json.loads(line) for line in batches[0] if line.startswith(b"{") and b'"outcome"' in line]
    records = [{"id": r["trace_id"], "text": "\n".join(m.get("content") or "" for m in r["messages"])}
               for r in records if isinstance(r.get("trace_id"), str) and isinstance(r.get("messages"), list)]
    held = [{"eval_set": "agent_tasks", "id": r["id"], "text": r["prompt"]} for r in eval_rows]
    dropped = decontaminate(records, held).dropped
    assert sorted(d.detail.split(" with ")[1] for d in dropped) == ["agent_tasks/arith-0000", "agent_tasks/units-0001"]


def test_load_held_out_names_the_file_and_line(tmp_path):
    good = tmp_path / "qa.jsonl"
    good.write_text('{"id": "q1", "prompt": "What is the capital of France?"}\n')
    assert [(e.eval_set, e.example_id) for e in load_held_out([good])] == [("qa", "q1")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "q1", "prompt": "x"}\n{"id": "q2"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl line 2: missing field\(s\) \['prompt'\]"):
        load_held_out([bad])
    with pytest.raises(ValueError, match="no such file"):
        load_held_out([tmp_path / "missing.jsonl"])


def test_an_ngram_below_one_word_is_refused():
    from training_assets.data_engine import CurationConfig
    from training_assets.data_engine.decontam import build_index

    with pytest.raises(ValueError, match="must be >= 1"):
        build_index([], ngram=0)
    with pytest.raises(ValueError, match="decontam_ngram\n  Input should be greater than or equal to 1"):
        CurationConfig(decontam_ngram=0)
