"""run_loop reads step losses back every ``log_steps`` (not every step) without changing them."""

import numpy as np
import pytest
import torch

from training_assets.trainers import TrainConfig
from training_assets.trainers.loop import DataSchedule, run_loop

X = torch.linspace(-1, 1, 24).reshape(12, 2)
Y = X @ torch.tensor([[2.0], [-1.0]]) + 0.5


def _collate(indices, model):
    idx = torch.tensor(list(indices))
    return {"x": X[idx], "y": Y[idx], "n_tokens": len(idx), "weight": float(len(idx))}


def _loss(model, batch):
    return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"]), batch["weight"]


def _train(tmp_path, loss_fn=_loss, **overrides):
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    config = TrainConfig(output_dir=str(tmp_path), max_steps=7, batch_size=4, lr=0.05, seed=0, **overrides)
    return run_loop(model, len(X), _collate, loss_fn, config)


def test_losses_are_the_same_whatever_log_steps(tmp_path):
    every = _train(tmp_path / "a", log_steps=1)
    sparse = _train(tmp_path / "b", log_steps=3)
    assert len(every.losses) == 7
    assert sparse.losses == every.losses  # bit for bit: only when they are read back changed


def test_callbacks_see_the_latest_loss_at_log_steps(tmp_path):
    seen = []
    torch.manual_seed(0)
    config = TrainConfig(output_dir=str(tmp_path), max_steps=7, batch_size=4, lr=0.05, seed=0, log_steps=3)
    result = run_loop(torch.nn.Linear(2, 1), len(X), _collate, _loss, config, callbacks=[lambda s, m: seen.append((s, m["loss"]))])
    assert [s for s, _ in seen] == [3, 6, 7]
    assert [v for _, v in seen] == [result.losses[2], result.losses[5], result.losses[6]]


def test_a_non_finite_loss_names_its_own_step_when_read_back_later(tmp_path):
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        loss, weight = _loss(model, batch)
        return (loss * float("nan") if calls["n"] == 2 else loss), weight

    with pytest.raises(FloatingPointError, match="at step 2;"):
        _train(tmp_path, loss_fn=loss_fn, log_steps=5)


def test_data_schedule_draws_each_epoch_once_and_keeps_the_order():
    schedule = DataSchedule(10, 3, seed=7)
    got = [schedule.indices(p) for p in range(2 * schedule.per_epoch)]
    for p, idx in enumerate(got):
        epoch, g = divmod(p, schedule.per_epoch)
        order = np.random.default_rng([7, epoch]).permutation(10)
        assert idx == [int(i) for i in order[g * 3:(g + 1) * 3]]
