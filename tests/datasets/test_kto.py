"""binary_feedback: every kept trace once with label = success, single attempts included, same order always."""

import json
import random
import shutil

from training_assets.training_data import builders
from training_assets.training_data.kto import build_binary_feedback


def test_every_trace_is_a_row_labelled_by_its_outcome_single_attempts_included(make_trace):
    traces = [make_trace("t2", 0, False, answer="41"), make_trace("t1", 1, False, answer="40"),
              make_trace("t1", 0, True), make_trace("solo", 0, True)]
    result = build_binary_feedback(traces)
    assert [(r["id"], r["label"]) for r in result] == [("solo-a0", True), ("t1-a0", True), ("t1-a1", False),
                                                       ("t2-a0", False)]
    assert result.skipped == []
    row = result[2]
    assert [m["role"] for m in json.loads(row["prompt"])] == ["system", "user"]
    assert [m["role"] for m in json.loads(row["completion"])] == ["assistant", "tool", "assistant"]
    assert json.loads(row["completion"])[-1]["content"] == "The answer is 40."
    shuffled = traces[:]
    random.Random(1).shuffle(shuffled)
    assert build_binary_feedback(shuffled).rows == result.rows


def test_traces_without_a_completion_or_over_the_cap_are_skipped_with_the_reason(make_trace):
    silent = {"trace_id": "t1-a3", "task_id": "t1", "outcome": {"success": False},
              "messages": [{"role": "user", "content": "What is 6 * 7?"}, {"role": "assistant", "content": " "}]}
    many = [make_trace("t1", n, n == 2) for n in range(3)]
    result = build_binary_feedback([silent, *many], max_per_task=2)
    assert [(r["id"], r["label"]) for r in result] == [("t1-a0", False), ("t1-a2", True)]  # the success kept first
    assert dict(result.skipped) == {"t1-a3": "completion has no assistant content or tool call",
                                    "t1-a1": "over max_per_task attempts of its task"}


def test_the_dataset_is_built_from_selected_traces_checked_and_reused(sample_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(sample_root, root)
    report = builders.build_kto_dataset(root)
    assert [c.name for c in report.checks] == list(builders.BUILDERS["binary_feedback"].checks)
    assert all(c.passed for c in report.checks), report.checks
    stats = report.info.stats
    assert stats["examples"] == report.info.rows > 0 and stats["desirable"] + stats["undesirable"] == stats["examples"]
    assert stats["desirable"] > 0 and stats["undesirable"] > 0
    again = builders.build_kto_dataset(root)
    assert again.reused and again.data_version == report.data_version
