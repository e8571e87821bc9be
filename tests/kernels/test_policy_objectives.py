"""DPO, GRPO and k3 KL: numba backend against torch autograd, values and gradients (fp32)."""

import pytest
import torch

from training_assets.trainers import objectives

RTOL, ATOL = 1e-5, 1e-7


def _grads(fn, leaves, **kw):
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    out = fn(*leaves, **kw)
    (out * torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape)).sum().backward()
    return out.detach(), [t.grad for t in leaves]


def _assert_parity(fn, leaves, **kw):
    out_t, g_t = _grads(fn, leaves, backend="torch", **kw)
    out_n, g_n = _grads(fn, leaves, backend="numba", **kw)
    torch.testing.assert_close(out_n, out_t, rtol=RTOL, atol=ATOL)
    for a, b in zip(g_n, g_t, strict=True):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
    return out_n, g_n


def _logps(b, seed):
    gen = torch.Generator().manual_seed(seed)
    return [-10 * torch.rand(b, generator=gen) for _ in range(4)]


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo", "hinge"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_dpo_matches_torch(loss_type, label_smoothing):
    _assert_parity(objectives.dpo_loss, _logps(6, 0), beta=0.3, label_smoothing=label_smoothing,
                   loss_type=loss_type)


def test_dpo_ipo_length_normalisation_and_one_pair():
    lengths = torch.tensor([3.0, 7.0, 1.0]), torch.tensor([5.0, 2.0, 9.0])
    _assert_parity(objectives.dpo_loss, _logps(3, 1), loss_type="ipo", chosen_lengths=lengths[0],
                   rejected_lengths=lengths[1])
    _assert_parity(objectives.dpo_loss, _logps(1, 2), beta=0.1)


def test_dpo_extreme_margins_stay_finite():
    pc, pr, rc, rr = (torch.tensor([0.0, -1e4]), torch.tensor([-1e4, 0.0]), torch.zeros(2), torch.zeros(2))
    out, grads = _assert_parity(objectives.dpo_loss, [pc, pr, rc, rr], beta=1.0, label_smoothing=0.1)
    assert torch.isfinite(out) and all(torch.isfinite(g).all() for g in grads)


def test_dpo_rejects_bad_arguments():
    pc, pr, rc, rr = _logps(2, 3)
    with pytest.raises(ValueError, match="label_smoothing"):
        objectives.dpo_loss(pc, pr, rc, rr, label_smoothing=0.5)
    with pytest.raises(ValueError, match="loss_type"):
        objectives.dpo_loss(pc, pr, rc, rr, loss_type="kto")
    with pytest.raises(ValueError, match="empty"):
        objectives.dpo_loss(*(torch.empty(0) for _ in range(4)), backend="numba")


def _grpo_inputs(b=4, t=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logps = -3 * torch.rand(b, t, generator=gen)
    old = logps + 0.4 * torch.randn(b, t, generator=gen)  # ratios on both sides of the clip range
    ref = logps + 0.3 * torch.randn(b, t, generator=gen)
    adv = torch.randn(b, generator=gen)
    mask = (torch.rand(b, t, generator=gen) < 0.75).long()
    mask[0] = 0  # a fully masked sequence
    mask[1, 1:] = 0  # a one-token sequence
    return logps, old, adv, mask, ref


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_grpo_surrogate_matches_torch(loss_type, beta):
    logps, old, adv, mask, ref = _grpo_inputs()

    def surrogate(lp, backend):
        return objectives.grpo_surrogate(lp, old, adv, mask, ref_logps=ref, beta=beta, epsilon_low=0.2,
                                         epsilon_high=0.28, loss_type=loss_type, backend=backend)

    _, (grad,) = _assert_parity(surrogate, [logps])
    assert torch.all(grad[0] == 0), "a fully masked sequence gets no gradient"


def test_la_grpo_only_trains_tokens_after_the_branch():
    logps, old, adv, mask, _ = _grpo_inputs(seed=1)
    mask = torch.ones_like(mask)
    branch = torch.tensor([0, 2, 5, 7])  # the last sequence branches after its end: no loss at all

    def surrogate(lp, backend):
        return objectives.grpo_surrogate(lp, old, adv, mask, loss_type="la_grpo", branch_start=branch,
                                         backend=backend)

    _, (grad,) = _assert_parity(surrogate, [logps])
    for b, start in enumerate(branch.tolist()):
        assert torch.all(grad[b, :start] == 0) and (start >= 7 or torch.any(grad[b, start:] != 0))
    with pytest.raises(ValueError, match="branch_start"):
        objectives.grpo_surrogate(logps, old, adv, mask, loss_type="la_grpo")


def test_grpo_clip_higher_is_asymmetric():
    logps = torch.zeros(2, 1, requires_grad=True)
    old = torch.tensor([[-0.25], [0.25]])  # ratios e^0.25 = 1.28 and e^-0.25 = 0.78
    adv = torch.tensor([1.0, -1.0])
    for backend in ("torch", "numba"):
        loss = objectives.grpo_surrogate(logps, old, adv, torch.ones(2, 1), epsilon_low=0.2, epsilon_high=0.3,
                                         loss_type="bnpo", backend=backend)
        (grad,) = torch.autograd.grad(loss, logps)
        # ratio 1.28 < 1 + 0.3: still inside clip-higher, so the positive advantage keeps its gradient;
        # ratio 0.78 < 1 - 0.2 with A < 0: clipped, no gradient
        assert grad[0, 0].item() == pytest.approx(-0.5 * torch.exp(torch.tensor(0.25)).item(), rel=1e-6)
        assert grad[1, 0].item() == 0.0


def test_approx_kl_matches_float64_and_torch():
    logps, _, _, mask, ref = _grpo_inputs(seed=2)
    ref[2, 3] = logps[2, 3]  # identical: KL exactly 0
    out, _ = _grads(objectives.approx_kl, [logps, ref], mask=mask, backend="numba")
    exact = objectives.approx_kl(logps.double(), ref.double(), mask)
    # k3 = e^d - d - 1 cancels in fp32 for small d: the kernel computes it in float64, so compare
    # to the float64 formula at rtol 1e-5 and to torch's fp32 result at fp32's absolute precision
    torch.testing.assert_close(out.double(), exact, rtol=RTOL, atol=1e-12)
    assert out[2, 3].item() == 0.0 and torch.all(out[mask == 0] == 0)
    out_t, g_t = _grads(objectives.approx_kl, [logps, ref], mask=mask, backend="torch")
    out_n, g_n = _grads(objectives.approx_kl, [logps, ref], mask=mask, backend="numba")
    torch.testing.assert_close(out_n, out_t, rtol=RTOL, atol=1e-6)
    for a, b in zip(g_n, g_t, strict=True):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
