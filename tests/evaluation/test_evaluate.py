"""The reliability suite and lm-eval on a tiny random-init checkpoint, fully offline."""

import math
import sys

import pytest

from training_assets import evaluation as eh
from training_assets.checkpoint_loading import load_checkpoint


def test_suite_runs_on_an_adapter_through_its_manifest(data_root, tiny_checkpoints, manifest_writer):
    manifest_writer(data_root, "merged_adapter", "adapter", tiny_checkpoints["adapter"], tiny_checkpoints["base"],
                   tiny_checkpoints["tokenizer"])
    cases = eh.load_cases()
    report = eh.evaluate_checkpoint(data_root / "merged_adapter", cases, max_new_tokens=8)
    assert report.n_cases == len(cases) == len(report.results)
    assert set(report.by_category) == {"answer", "tool_use", "safety", "format"}
    assert sum(v["n"] for v in report.by_category.values()) == len(cases)
    assert 0.0 <= report.pass_rate <= 1.0
    for result in report.results:  # every verdict carries its reason
        assert result.checks and all(c["reason"] for c in result.checks)
    # a random-init model cannot solve arithmetic: the suite must not credit it
    assert report.by_category["answer"]["pass_rate"] == 0.0


def test_suite_scores_what_the_model_actually_generated(tiny_checkpoints):
    model, tokenizer = load_checkpoint(tiny_checkpoints["base"])
    case = eh.parse_case({"id": "c", "category": "x", "prompt": "What is 2 * 3?", "checks": [{"type": "refuse"}]})
    [answer] = eh.generate_answers(model, tokenizer, [case], max_new_tokens=6)
    expect = {"id": "c", "category": "x", "prompt": "What is 2 * 3?", "checks": [{"type": "exact", "value": answer}]}
    report = eh.evaluate_checkpoint(tiny_checkpoints["base"], [expect], max_new_tokens=6)
    assert report.results[0].output == answer and report.pass_rate == 1.0


def test_the_seed_facade_is_the_evaluation_package():
    from training_assets.trainers import eval_hooks

    assert eval_hooks.evaluate_checkpoint is eh.evaluate_checkpoint
    assert eval_hooks.evaluate_benchmarks is eh.evaluate_benchmarks


def test_a_folder_that_is_not_a_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither manifest.json, adapter_config.json nor config.json"):
        eh.evaluate_checkpoint(tmp_path, eh.load_cases())


def test_lm_eval_runs_the_shipped_tasks_offline(tiny_checkpoints, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    result = eh.evaluate_benchmarks(tiny_checkpoints["adapter"], limit=4)
    traces, text = result["tasks"]["ta_held_out_traces"], result["tasks"]["ta_held_out_perplexity"]
    assert 0.0 <= traces["acc"] <= 1.0 and result["n_samples"]["ta_held_out_traces"] == 4
    assert math.isfinite(text["bits_per_byte"]) and text["word_perplexity"] > text["byte_perplexity"] > 1.0
    # a random-init model is at chance: its bits/byte match a uniform guess over its vocabulary
    assert text["bits_per_byte"] / text["uniform_bits_per_byte"] == pytest.approx(1.0, abs=0.05)
    metrics = eh.gate_metrics(eh.summarize([]), result)
    decision = eh.decide_gate(metrics, eh.GateThresholds(max_bpb_vs_uniform=0.97))
    assert not decision.passed and "bpb_vs_uniform" in decision.reasons[0]


def test_unknown_shipped_task_names_the_shipped_ones():
    with pytest.raises(FileNotFoundError, match="ta_held_out_traces"):
        eh.shipped_task_config("ta_nope")


def test_without_lm_eval_benchmarks_are_skipped_with_the_fix(tiny_checkpoints, monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval now raises ImportError
    result = eh.evaluate_benchmarks(tiny_checkpoints["adapter"])
    assert result["tasks"] == {}
    assert "pip install 'training-assets[eval]'" in result["skipped"]
