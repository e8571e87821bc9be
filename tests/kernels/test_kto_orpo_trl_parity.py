"""KTO and ORPO objectives (both backends) against TRL 1.16.0's own loss code on the same inputs.

As in ``test_trl_parity.py``, TRL's trainer methods run unbound on a stand-in ``self`` carrying
the attributes they read, so the arithmetic that runs is TRL's, line for line:

- ``KTOTrainer._compute_loss`` (trl/trainer/kto_trainer.py: ``kto`` loss, Eq. 7 of the paper,
  z0 = the clamped batch mean of mismatched-pair log-ratios, desirable/undesirable weights,
  ``nanmean`` over the batch). The stand-in model returns given per-token log-probs; the policy's
  mismatched-pair (KL) log-probs come from a stub of ``_compute_kl_logps`` (model plumbing, no
  loss arithmetic), the reference ones precomputed, as with ``precompute_ref_log_probs``.
- ``ORPOTrainer.get_batch_loss_metrics`` with its own ``odds_ratio_loss``
  (trl/experimental/orpo/orpo_trainer.py): ``nll - mean(beta * logsigmoid(log_odds))``; the
  forward pass (``concatenated_forward``) is stubbed to return given mean log-probs and NLL.
"""

import warnings
from collections import defaultdict
from functools import partial
from types import SimpleNamespace

import pytest
import torch

from training_assets.trainers import objectives

trl = pytest.importorskip("trl")

BACKENDS = ["torch", "numba"]
RTOL, ATOL = 1e-5, 1e-7


class _Accelerator:
    device = torch.device("cpu")

    @staticmethod
    def gather_for_metrics(x):
        return x


class _TokenLogpsModel:
    """Stands in for the fused-LM-head model: returns the given per-token log-probs (B, T)."""

    training = True

    def __init__(self, log_probs):
        self.log_probs = log_probs

    def __call__(self, **kwargs):
        zeros = torch.zeros_like(self.log_probs)
        return SimpleNamespace(log_probs=self.log_probs, entropy=zeros, mean_logits=zeros)


def _trl_kto(token_logps, completion_mask, labels, ref_logps, policy_kl_logps, ref_kl_logps, beta, weights):
    """TRL's KTO loss and its logged metrics on per-token policy log-probs (B, T)."""
    model = _TokenLogpsModel(token_logps)
    trainer = SimpleNamespace(
        model=model, accelerator=_Accelerator(), aux_loss_enabled=False, precompute_ref_logps=True,
        calculate_KL=True, loss_type="kto", beta=beta, desirable_weight=weights[0], undesirable_weight=weights[1],
        _compute_kl_logps=lambda model, batch: policy_kl_logps, _metrics=defaultdict(lambda: defaultdict(list)),
        _total_train_tokens=0, _tp_size=1,
    )
    inputs = {"input_ids": torch.zeros_like(completion_mask), "attention_mask": torch.ones_like(completion_mask),
              "completion_mask": completion_mask, "label": labels, "ref_logps": ref_logps,
              "ref_KL_logps": ref_kl_logps}
    from trl.trainer.kto_trainer import KTOTrainer

    loss = KTOTrainer._compute_loss(trainer, model, inputs, return_outputs=False)
    return loss, {k: v[-1] for k, v in trainer._metrics["train"].items()}


def _kto_case(b=6, t=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    completion_mask = (torch.rand(b, t + 1, generator=gen) < 0.8).long()
    completion_mask[:, 1] = 1
    token_logps = -2 * torch.rand(b, t, generator=gen) * completion_mask[:, 1:]
    ref_logps = token_logps.sum(1) + torch.randn(b, generator=gen)
    labels = torch.tensor([True, False, True, True, False, True])[:b]
    kl_policy = -6 * torch.rand(b, generator=gen)
    return token_logps, completion_mask, labels, ref_logps, kl_policy


@pytest.mark.parametrize("kl_shift", [0.6, -0.6], ids=["kl_positive", "kl_clamped"])
@pytest.mark.parametrize("weights", [(1.0, 1.0), (1.0, 1.33)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_kto_matches_trl(kl_shift, weights, backend):
    token_logps, completion_mask, labels, ref_logps, kl_policy = _kto_case(seed=len(backend))
    kl_ref = kl_policy - kl_shift + 0.1 * torch.randn(len(labels), generator=torch.Generator().manual_seed(9))
    beta = 0.2

    trl_leaf = token_logps.clone().requires_grad_()
    trl_loss, metrics = _trl_kto(trl_leaf, completion_mask, labels, ref_logps, kl_policy, kl_ref, beta, weights)
    trl_loss.backward()

    ours_leaf = token_logps.clone().requires_grad_()
    kl = objectives.kto_kl_estimate(kl_policy, kl_ref)
    ours = objectives.kto_loss(ours_leaf.sum(1), ref_logps, labels, kl, beta=beta, desirable_weight=weights[0],
                               undesirable_weight=weights[1], backend=backend)
    ours.loss.backward()
    torch.testing.assert_close(ours.loss, trl_loss, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(ours_leaf.grad, trl_leaf.grad, rtol=RTOL, atol=ATOL)
    assert float(ours.kl) == pytest.approx(metrics["kl"], rel=1e-6, abs=1e-7)
    assert float(ours.chosen_rewards.mean()) == pytest.approx(metrics["rewards/chosen"], rel=1e-5)
    assert float(ours.rejected_rewards.mean()) == pytest.approx(metrics["rewards/rejected"], rel=1e-5)


def _trl_orpo(chosen, rejected, nll, beta):
    """TRL's ORPO loss and metrics, its forward pass replaced by the given mean log-probs and NLL."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRLExperimentalWarning: the import path is the point here
        from trl.experimental.orpo.orpo_trainer import ORPOTrainer

    logits = torch.zeros(chosen.shape[0], 1, 1)
    trainer = SimpleNamespace(beta=beta, accelerator=_Accelerator(), aux_loss_enabled=False,
                              concatenated_forward=lambda model, batch: (chosen, rejected, logits, logits, nll))
    trainer.odds_ratio_loss = partial(ORPOTrainer.odds_ratio_loss, trainer)
    return ORPOTrainer.get_batch_loss_metrics(trainer, None, {})


@pytest.mark.parametrize("backend", BACKENDS)
def test_orpo_matches_trl(backend):
    gen = torch.Generator().manual_seed(3)
    chosen, rejected = -2.5 * torch.rand(2, 8, generator=gen) - 1e-3
    chosen[0], rejected[1] = -0.05, -0.6  # above log1mexp's branch point -ln 2 too
    nll = torch.tensor(1.7)
    beta = 0.1

    trl_leaves = [t.clone().requires_grad_() for t in (chosen, rejected, nll)]
    trl_loss, metrics = _trl_orpo(*trl_leaves, beta)
    trl_loss.backward()

    ours_leaves = [t.clone().requires_grad_() for t in (chosen, rejected, nll)]
    ours = objectives.orpo_loss(*ours_leaves, beta=beta, backend=backend)
    ours.loss.backward()
    torch.testing.assert_close(ours.loss, trl_loss, rtol=RTOL, atol=ATOL)
    for g_ours, g_trl in zip(ours_leaves, trl_leaves, strict=True):
        torch.testing.assert_close(g_ours.grad, g_trl.grad, rtol=RTOL, atol=ATOL)
    # TRL's names are crossed: "log_odds_ratio" is mean log sigma(z), "log_odds_chosen" is mean z
    assert float(ours.log_odds.mean()) == pytest.approx(metrics["log_odds_chosen"], rel=1e-5)
    assert -float(ours.odds_ratio_loss) / beta == pytest.approx(metrics["log_odds_ratio"], rel=1e-5)
    assert float(ours.chosen_rewards.mean()) == pytest.approx(metrics["rewards/chosen"], rel=1e-6)
    assert float(ours.rejected_rewards.mean()) == pytest.approx(metrics["rewards/rejected"], rel=1e-6)
    assert float(ours.nll) == pytest.approx(metrics["nll_loss"])
