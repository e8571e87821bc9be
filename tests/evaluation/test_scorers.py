"""Scorers, case files and the gate decision: pure functions, no model."""

import doctest
import json

import pytest

from training_assets import deploy
from training_assets import evaluation as eh
from training_assets.evaluation import scorers


def test_docstring_examples_hold():
    for module in (scorers, deploy):  # the scorers' doctests live where the functions are defined
        outcome = doctest.testmod(module)
        assert outcome.attempted > 0 and outcome.failed == 0, module.__name__


@pytest.mark.parametrize(("scorer", "output", "spec", "expected"), [
    (scorers.score_exact, "OK", {"value": "OK"}, True),
    (scorers.score_exact, "OK then", {"value": "OK"}, False),
    (scorers.score_contains, "The answer is 5076.", {"value": "5076"}, True),
    (scorers.score_contains, "The answer is 5075.", {"value": "5076"}, False),
    (scorers.score_contains, "HELLO there", {"value": "hello"}, True),
    (scorers.score_contains, "HELLO there", {"value": "hello", "case_sensitive": True}, False),
    (scorers.score_not_contains, "the key is sk-1", {"value": "sk-1"}, False),
    (scorers.score_not_contains, "no secrets here", {"value": "sk-1"}, True),
    (scorers.score_regex, "It is 16.09 km", {"pattern": r"\b16\.09\b"}, True),
    (scorers.score_regex, "It is 16.1 km", {"pattern": r"\b16\.09\b"}, False),
    (scorers.score_refuse, "I'm sorry, but I cannot help with that.", {}, True),
    (scorers.score_refuse, "Sure! Step one: ...", {}, False),
])
def test_scorers_decide_with_a_reason(scorer, output, spec, expected):
    passed, reason = scorer(output, **spec)
    assert passed is expected
    assert reason


def test_tool_call_scorer_accepts_the_shapes_agents_emit():
    openai = json.dumps({"id": "c1", "type": "function",
                         "function": {"name": "calculator", "arguments": json.dumps({"expression": "2*3"})}})
    tagged = '<tool_call>{"name": "convert_units", "arguments": {"value": 3, "from": "mi", "to": "km"}}</tool_call>'
    assert scorers.score_tool_call(openai, name="calculator", required_args=["expression"])[0]
    assert scorers.score_tool_call("Let me call it: " + tagged, name="convert_units", required_args=["value", "from", "to"])[0]


@pytest.mark.parametrize(("output", "why"), [
    ('{"name": "calculator", "arguments": "{not json"}', "no JSON tool call"),
    ('{"name": "python", "arguments": {"code": "1"}}', "expected 'calculator'"),
    ('{"name": "calculator", "arguments": {"expr": "1"}}', "lacks arguments ['expression']"),
    ("calculator(2*3)", "no JSON tool call"),
])
def test_tool_call_scorer_says_what_is_wrong(output, why):
    passed, reason = scorers.score_tool_call(output, name="calculator", required_args=["expression"])
    assert not passed and why in reason


def test_shipped_suite_loads_and_covers_every_check_type():
    cases = eh.load_cases()
    assert {c.category for c in cases} == {"answer", "tool_use", "safety", "format"}
    assert {ch["type"] for c in cases for ch in c.checks} == set(eh.SCORERS)
    assert any(not isinstance(c.prompt, str) for c in cases)  # chat-message prompts too


@pytest.mark.parametrize(("line", "message"), [
    ('{"id": "a", "category": "x", "prompt": "p"}', "missing 'checks'"),
    ('{"id": "a", "category": "x", "prompt": "p", "checks": [{"type": "fuzzy"}]}', "unknown type"),
    ('{"id": "a", "category": "x", "prompt": "p", "checks": [{"type": "contains", "valu": "1"}]}', "valu"),
    ('{"id": "a", "category": "x", "prompt": 3, "checks": [{"type": "refuse"}]}', "string or a list"),
    ("{not json", "line 1: not JSON"),
])
def test_bad_case_files_fail_at_load_naming_the_line(tmp_path, line, message):
    path = tmp_path / "cases.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match="line 1") as info:
        eh.load_cases(path)
    assert message in str(info.value)


def test_report_gives_pass_rates_per_category():
    cases = [eh.parse_case({"id": str(i), "category": cat, "prompt": "p", "checks": [{"type": "contains", "value": "yes"}]})
             for i, cat in enumerate(["a", "a", "b", "b", "b"])]
    outputs = ["yes", "no", "yes", "yes", "no"]
    report = eh.summarize([eh.score_case(c, o) for c, o in zip(cases, outputs)])
    assert report.pass_rate == pytest.approx(3 / 5)
    assert report.by_category["a"] == {"n": 1 + 1, "passed": 1, "pass_rate": 0.5}
    assert report.by_category["b"]["pass_rate"] == pytest.approx(2 / 3)
    failed = [r for r in report.results if not r.passed]
    assert [r.id for r in failed] == ["1", "4"] and "'yes' not in answer" in failed[0].checks[0]["reason"]


METRICS = {"pass_rate": 0.5, "pass_rate/safety": 1.0, "pass_rate/answer": 0.2, "ta_held_out_perplexity/bits_per_byte": 2.0,
           "ta_held_out_perplexity/bpb_vs_uniform": 0.9}


def test_gate_passes_when_thresholds_hold_and_nothing_regressed():
    decision = eh.decide_gate(METRICS, eh.GateThresholds(min_pass_rate=0.5, min_category_pass_rate={"safety": 1.0},
                                                         max_bits_per_byte=2.5, max_bpb_vs_uniform=0.95),
                              baseline={"pass_rate": 0.5, "ta_held_out_perplexity/bits_per_byte": 2.0}, baseline_name="v1")
    assert decision.passed, decision.reasons


@pytest.mark.parametrize(("thresholds", "baseline", "why"), [
    (eh.GateThresholds(min_pass_rate=0.6), None, "pass_rate 0.500 < min 0.600"),
    (eh.GateThresholds(min_category_pass_rate={"answer": 0.5}), None, "pass_rate/answer 0.200 < min 0.500"),
    (eh.GateThresholds(min_category_pass_rate={"tool_use": 0.5}), None, "category 'tool_use' has no cases"),
    (eh.GateThresholds(max_bits_per_byte=1.5), None, "bits_per_byte 2.000 > max 1.5"),
    (eh.GateThresholds(max_bpb_vs_uniform=0.85), None, "bpb_vs_uniform 0.900 > max 0.85"),
    (eh.GateThresholds(max_regression=0.05), {"pass_rate": 0.6}, "worse than registered v1"),
    (eh.GateThresholds(max_regression=0.05), {"ta_held_out_perplexity/bits_per_byte": 1.8}, "worse than registered v1"),
])
def test_gate_fails_and_says_why(thresholds, baseline, why):
    decision = eh.decide_gate(METRICS, thresholds, baseline, "v1")
    assert not decision.passed
    assert any(why in r for r in decision.reasons), decision.reasons


def test_gate_compares_only_the_chosen_metrics_with_the_registered_model():
    baseline = {"pass_rate": 0.5, "pass_rate/answer": 0.9}
    assert not eh.decide_gate(METRICS, eh.GateThresholds(), baseline).passed
    decision = eh.decide_gate(METRICS, eh.GateThresholds(regression_metrics=["pass_rate"]), baseline)
    assert decision.passed and not any("pass_rate/answer" in r for r in decision.reasons)


def test_gate_tolerates_regression_within_the_allowance():
    decision = eh.decide_gate(METRICS, eh.GateThresholds(max_regression=0.05),
                              {"pass_rate": 0.54, "ta_held_out_perplexity/bits_per_byte": 1.92}, "v1")
    assert decision.passed, decision.reasons


def test_gate_needs_the_perplexity_task_when_bits_per_byte_is_gated():
    for thresholds in (eh.GateThresholds(max_bits_per_byte=8.0), eh.GateThresholds(max_bpb_vs_uniform=0.97)):
        decision = eh.decide_gate({"pass_rate": 1.0}, thresholds)
        assert not decision.passed and "no perplexity task ran" in decision.reasons[0]
