"""LA-GRPO in the GRPO trainer: only tokens from each group's first divergence on carry the advantage."""

import json
import math

import pytest
import torch

from training_assets.trainers import GrpoSpec, TrainConfig, get_trainer
from training_assets.trainers.grpo import branch_starts, first_divergence


def test_branch_start_is_the_groups_first_divergence_in_completion_coordinates():
    rows = [{"group_id": "a", "prompt_ids": [1, 2], "completion_ids": [5, 6, 7, 8]},
            {"group_id": "a", "prompt_ids": [1, 2], "completion_ids": [5, 6, 9]},
            {"group_id": "a", "prompt_ids": [1, 2], "completion_ids": [5, 6, 7, 0]},
            {"group_id": "b", "prompt_ids": [3], "completion_ids": [4, 4]},
            {"group_id": "c", "prompt_ids": [1, 2, 5], "completion_ids": [6, 9]},  # template prefix differs in length
            {"group_id": "c", "prompt_ids": [1, 2], "completion_ids": [5, 6, 7]}]
    assert first_divergence([[5, 6, 7], [5, 6, 9]]) == 2 and first_divergence([[1], [1, 2]]) == 1
    # a: the three share [5, 6]; b: a group of one trains its whole completion; c: the shared
    # prefix [1, 2, 5, 6] ends inside the second row's completion and at the first row's start
    assert branch_starts(rows) == [2, 2, 2, 0, 1, 2]


def _groups():
    def msg(text):
        return json.dumps([{"role": "assistant", "content": text}])

    return [{"group_id": str(i), "prompt": json.dumps([{"role": "user", "content": f"what is {i} plus one?"}]),
             "completions": [msg(f"The answer is {i + 1}."), msg(f"The answer is {i + 7}.")],
             "rewards": [1.0, 0.0], "advantages": [1.0, -0.5], "expected_answer": str(i + 1)} for i in range(4)]


def _token_grads(trainer, model, batch):
    """d loss / d per-token log-prob, (B, C), through the trainer's own loss."""
    leaf = trainer._completion_logps(model, batch).detach().requires_grad_(True)
    trainer._completion_logps = lambda m, b: leaf
    loss, weight = trainer.loss(model, batch)
    loss.backward()
    return leaf.grad, weight


@pytest.mark.parametrize("loss_type", ["la_grpo", "grpo"])
def test_la_grpo_masks_the_shared_prefix_out_of_the_gradient(tmp_path, tokenizer, base_model_dir, loss_type):
    from transformers import AutoModelForCausalLM

    config = TrainConfig(base_model=str(base_model_dir), output_dir=str(tmp_path), max_steps=1, batch_size=8,
                         grpo=GrpoSpec(rollout="dataset", loss_type=loss_type))
    trainer = get_trainer("grpo", config, tokenizer=tokenizer)
    rows = trainer.prepare(_groups(), tokenizer)
    model = AutoModelForCausalLM.from_pretrained(str(base_model_dir))
    batch = trainer.collate(rows, model)
    grads, weight = _token_grads(trainer, model, batch)
    mask = batch["completion_mask"]
    for b, row in enumerate(rows):
        other = next(r for r in rows if r["group_id"] == row["group_id"] and r is not row)
        shared = first_divergence([row["completion_ids"], other["completion_ids"]])  # "The answer is " and more
        assert shared > 3
        before, after = grads[b, :shared], grads[b, shared:][mask[b, shared:] > 0]
        if loss_type == "la_grpo":
            assert row["branch_start"] == shared and torch.all(before == 0)
        else:
            assert torch.all(before[mask[b, :shared] > 0] != 0)
        # ratio 1: d/dlogp of -A·r = -A per trained token, over the tokens each sequence averages
        n = int(mask[b, shared if loss_type == "la_grpo" else 0:].sum())
        assert after.tolist() == pytest.approx([-row["advantage"] / (n * len(rows))] * len(after), rel=1e-5)
    trained = sum(int(mask[b, (r["branch_start"] if loss_type == "la_grpo" else 0):].sum()) for b, r in enumerate(rows))
    assert weight == trained


def test_la_grpo_trains_on_mixed_rollouts(tmp_path, base_model_dir, grpo_groups):
    config = TrainConfig(base_model=str(base_model_dir), output_dir=str(tmp_path), max_steps=2, batch_size=2,
                         grpo=GrpoSpec(rollout="mixed", num_generations=2, max_new_tokens=4, loss_type="la_grpo"))
    result = get_trainer("grpo", config).train(grpo_groups)
    assert result["steps"] == 2 and all(math.isfinite(x) for x in result["losses"])
