"""The committed task pools are the generator's output, decontaminated; teacher traces validate and score;
the bootstrap intervals are deterministic and paired by task."""

import pytest

from training_assets.harness import families
from training_assets.harness.errors import HarnessError
from training_assets.harness.runner import SYSTEM_PROMPT
from training_assets.harness.scoring import score
from training_assets.harness.stats import bootstrap_ci, paired_gain_ci
from training_assets.harness.tasks import Task, load_tasks
from training_assets.harness.teacher import teacher_trace
from training_assets.trace_schema import parse_trace


def test_the_committed_pools_are_the_generators_output():
    for path, data in families.pool_files().items():
        assert path.read_bytes() == data, f"{path} is stale: run python -m training_assets.harness.families --write"


def test_the_held_out_pool_is_large_disjoint_and_decontaminated():
    train, held_out = load_tasks(families.TRAIN_TASKS), load_tasks(families.HELD_OUT_TASKS)
    assert 280 <= len(train) <= 320 and len(held_out) >= 120
    for family in ("calculator", "units", "lists"):
        assert sum(t.family == family for t in held_out) >= 40
    assert sum(t.family == "lists" for t in held_out) > sum(t.family == "calculator" for t in held_out)
    assert not {t.task_id for t in train} & {t.task_id for t in held_out}
    assert families.shared_ngrams([t.prompt for t in train], [t.prompt for t in held_out]) == {}
    # the check can fail: a held-out prompt that reuses a training template is caught
    leaked = "Hello. " + next(t.prompt for t in train if families.word_ngrams(t.prompt))
    assert leaked in families.shared_ngrams([t.prompt for t in train], [leaked])


def test_every_training_task_has_a_teacher_trace_that_validates_and_scores():
    for task in load_tasks(families.TRAIN_TASKS):
        trace = teacher_trace(task, SYSTEM_PROMPT)
        again = parse_trace(trace.model_dump(mode="json", exclude_none=True))  # what ingest will accept
        assert again.outcome.success and again.metadata.source == "teacher"
        assert (again.metadata.family, again.metadata.task_id, again.metadata.score) == (task.family, task.task_id, 1.0)
        assert score(again.final_answer, task.expected_answer, units=task.answer_units)
        tool_results = [m for m in again.messages if m.role == "tool"]
        assert len(tool_results) == len(task.metadata["calls"]) and again.messages[0].content == SYSTEM_PROMPT


def test_a_task_whose_calls_do_not_give_its_answer_has_no_teacher_trace():
    task = Task(task_id="t", family="calculator", prompt="What is 2 + 2?", tools=["calculator"], expected_answer="5",
                metadata={"calls": [{"name": "calculator", "arguments": {"expression": "2 + 2"}}]})
    with pytest.raises(HarnessError, match="give '4', not the expected answer '5'"):
        teacher_trace(task, SYSTEM_PROMPT)
    with pytest.raises(HarnessError, match="no metadata.calls"):
        teacher_trace(task.model_copy(update={"metadata": {}}), SYSTEM_PROMPT)


def test_bootstrap_intervals_are_deterministic_and_cover_the_mean():
    values = [1, 0, 1, 1, 0, 1, 1, 1, 0, 1] * 5
    first, second = bootstrap_ci(values, seed=3), bootstrap_ci(values, seed=3)
    assert first == second and first.low < first.estimate == 0.7 < first.high
    assert bootstrap_ci([1, 1, 1]) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="non-empty"):
        bootstrap_ci([])


def test_the_paired_gain_is_per_task():
    baseline = {f"t{i}": 0.0 for i in range(40)}
    candidate = {f"t{i}": 1.0 if i < 30 else 0.0 for i in range(40)}
    gain = paired_gain_ci(candidate, baseline)
    assert gain.estimate == 0.75 and gain.low > 0
    same = paired_gain_ci(baseline, baseline)
    assert same == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="scored on one side only"):
        paired_gain_ci(candidate, {"t0": 1.0})
