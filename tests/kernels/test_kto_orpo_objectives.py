"""KTO and ORPO: the numba backend against torch autograd (values, parts and gradients, fp32), and
the refusals of inputs neither backend can give a meaningful loss for."""

import pytest
import torch

from training_assets.trainers import objectives

RTOL, ATOL = 1e-5, 1e-7


def _run(fn, leaves, *constants, **kw):
    """fn on fresh leaf copies, a non-trivial upstream gradient; returns (result, grads of the leaves)."""
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    out = fn(*leaves, *constants, **kw)
    (0.7 * out.loss).backward()
    return out, [t.grad for t in leaves]


def _assert_parity(fn, leaves, *constants, **kw):
    out_t, grads_t = _run(fn, leaves, *constants, backend="torch", **kw)
    out_n, grads_n = _run(fn, leaves, *constants, backend="numba", **kw)
    for name, part_t, part_n in zip(out_t._fields, out_t, out_n, strict=True):
        torch.testing.assert_close(part_n.detach(), part_t.detach(), rtol=RTOL, atol=ATOL, msg=name)
    for g_n, g_t in zip(grads_n, grads_t, strict=True):
        torch.testing.assert_close(g_n, g_t, rtol=RTOL, atol=ATOL)
    return out_n, grads_n


def _kto_case(b=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    policy = -20 * torch.rand(b, generator=gen)
    ref = policy + 4 * torch.randn(b, generator=gen)
    desirable = torch.rand(b, generator=gen) < 0.5
    desirable[0], desirable[1] = True, False
    return policy, ref, desirable


@pytest.mark.parametrize("kl_estimate", [0.0, 1.3, torch.tensor(0.4)])
@pytest.mark.parametrize("weights", [(1.0, 1.0), (1.0, 1.33)])
def test_kto_matches_torch(kl_estimate, weights):
    policy, ref, desirable = _kto_case()
    out, (g_policy, g_ref) = _assert_parity(objectives.kto_loss, [policy, ref], desirable, kl_estimate, beta=0.3,
                                            desirable_weight=weights[0], undesirable_weight=weights[1])
    torch.testing.assert_close(g_ref, -g_policy)
    assert out.chosen_rewards.shape == (int(desirable.sum()),)
    assert out.rejected_rewards.shape == (int((~desirable).sum()),)
    assert float(out.kl) == pytest.approx(float(kl_estimate))


def test_kto_gradient_pushes_desirable_up_and_undesirable_down():
    policy, ref, desirable = _kto_case(seed=1)
    for backend in ("torch", "numba"):
        _, (g_policy, _) = _run(objectives.kto_loss, [policy, ref], desirable, 0.2, backend=backend)
        assert torch.all(g_policy[desirable] < 0) and torch.all(g_policy[~desirable] > 0), backend


def test_kto_clamps_a_negative_kl_estimate_at_zero_and_never_differentiates_it():
    policy, ref, desirable = _kto_case(seed=2)
    kl = torch.tensor(-0.8, requires_grad=True)
    at_zero = objectives.kto_loss(policy, ref, desirable, 0.0)
    clamped = objectives.kto_loss(policy, ref, desirable, kl)
    torch.testing.assert_close(clamped.loss, at_zero.loss)
    assert float(clamped.kl) == 0.0 and not clamped.loss.requires_grad


def test_kto_with_one_class_only_and_one_example():
    policy, ref, _ = _kto_case(b=3, seed=3)
    out, _ = _assert_parity(objectives.kto_loss, [policy, ref], torch.ones(3, dtype=torch.bool), 0.5)
    assert out.rejected_rewards.numel() == 0
    _assert_parity(objectives.kto_loss, [policy[:1], ref[:1]], torch.zeros(1, dtype=torch.bool), 0.5)


def test_kto_extreme_margins_stay_finite():
    policy, ref = torch.tensor([0.0, -1e4, -1e4, 0.0]), torch.tensor([-1e4, 0.0, 0.0, -1e4])
    desirable = torch.tensor([True, True, False, False])
    out, grads = _assert_parity(objectives.kto_loss, [policy, ref], desirable, 0.0, beta=1.0)
    assert torch.isfinite(out.loss) and all(torch.isfinite(g).all() for g in grads)


def test_kto_kl_estimate_is_the_detached_mean_of_mismatched_log_ratios():
    policy_kl = torch.tensor([-3.0, -5.0, -1.0], requires_grad=True)
    estimate = objectives.kto_kl_estimate(policy_kl, torch.tensor([-4.0, -4.0, -4.0]))
    assert float(estimate) == pytest.approx(1.0) and not estimate.requires_grad


def test_kto_refuses_bad_arguments():
    policy, ref, desirable = _kto_case(b=3, seed=4)
    cases = [
        ((policy, ref, desirable.long(), 0.0), {}, "desirable is torch.int64; it must be a bool tensor"),
        ((policy, ref[:2], desirable, 0.0), {}, "one shape"),
        ((policy, ref, desirable, torch.zeros(2)), {}, "kl_estimate must be one number"),
        ((policy, ref, desirable, 0.0), {"beta": 0.0}, "beta=0.0 must be > 0"),
        ((policy, ref, desirable, 0.0), {"undesirable_weight": -1.0}, "must be >= 0"),
        ((torch.empty(0), torch.empty(0), torch.empty(0, dtype=torch.bool), 0.0), {}, "policy_logps is empty"),
        ((policy, ref, desirable, 0.0), {"backend": "jax"}, "backend='jax'"),
    ]
    for args, kw, message in cases:
        with pytest.raises(ValueError, match=message):
            objectives.kto_loss(*args, **kw)
    with pytest.raises(ValueError, match="kto_kl_estimate wants two"):
        objectives.kto_kl_estimate(policy, ref[:2])


def _orpo_case(b=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    chosen = -3 * torch.rand(b, generator=gen) - 1e-3
    rejected = -3 * torch.rand(b, generator=gen) - 1e-3
    chosen[0], rejected[0] = -0.01, -0.6932  # both sides of log1mexp's branch point -ln 2
    return chosen, rejected, torch.tensor(2.1)


@pytest.mark.parametrize("beta", [0.1, 1.0])
def test_orpo_matches_torch(beta):
    chosen, rejected, nll = _orpo_case()
    out, (_, _, g_nll) = _assert_parity(objectives.orpo_loss, [chosen, rejected, nll], beta=beta)
    assert float(g_nll) == pytest.approx(0.7), "the NLL enters the loss with weight 1"
    torch.testing.assert_close(out.loss, out.nll + out.odds_ratio_loss)


def test_orpo_log_odds_are_the_odds_ratio_of_the_mean_token_probabilities():
    chosen, rejected = torch.tensor([-0.2, -2.0]), torch.tensor([-1.0, -0.05])
    p_c, p_r = chosen.double().exp(), rejected.double().exp()
    expected = torch.log((p_c / (1 - p_c)) / (p_r / (1 - p_r))).float()
    for backend in ("torch", "numba"):
        out = objectives.orpo_loss(chosen, rejected, torch.tensor(0.0), beta=0.1, backend=backend)
        torch.testing.assert_close(out.log_odds, expected, rtol=1e-6, atol=0.0)
        assert out.log_odds[0] > 0 > out.log_odds[1]


def test_orpo_odds_stay_finite_for_probabilities_near_one_and_near_zero():
    chosen, rejected = torch.tensor([-1e-6, -80.0]), torch.tensor([-80.0, -1e-6])
    out, grads = _assert_parity(objectives.orpo_loss, [chosen, rejected, torch.tensor(1.0)], beta=0.5)
    assert torch.isfinite(out.loss) and all(torch.isfinite(g).all() for g in grads)


def test_orpo_certain_responses_are_capped_not_nan_and_a_certain_rejected_is_still_pushed_down():
    # fp32 log-softmax rounds to exactly 0 for a confident token; TRL's odds are infinite there
    chosen, rejected = torch.tensor([0.0, -1.0]), torch.tensor([-1.0, 0.0])
    out, (g_chosen, g_rejected, _) = _assert_parity(objectives.orpo_loss, [chosen, rejected, torch.tensor(1.0)])
    assert torch.isfinite(out.loss) and torch.isfinite(g_chosen).all() and torch.isfinite(g_rejected).all()
    assert g_rejected[1] > 0, "descent lowers the log-prob of the rejected response the model is certain of"
    capped = objectives.orpo_loss(torch.tensor([objectives.ORPO_MAX_MEAN_LOGP, -1.0]),
                                  torch.tensor([-1.0, objectives.ORPO_MAX_MEAN_LOGP]), torch.tensor(1.0))
    torch.testing.assert_close(out.loss, capped.loss)
    torch.testing.assert_close(out.chosen_rewards, 0.1 * chosen, msg="rewards report the log-probs as given")


def test_orpo_upcasts_bf16_log_probs_as_trl_does():
    chosen, rejected, nll = _orpo_case(seed=1)
    out = objectives.orpo_loss(chosen.bfloat16(), rejected.bfloat16(), nll)
    assert out.loss.dtype == torch.float32 and out.log_odds.dtype == torch.float32


def test_orpo_refuses_bad_arguments():
    chosen, rejected, nll = _orpo_case(b=3, seed=2)
    cases = [
        ((chosen, rejected[:2], nll), {}, "one shape"),
        ((chosen, rejected, torch.ones(3)), {}, "chosen_nll must be the scalar"),
        ((-chosen, rejected, nll), {}, "chosen_logps_mean has values > 0"),
        ((chosen, -rejected, nll), {"backend": "numba"}, "rejected_logps_mean has values > 0"),
        ((chosen, rejected, nll), {"beta": -0.1}, "beta=-0.1 must be > 0"),
        ((torch.empty(0), torch.empty(0), nll), {}, "chosen_logps_mean is empty"),
    ]
    for args, kw, message in cases:
        with pytest.raises(ValueError, match=message):
            objectives.orpo_loss(*args, **kw)


def test_the_numba_backend_refuses_what_it_cannot_run():
    policy, ref, desirable = _kto_case(b=3, seed=5)
    with pytest.raises(ValueError, match="policy_logps is torch.float64; the numba backend is fp32"):
        objectives.kto_loss(policy.double(), ref.double(), desirable, 0.0, backend="numba")
