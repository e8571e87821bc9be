"""KTO trainer: the first loss is the formula, training moves the rewards apart, mismatched KL pairs, plan."""

import json

import pytest

from training_assets.peft_manager import LoraSpec
from training_assets.trainers import TrainConfig, get_trainer
from training_assets.trainers.config import KtoSpec
from training_assets.trainers.kto import kl_partners

from .conftest import assistant, user


@pytest.fixture(scope="module")
def unpaired():
    """Desirable right answers and undesirable non-answers to distinct prompts, interleaved."""
    rows = []
    for i in range(8):
        good = i % 2 == 0
        text = f"The answer is {i + 1}." if good else "Tool call search returned ok."
        rows.append({"id": str(i), "prompt": json.dumps(user(f"what is {i} plus one?")),
                     "completion": json.dumps(assistant(text)), "label": good})
    return rows


def test_first_loss_is_half_the_weights_when_policy_is_reference(tmp_path, base_model_dir, unpaired):
    # r = 0 and z0 = max(0, 0) = 0: each example costs w * (1 - sigma(0)) = w / 2, averaged over B
    config = TrainConfig(base_model=str(base_model_dir), output_dir=str(tmp_path / "p"), max_steps=1, batch_size=8,
                         kto=KtoSpec(desirable_weight=2.0, undesirable_weight=1.0))
    result = get_trainer("kto", config).train(unpaired)
    assert result.loop.losses[0] == pytest.approx((4 * 2.0 * 0.5 + 4 * 1.0 * 0.5) / 8, abs=1e-6)
    assert (tmp_path / "p" / "ref_logps.json").is_file()
    per_step = TrainConfig(base_model=str(base_model_dir), output_dir=str(tmp_path / "s"), max_steps=1, batch_size=8,
                           lora=LoraSpec(r=4, alpha=8), kto=KtoSpec(precompute_ref_logps=False))
    assert get_trainer("kto", per_step).train(unpaired).loop.losses[0] == pytest.approx(0.5, abs=1e-6)


def test_training_lowers_the_loss_and_separates_the_rewards(tmp_path, base_model_dir, unpaired):
    config = TrainConfig(base_model=str(base_model_dir), output_dir=str(tmp_path), max_steps=6, batch_size=8, lr=3e-3,
                         lora=LoraSpec(r=8, alpha=16))
    result = get_trainer("kto", config).train(unpaired)
    losses = result.loop.losses
    assert all(map(lambda x: x == x, losses)) and losses[-1] < losses[0] - 0.01
    assert result.extra["chosen_rewards"][-1] > result.extra["rejected_rewards"][-1]
    assert len(result.extra["kl"]) == 6 and all(k >= 0 for k in result.extra["kl"])
    assert (tmp_path / "final" / "adapter_model.safetensors").is_file()


def test_kl_pairs_mismatch_prompts_within_a_run_and_never_pair_a_row_with_itself():
    prompts = ["a", "a", "b", "c", "c", "d", "e"]
    partners = kl_partners(prompts, 3)
    assert all(j != i for i, j in enumerate(partners))
    assert [prompts[j] != prompts[i] for i, j in enumerate(partners)] == [True] * 7
    assert all(i // 3 == min(j // 3, 1) or i == 6 for i, j in enumerate(partners))  # the last row of one joins run 2
    assert kl_partners(["x", "x"], 8) == [1, 0]  # one prompt only: the previous row's completion


def test_plan_and_a_non_bool_label_is_refused_with_the_row(tmp_path, base_model_dir, unpaired):
    trainer = get_trainer("kto", TrainConfig(base_model=str(base_model_dir), output_dir=str(tmp_path), max_steps=2,
                                             batch_size=4))
    plan = trainer.plan(unpaired)
    assert plan.planned_steps == 2 and plan.effective_batch == 4
    bad = [*unpaired[:3], {**unpaired[3], "label": "yes"}]
    with pytest.raises(ValueError, match=r"^kto: example 3: label is 'yes'; it must be true .*$"):
        trainer.train(bad)
