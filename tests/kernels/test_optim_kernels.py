"""NumbaAdamW / NumbaSGD against torch.optim over several steps; the fused clip + AdamW + zero
step against torch's ``clip_grad_norm_`` + ``AdamW(fused=True)`` + ``zero_grad(set_to_none=False)``;
a training step and a ``run_loop`` run with the numba backend against the torch backend."""

import math

import numba
import numpy as np
import pytest
import torch

from training_assets.trainers import loop, numba_ops, numba_optim, objectives
from training_assets.trainers.base import TrainConfig
from training_assets_kernels import optim as KO

# fp32 rounding: the AdamW arithmetic is torch's (bit-identical but for torch's scalar tails); the
# clip coefficient can differ by one ulp because torch's fp32 norm and our float64 norm round apart
RTOL, ATOL = 1e-6, 1e-7


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


SHAPES = ((7, 5), (5,), (3, 2, 4), (KO.CHUNK + 11,))  # the last one spans two chunks


def _fused_vs_torch(max_norm, groups, steps=4, grad_scale=1.0):
    """Runs ``steps`` steps of both sides on the same gradients; returns (ours, torch's) params,
    optimizers and the per-step norms each side reported."""
    def make():
        gen = torch.Generator().manual_seed(0)
        return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]

    def split(params):
        return [{"params": params[:2], **groups[0]}, {"params": params[2:], **groups[-1]}]

    ours, ref = make(), make()
    opt = numba_optim.NumbaAdamW(split(ours), lr=1e-2)
    ref_opt = torch.optim.AdamW(split(ref), lr=1e-2, fused=True)
    gen = torch.Generator().manual_seed(7)
    norms = []
    for _ in range(steps):
        grads = [torch.randn(s, generator=gen) * grad_scale for s in SHAPES]
        for p, q, g in zip(ours, ref, grads, strict=True):
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad += g  # accumulate into the zeroed gradient, as the next backward does
            q.grad = g.clone() if q.grad is None else q.grad.add_(g)
        ref_norm = torch.nn.utils.clip_grad_norm_(ref, max_norm) if max_norm is not None else None
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=False)
        norms.append((opt.clip_step_zero(max_norm), None if ref_norm is None else float(ref_norm)))
    return ours, ref, opt, ref_opt, norms


@pytest.mark.parametrize("max_norm", [0.5, 1e4, None], ids=["clip-active", "clip-inactive", "no-clip"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_fused_clip_step_zero_matches_torch(max_norm, weight_decay):
    ours, ref, opt, ref_opt, norms = _fused_vs_torch(max_norm, [{"weight_decay": weight_decay}])
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=RTOL, atol=ATOL)
        assert torch.equal(a.grad, torch.zeros_like(a)), "the fused step zeroes the gradient in place"
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opt.state[a][key], ref_opt.state[b][key], rtol=RTOL, atol=1e-9)
        assert float(opt.state[a]["step"]) == float(ref_opt.state[b]["step"]) == 4
    for mine, theirs in norms:
        if max_norm is None:
            assert mine is None
        else:
            assert mine == pytest.approx(theirs, rel=1e-6)
            assert (theirs > max_norm) == (max_norm == 0.5), "the case clips (or not) as its name says"


def test_fused_step_keeps_per_group_hyper_parameters():
    groups = [{"lr": 3e-2, "weight_decay": 0.0, "betas": (0.8, 0.95), "eps": 1e-6},
              {"lr": 1e-3, "weight_decay": 0.2, "betas": (0.3, 0.9)}]  # beta1 0.3: torch's lerp from the grad side
    ours, ref, _, _, _ = _fused_vs_torch(0.5, groups)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("norm", [0.0, 1e-9, 0.3, 0.5 - 1e-7, 0.5, 0.7, 264.28494, 3e38, math.inf, math.nan])
def test_clip_coefficient_is_torchs(norm):
    expected = torch.clamp(0.5 / (torch.tensor(norm, dtype=torch.float32) + 1e-6), max=1.0).item()
    got = float(KO.clip_coefficient(norm, 0.5))
    assert got == expected or (math.isnan(got) and math.isnan(expected))


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_non_finite_norm_follows_torch(bad):
    def grads(shift):
        g = [torch.full(s, 0.1 + shift) for s in SHAPES]
        g[0][1, 2] = bad
        return g

    ours = [torch.nn.Parameter(torch.ones(s)) for s in SHAPES]
    ref = [torch.nn.Parameter(torch.ones(s)) for s in SHAPES]
    opt = numba_optim.NumbaAdamW(ours, lr=1e-2, weight_decay=0.1)
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1, fused=True)
    for p, q, g in zip(ours, ref, grads(0.0), strict=True):
        p.grad, q.grad = g.clone(), g.clone()
    norm = opt.clip_step_zero(1.0)
    ref_norm = torch.nn.utils.clip_grad_norm_(ref, 1.0)
    ref_opt.step()
    assert (math.isnan(norm) and ref_norm.isnan()) or norm == ref_norm.item() == math.inf
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=RTOL, atol=ATOL, equal_nan=True)
    assert torch.isnan(ours[0][1, 2]) and (torch.isnan(ours[1]).all() == (bad != math.inf))


def test_error_if_nonfinite_raises_before_changing_anything():
    p = torch.nn.Parameter(torch.ones(4))
    p.grad = torch.tensor([1.0, math.inf, 0.0, 0.0])
    opt = numba_optim.NumbaAdamW([p], lr=0.1)
    with pytest.raises(RuntimeError, match="inf"):
        opt.clip_step_zero(1.0, error_if_nonfinite=True)
    assert torch.equal(p.detach(), torch.ones(4)) and p.grad[1] == math.inf and int(opt.state[p]["step"]) == 0
    with pytest.raises(ValueError, match="max_norm"):
        opt.clip_step_zero(0.0)


def test_grad_norm_does_not_depend_on_the_thread_count():
    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(KO.CHUNK * 3 + 5, generator=gen), torch.randn(100, generator=gen)]
    addresses = np.array([[0, g.data_ptr(), 0, 0] for g in grads], np.int64)
    chunks = KO.chunk_table(np.array([g.numel() for g in grads]))
    threads = numba.get_num_threads()
    try:
        sums = []
        for n in sorted({1, threads}):
            numba.set_num_threads(n)
            sums.append(KO.grad_sq_sums(addresses, chunks).sum())
    finally:
        numba.set_num_threads(threads)
    assert len(set(sums)) == 1
    exact = sum(float((g.double() ** 2).sum()) for g in grads)
    assert sums[0] == pytest.approx(exact, rel=1e-12)


def test_chunk_table_covers_every_element_once():
    sizes = np.array([0, 5, 8, 16, 17], np.int64)
    table = KO.chunk_table(sizes, chunk=8)
    assert table.tolist() == [[1, 0, 5], [2, 0, 8], [3, 0, 8], [3, 8, 16], [4, 0, 8], [4, 8, 16], [4, 16, 17]]
    with pytest.raises(ValueError, match="chunk_table"):
        KO.chunk_table(np.array([-1]))


def test_fused_step_rejects_what_it_cannot_update_in_place():
    p = torch.nn.Parameter(torch.ones(3, 4))
    p.grad = torch.ones(4, 3).t()  # a strided gradient
    with pytest.raises(ValueError, match="grad.*contiguous"):
        numba_optim.NumbaAdamW([p]).clip_step_zero(1.0)


class _TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Embedding(17, 8), torch.nn.Linear(8, 8), torch.nn.Tanh(),
                                       torch.nn.Linear(8, 17))

    def forward(self, x):
        return self.net(x)


def test_run_loop_with_the_numba_backend_gives_the_torch_losses(tmp_path, monkeypatch):
    tokens = torch.randint(0, 17, (12, 9), generator=torch.Generator().manual_seed(1))
    fused_calls = []
    fused = numba_optim.NumbaAdamW.clip_step_zero
    monkeypatch.setattr(numba_optim.NumbaAdamW, "clip_step_zero",
                        lambda self, *a, **k: fused_calls.append(a) or fused(self, *a, **k))

    def collate(indices, model):
        rows = tokens[list(indices)]
        return {"x": rows[:, :-1], "y": rows[:, 1:], "n_tokens": rows[:, 1:].numel(), "weight": rows[:, 1:].numel()}

    results, models = {}, {}
    for backend in ("torch", "numba"):
        config = TrainConfig(output_dir=str(tmp_path / backend), max_steps=5, batch_size=4, lr=3e-2, weight_decay=0.01,
                             max_grad_norm=0.5, kernel_backend=backend)

        def loss_fn(model, batch, backend=backend):
            logits = model(batch["x"])
            return objectives.cross_entropy(logits.reshape(-1, 17), batch["y"].reshape(-1), backend=backend), \
                batch["weight"]

        models[backend] = _TinyLM()
        results[backend] = loop.run_loop(models[backend], len(tokens), collate, loss_fn, config)
    assert fused_calls == [(0.5,)] * 5, "the numba backend steps through the fused call, clipping at max_grad_norm"
    assert results["numba"].losses == pytest.approx(results["torch"].losses, rel=1e-5)
    assert results["numba"].losses[-1] < results["numba"].losses[0]
    for a, b in zip(models["numba"].parameters(), models["torch"].parameters(), strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)
        assert a.grad is not None and not a.grad.any()  # zeroed in place
        assert b.grad is None  # torch's path sets them to None
