"""NumbaAdamW / NumbaSGD against torch.optim over several steps, and a training step with the
numba backend end to end (loss, gradients, update) against the torch backend."""

import pytest
import torch

from training_assets.trainers import numba_ops, objectives


def _params(seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=gen)) for shape in ((7, 5), (5,), (3, 2, 4))]


def _run_steps(make_opt, steps=4, seed=0):
    params = _params(seed)
    opt = make_opt(params)
    gen = torch.Generator().manual_seed(seed + 100)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    return params, opt


@pytest.mark.parametrize("hyper", [{"lr": 1e-2}, {"lr": 3e-3, "betas": (0.8, 0.95), "eps": 1e-6,
                                                  "weight_decay": 0.1}])
def test_numba_adamw_tracks_torch_adamw(hyper):
    ours, opt = _run_steps(lambda ps: numba_ops.NumbaAdamW(ps, **hyper))
    for fused in (False, True):
        ref, ref_opt = _run_steps(lambda ps, f=fused: torch.optim.AdamW(ps, fused=f, **hyper))
        for a, b in zip(ours, ref, strict=True):
            torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)
    p = ours[0]
    torch.testing.assert_close(opt.state[p]["exp_avg_sq"], ref_opt.state[ref[0]]["exp_avg_sq"], rtol=1e-5, atol=1e-8)
    assert int(opt.state[p]["step"]) == 4


@pytest.mark.parametrize("hyper", [{"lr": 0.1}, {"lr": 0.05, "momentum": 0.9}, {"lr": 0.05, "momentum": 0.9,
                                   "nesterov": True, "weight_decay": 0.01}, {"lr": 0.05, "momentum": 0.5,
                                   "dampening": 0.3}])
def test_numba_sgd_tracks_torch_sgd(hyper):
    ours, _ = _run_steps(lambda ps: numba_ops.NumbaSGD(ps, **hyper))
    ref, _ = _run_steps(lambda ps: torch.optim.SGD(ps, **hyper))
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)


def test_optimizers_skip_params_without_grad_and_reject_bad_input():
    p, q = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    numba_ops.NumbaAdamW([p, q], lr=0.1).step()
    assert torch.all(q == 1) and torch.all(p < 1)
    half = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    half.grad = torch.ones(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="fp32"):
        numba_ops.NumbaAdamW([half]).step()
    with pytest.raises(ValueError, match="Nesterov"):
        numba_ops.NumbaSGD([p], nesterov=True)
    with pytest.raises(ValueError, match="optimizer"):
        numba_ops.make_optimizer("lion", [p])


def test_make_optimizer_picks_the_backend():
    p = torch.nn.Parameter(torch.ones(2))
    assert type(numba_ops.make_optimizer("adamw", [p], backend="torch", lr=1e-3)) is torch.optim.AdamW
    assert type(numba_ops.make_optimizer("adamw", [p], backend="numba", lr=1e-3)) is numba_ops.NumbaAdamW
    assert type(numba_ops.make_optimizer("sgd", [p], backend="numba", lr=1e-3)) is numba_ops.NumbaSGD


def _tiny_lm(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(17, 8), torch.nn.Linear(8, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 17))


def test_a_training_step_with_the_numba_backend_gives_the_torch_loss():
    tokens = torch.randint(0, 17, (3, 9), generator=torch.Generator().manual_seed(1))
    labels = tokens[:, 1:].clone()
    labels[0, :3] = -100  # prompt tokens are not trained on
    losses = {}
    for backend in ("torch", "numba"):
        model = _tiny_lm()
        opt = numba_ops.make_optimizer("adamw", model.parameters(), backend=backend, lr=1e-2, weight_decay=0.01)
        history = []
        for _ in range(3):
            logits = model(tokens[:, :-1])  # (B, T, V), a non-leaf as in a real LM head
            loss = objectives.cross_entropy(logits.reshape(-1, 17), labels.reshape(-1), backend=backend)
            opt.zero_grad()
            loss.backward()
            opt.step()
            history.append(loss.item())
        losses[backend] = history
    assert losses["numba"] == pytest.approx(losses["torch"], rel=1e-5)
    assert losses["numba"][-1] < losses["numba"][0], "three AdamW steps lower the loss"
