"""SFT / preference / GRPO builders on hand-made traces: edge cases a user would hit."""

import json

import pytest

from training_assets import tokenizer_trainer as tt
from training_assets.training_data import (
    build_grpo_groups,
    build_preference_pairs,
    build_sft_examples,
    compose_reward,
    filter_by_difficulty,
)


@pytest.fixture(scope="module")
def tokenizer():
    return tt.train_tokenizer(["What is 6 * 7? The answer is 42. I will compute it. calculator expression"] * 20, vocab_size=600)


def test_sft_keeps_successful_traces_with_masks_on_assistant_turns_only(make_trace, tokenizer):
    traces = [make_trace("t1", 0, True, 1.0), make_trace("t1", 1, False, 0.0, answer="41"), make_trace("t2", 0, True)]
    result = build_sft_examples(traces, tokenizer=tokenizer)
    assert [r["id"] for r in result] == ["t1-a0", "t2-a0"]
    assert result.skipped == [("t1-a1", "not successful")]
    row = result[0]
    assert len(row["input_ids"]) == len(row["assistant_mask"]) == row["n_tokens"]
    trained = tokenizer.decode([i for i, m in zip(row["input_ids"], row["assistant_mask"], strict=True) if m])
    assert trained.startswith("I will compute it.<|tool_call|>") and trained.endswith("The answer is 42.<|end|>")
    assert "What is 6 * 7" not in trained and "<|tool_result|>" not in trained
    messages = json.loads(row["messages"])
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]


def test_sft_skips_repeats_overlong_and_no_success(make_trace, tokenizer):
    traces = [make_trace("t1", 0, True), make_trace("t1", 1, True), make_trace("t3", 0, False)]
    traces[1] = traces[1].model_copy(update={"trace_id": "t1-copy", "messages": traces[0].messages})
    result = build_sft_examples(traces, tokenizer=tokenizer, max_tokens=10_000)
    assert [r["id"] for r in result] == ["t1-a0"]
    assert dict(result.skipped) == {"t1-copy": "repeats an earlier conversation", "t3-a0": "not successful"}
    short = build_sft_examples(traces[:1], tokenizer=tokenizer, max_tokens=5)
    assert len(short) == 0 and "max_tokens=5" in short.skipped[0][1]


def test_pairs_split_at_divergence_and_record_the_failure_point(make_trace):
    good = make_trace("t1", 0, True, 1.0)
    misread = make_trace("t1", 1, False, 0.2, answer="41", failure_point=4)
    tool_error = make_trace("t1", 2, False, 0.0, tool_result="error: timeout", answer="40")
    result = build_preference_pairs([good, misread, tool_error])
    by_id = {r["id"]: r for r in result}
    assert set(by_id) == {"t1-a0>t1-a1", "t1-a0>t1-a2"}
    a = by_id["t1-a0>t1-a1"]
    # same call and same tool result: the prompt runs up to the final assistant turn
    assert [m["role"] for m in json.loads(a["prompt"])] == ["system", "user", "assistant", "tool"]
    assert json.loads(a["chosen"]) == [{"role": "assistant", "content": "The answer is 42."}]
    assert json.loads(a["rejected"]) == [{"role": "assistant", "content": "The answer is 41."}]
    assert a["failure_point"] == 4
    b = by_id["t1-a0>t1-a2"]
    # the tool result differs (environment), so the split backs up to the shared assistant call
    assert [m["role"] for m in json.loads(b["prompt"])] == ["system", "user"]
    assert b["failure_point"] == 3  # no recorded failure point: first divergence (the tool result)
    assert all(r["chosen"] != r["rejected"] for r in result)


def test_pairs_none_for_no_success_single_attempt_and_ties(make_trace):
    no_success = [make_trace("a", 0, False, 0.0, answer="1"), make_trace("a", 1, False, 0.5, answer="2")]
    single = [make_trace("b", 0, True, 1.0)]
    ties = [make_trace("c", 0, True, 1.0, thought="x"), make_trace("c", 1, True, 1.0, thought="y")]
    result = build_preference_pairs(no_success + single + ties)
    assert len(result) == 0
    assert dict(result.skipped) == {"a": "no successful attempt", "b": "single attempt", "c": "tie: equal scores"}


def test_pairs_use_score_order_among_successes_and_optionally_among_failures(make_trace):
    better, worse = make_trace("s", 0, True, 0.9, thought="x"), make_trace("s", 1, True, 0.4, thought="y")
    assert [r["id"] for r in build_preference_pairs([worse, better])] == ["s-a0>s-a1"]
    failures = [make_trace("f", 0, False, 0.5, answer="1"), make_trace("f", 1, False, 0.1, answer="2")]
    assert len(build_preference_pairs(failures)) == 0
    assert [r["id"] for r in build_preference_pairs(failures, require_success=False)] == ["f-a0>f-a1"]


def test_pairs_identical_conversations_and_cap_per_task(make_trace):
    ok = make_trace("d", 0, True, 1.0)
    same_but_failed = ok.model_copy(update={"trace_id": "d-a1", "outcome": ok.outcome.model_copy(update={"success": False})})
    result = build_preference_pairs([ok, same_but_failed])
    assert len(result) == 0 and "identical conversations" in result.skipped[0][1]
    many = [make_trace("m", i, i < 3, 1.0 if i < 3 else 0.0, thought=f"t{i}", answer=str(i)) for i in range(6)]
    assert len(build_preference_pairs(many, max_pairs_per_task=2)) == 2
    assert len(build_preference_pairs(many, max_pairs_per_task=100)) == 9


def test_grpo_groups_rewards_and_normalised_advantages(make_trace):
    traces = [make_trace("g", 0, True, 1.0), make_trace("g", 1, False, 0.0, answer="41"),
              make_trace("g", 2, False, 0.0, answer="40"), make_trace("g", 3, True, 1.0, thought="again")]
    reward = compose_reward({"success": 1.0, "answer": 0.5})
    (group,) = build_grpo_groups(traces, reward_fn=reward).rows
    assert group["rewards"] == [1.5, 0.0, 0.0, 1.5] and group["pass_rate"] == 0.5 and group["expected_answer"] == "42"
    assert sum(group["advantages"]) == pytest.approx(0.0, abs=1e-9)
    std = (sum((r - 0.75) ** 2 for r in group["rewards"]) / 3) ** 0.5  # Bessel-corrected
    assert group["advantages"][0] == pytest.approx(0.75 / (std + 1e-4))
    (dr,) = build_grpo_groups(traces, reward_fn=reward, scale_rewards="none").rows
    assert dr["advantages"] == [0.75, -0.75, -0.75, 0.75]
    assert [m["role"] for m in json.loads(group["prompt"])] == ["system", "user"]
    assert json.loads(group["completions"][0])[-1]["content"] == "The answer is 42."


def test_grpo_single_attempt_ties_and_difficulty_filter(make_trace):
    traces = [make_trace("one", 0, True), make_trace("tie", 0, True, thought="a"), make_trace("tie", 1, True, thought="b"),
              make_trace("mix", 0, True), make_trace("mix", 1, False, answer="0")]
    groups = build_grpo_groups(traces, reward_fn=compose_reward({"success": 1.0}))
    assert [g["task_id"] for g in groups] == ["mix", "tie"]
    assert groups.skipped[0][0].startswith("one:") and "min_group_size" in groups.skipped[0][1]
    tie = next(g for g in groups if g["task_id"] == "tie")
    assert tie["advantages"] == [0.0, 0.0]  # zero variance: zero advantages, not a division by zero
    kept = filter_by_difficulty(groups)
    assert [g["task_id"] for g in kept] == ["mix"] and kept.skipped[0][1] == "zero reward variance"
    assert len(filter_by_difficulty(groups, max_pass_rate=0.4)) == 0


def test_grpo_accepts_rollout_dicts_with_plain_text_completions():
    rollouts = [{"task_id": "r", "prompt": "Say 4", "completion": "4", "success": True, "expected_answer": "4"},
                {"task_id": "r", "prompt": "Say 4", "completion": "5", "success": False, "expected_answer": "4"}]
    (group,) = build_grpo_groups(rollouts, reward_fn=compose_reward({"answer": 1.0})).rows
    assert group["rewards"] == [1.0, 0.0] and json.loads(group["prompt"]) == [{"role": "user", "content": "Say 4"}]


def test_attempts_that_never_answer_are_skipped_not_trained_on(make_trace):
    crashed = make_trace("e", 1, False, 0.0, tool=False).model_copy(update={"messages": make_trace("e", 1, False).messages[:2]})
    traces = [make_trace("e", 0, True), crashed, make_trace("e", 2, False, 0.0, answer="7")]
    groups = build_grpo_groups(traces, reward_fn=compose_reward({"success": 1.0}))
    assert ("e-a1", "empty completion") in groups.skipped and len(groups[0]["completions"]) == 2
    pairs = build_preference_pairs(traces)
    assert [r["id"] for r in pairs] == ["e-a0>e-a2"]


def _three_forms(traces):
    """The same traces as Trace objects, plain trace-schema dicts (the seed's form) and raw_traces rows."""
    from training_assets.ingest import trace_row

    dicts = [t.model_dump(mode="json", exclude_none=True) for t in traces]
    rows = [trace_row("batch-x", i + 1, t) for i, t in enumerate(traces)]
    return traces, dicts, rows


def test_builders_take_plain_trace_dicts_and_raw_rows_as_well_as_trace_objects(make_trace):
    import training_assets.training_data as td

    traces = [make_trace("p", 0, True, 1.0), make_trace("p", 1, False, 0.0, answer="41"),
              make_trace("p", 2, False, 0.2, answer="40", failure_point=4), make_trace("q", 0, True)]
    objects, dicts, rows = _three_forms(traces)
    assert all(isinstance(d, dict) and isinstance(d["messages"][0], dict) for d in dicts)
    sft = [td.build_sft_examples(form) for form in (objects, dicts, rows)]
    pairs = [td.build_preference_pairs(form) for form in (objects, dicts, rows)]
    groups = [td.build_grpo_groups(form) for form in (objects, dicts, rows)]
    for results in (sft, pairs, groups):
        plain = [[{k: v for k, v in r.items() if k != "source_batches"} for r in res] for res in results]
        assert plain[0] == plain[1] == plain[2] and len(plain[0]) > 0
        assert all(r["source_batches"] == [] for r in results[1]) and all(r["source_batches"] == ["batch-x"] for r in results[2])
    assert [r["id"] for r in sft[1]] == ["p-a0", "q-a0"]


def test_a_dict_that_does_not_fit_the_trace_schema_is_a_clear_error(make_trace):
    import training_assets.training_data as td

    good = make_trace("p", 0, True).model_dump(mode="json", exclude_none=True)
    bad = {**good, "trace_id": "broken-1"}
    del bad["outcome"]
    with pytest.raises(ValueError, match=r"trace 1 \(broken-1\) does not fit the trace schema: missing_field: outcome"):
        td.build_sft_examples([good, bad])
    sharegpt = {"conversations": [{"from": "human", "value": "Say hi"}, {"from": "gpt", "value": "hi"}]}
    assert len(td.build_sft_examples([sharegpt])) == 1  # the other accepted shapes convert as on ingest
