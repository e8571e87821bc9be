"""The ORPO kind end to end: pairs built from traces, the first loss by hand, training moves the odds, the plan."""

import json
import math
import subprocess
import sys

import pytest
import torch

from tests.datasets.conftest import _make_trace
from tests.trainers.conftest import assistant
from training_assets import kinds
from training_assets.trainers import TrainConfig, get_trainer
from training_assets.trainers.config import OrpoSpec
from training_assets.trainers.sft import as_messages, encode_completion
from training_assets.training_data import build_preference_pairs


def _completion_logps(model, tokenizer, pair, side):
    """(sum of the completion's token log-probs, its token count) for one side, by hand on the full logits."""
    ids, mask, _ = encode_completion(tokenizer, as_messages(pair["prompt"]), as_messages(pair[side]), 512)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
    logp = torch.log_softmax(logits, dim=-1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    targets = torch.tensor(mask[1:], dtype=torch.bool)
    return float(logp[targets].sum()), int(targets.sum())


def test_orpo_reads_the_preference_pairs_built_from_traces_deterministically(tokenizer):
    traces = [_make_trace("t1", 0, True, 1.0), _make_trace("t1", 1, False, 0.2, answer="41"),
              _make_trace("t2", 0, True, 1.0), _make_trace("t2", 1, False, 0.0, tool_result="error: timeout", answer="40")]
    first, again = build_preference_pairs(traces), build_preference_pairs(list(reversed(traces)))
    assert kinds.kind("orpo").dataset == "preference_pairs"  # `build-dataset orpo` builds DPO's pairs
    assert [dict(r) for r in first] == [dict(r) for r in again] and len(first) == 2
    trainer = get_trainer("orpo", TrainConfig(max_steps=1), tokenizer=tokenizer)
    rows = trainer.prepare(list(first), tokenizer)
    assert [r["id"] for r in rows] == ["t1-a0>t1-a1", "t2-a0>t2-a1"] and trainer.skipped == []
    for row in rows:  # both sides: prompt + completion, loss only on the completion
        for ids, mask in (row["chosen"], row["rejected"]):
            assert len(ids) == len(mask) and 0 < sum(mask) < len(ids)


def test_orpo_first_loss_is_chosen_nll_plus_lambda_odds_ratio_by_hand(tmp_path, tokenizer, base_model_dir,
                                                                       preference_pairs):
    from transformers import AutoModelForCausalLM

    beta = 0.25
    # chosen completions of different lengths: a token mean over all of them is not the mean of per-pair means
    pairs = [{**p, "chosen": json.dumps(assistant(f"The answer is {i + 1}." + " Tool call search returned ok." * (i % 3)))}
             for i, p in enumerate(preference_pairs)]
    config = TrainConfig(base_model=str(base_model_dir), output_dir=str(tmp_path), max_steps=1,
                         batch_size=len(pairs), orpo=OrpoSpec(beta=beta))
    result = get_trainer("orpo", config).train(pairs)
    model = AutoModelForCausalLM.from_pretrained(str(base_model_dir))
    sides = [[_completion_logps(model, tokenizer, p, side) for side in ("chosen", "rejected")] for p in pairs]
    nll = -sum(c[0] for c, _ in sides) / sum(c[1] for c, _ in sides)  # token mean over every chosen completion token
    log_sigmoids = []
    for (c_sum, c_n), (r_sum, r_n) in sides:
        c, r = c_sum / c_n, r_sum / r_n
        log_odds = (c - r) - (math.log(1 - math.exp(c)) - math.log(1 - math.exp(r)))
        log_sigmoids.append(-math.log1p(math.exp(-log_odds)))
    assert result.loop.losses[0] == pytest.approx(nll - beta * sum(log_sigmoids) / len(sides), rel=1e-5)
    assert result.to_dict()["nll"] == pytest.approx([nll], rel=1e-5)
    assert result.adapter is False and (tmp_path / "final" / "model.safetensors").is_file()
    assert not (tmp_path / "ref_logps.json").exists()  # reference-free: nothing precomputed


def test_orpo_training_lowers_the_loss_and_raises_the_log_odds_of_chosen(tmp_path, base_model_dir, preference_pairs):
    config = TrainConfig(base_model=str(base_model_dir), output_dir=str(tmp_path), max_steps=6, batch_size=8, lr=3e-3)
    result = get_trainer("orpo", config).train(preference_pairs).to_dict()
    losses = result["losses"]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.05
    assert {k: len(result[k]) for k in ("chosen_rewards", "rejected_rewards", "reward_accuracy", "log_odds", "nll")} == {
        "chosen_rewards": 6, "rejected_rewards": 6, "reward_accuracy": 6, "log_odds": 6, "nll": 6}
    assert result["log_odds"][-1] > result["log_odds"][0]
    json.dumps(result)  # the result a training subprocess reports back must stay JSON


def test_orpo_skips_pairs_without_completion_tokens_and_refuses_when_none_is_left(tokenizer, preference_pairs):
    trainer = get_trainer("orpo", TrainConfig(max_steps=1, max_seq_len=4), tokenizer=tokenizer)
    with pytest.raises(ValueError, match=r"orpo: none of 16 pairs .*max_seq_len=4"):
        trainer.prepare(preference_pairs, tokenizer)
    assert trainer.skipped[0] == {"id": "0", "reason": "chosen has no assistant tokens within max_seq_len"}


def test_orpo_plans_two_sequences_per_pair_without_importing_torch():
    code = ("import sys; from training_assets.trainers import TrainConfig, get_trainer\n"
            "pair = {'prompt': '[{\"role\": \"user\", \"content\": \"' + 'x' * 80 + '\"}]', 'chosen': '[]', 'rejected': '[]'}\n"
            "p = get_trainer('orpo', TrainConfig(batch_size=2, epochs=2)).plan([pair] * 5)\n"
            "assert 'torch' not in sys.modules, 'plan imported torch'\n"
            "print(p.planned_steps, p.examples)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["6", "5"]  # ceil(5 / 2) × 2 epochs


def test_orpo_checkpoint_trains_a_full_model_from_the_base_checkpoint_on_the_pairs(data_root, write_upstream):
    from training_assets.trainers import jobs

    root = write_upstream(data_root)
    base = jobs.run_training(jobs.prepare_job("base_checkpoint", root, {"max_steps": 1, "batch_size": 4})).manifest
    orpo = jobs.run_training(jobs.prepare_job("orpo_checkpoint", root, {"max_steps": 2, "batch_size": 4})).manifest
    assert orpo.kind == "full" and orpo.config["base_model"] == base.checkpoint_dir  # one stage: no SFT before it
    assert orpo.data_versions["base_checkpoint"] == base.data_version and "preference_pairs" in orpo.data_versions
    assert orpo.examples["dataset"] == "preference_pairs" and orpo.train.steps == 2
