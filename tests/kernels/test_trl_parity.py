"""DPO and GRPO objectives (both backends) against TRL 1.16.0's own loss code on the same inputs.

TRL is a test-only dependency pinned in pyproject (``trl==1.16.0``). Its losses live inside the
trainers' ``_compute_loss`` methods, so the tests call those unbound methods on a minimal stand-in
``self`` (the attributes the loss code reads) and a stand-in model that returns given per-token
log-probs: the arithmetic that runs is TRL's, line for line:

- ``DPOTrainer._compute_loss`` (trl/trainer/dpo_trainer.py, 1.16.0: ``sigmoid`` = ``-logsigmoid(beta d)``,
  ``hinge`` = ``relu(1 - beta d)``, ``ipo`` = length-normalised ``(d' - 1/(2 beta))^2``);
- ``GRPOTrainer._compute_loss`` (trl/trainer/grpo_trainer.py, 1.16.0: token-level importance
  ratio, two-sided clip with ``epsilon_low``/``epsilon_high``, k3 KL times beta, aggregation
  ``grpo``/``bnpo``/``dr_grpo``/``dapo``).

TRL 1.16's ``sigmoid`` no longer applies ``label_smoothing``; conservative DPO (label smoothing)
is checked against the formula TRL's sigmoid loss used before 1.0 (Mitchell 2023, Eq. 3), written
out below.
"""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from training_assets.trainers import objectives

# TRL's trainer modules are imported by the tests that call them (~5 s: transformers' processing
# stack), not at collection, which every test worker pays.
trl = pytest.importorskip("trl")

BACKENDS = ["torch", "numba"]


def test_trl_is_the_pinned_version():
    assert trl.__version__ == "1.16.0", "these tests name TRL 1.16.0's formulas; re-check them on upgrade"


class _Accelerator:
    device = torch.device("cpu")
    num_processes = 1
    sync_gradients = True

    @staticmethod
    def gather(x):
        return x

    gather_for_metrics = gather

    @staticmethod
    def reduce(x, reduction="sum"):
        return x


class _TokenLogpsModel:
    """Stands in for the fused-LM-head model: returns the given per-token log-probs (2B, T)."""

    training = True

    def __init__(self, log_probs):
        self.log_probs = log_probs

    def __call__(self, **kwargs):
        zeros = torch.zeros_like(self.log_probs)
        return SimpleNamespace(log_probs=self.log_probs, entropy=zeros, mean_logits=zeros,
                               is_top1=torch.zeros_like(self.log_probs, dtype=torch.bool))


def _trl_dpo(token_logps, completion_mask, ref_chosen, ref_rejected, beta, loss_type):
    """TRL's DPO loss on per-token policy log-probs (2B, T) with completion_mask (2B, T + 1)."""
    model = _TokenLogpsModel(token_logps)
    trainer = SimpleNamespace(
        model=model, accelerator=_Accelerator(), aux_loss_enabled=False, ld_alpha=None, precompute_ref_logps=True,
        f_divergence_type="reverse_kl", loss_types=[loss_type], loss_weights=[1.0], beta=beta,
        label_smoothing=0.0, use_weighting=False, _metrics=defaultdict(lambda: defaultdict(list)),
        _total_train_tokens=0, _tp_size=1,
    )
    inputs = {"input_ids": torch.zeros_like(completion_mask), "attention_mask": torch.ones_like(completion_mask),
              "completion_mask": completion_mask, "ref_chosen_logps": ref_chosen, "ref_rejected_logps": ref_rejected}
    from trl.trainer.dpo_trainer import DPOTrainer

    return DPOTrainer._compute_loss(trainer, model, inputs, return_outputs=False)


def _dpo_case(pairs=4, length=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    completion_mask = (torch.rand(2 * pairs, length + 1, generator=gen) < 0.7).long()
    completion_mask[:, 1] = 1  # at least one completion token per sequence
    token_logps = -3 * torch.rand(2 * pairs, length, generator=gen) * completion_mask[:, 1:]
    ref = -3 * torch.rand(2, pairs, generator=gen) * length * 0.5
    return token_logps, completion_mask, ref[0], ref[1]


@pytest.mark.parametrize("loss_type", ["sigmoid", "hinge", "ipo"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_dpo_matches_trl(loss_type, backend):
    token_logps, completion_mask, ref_chosen, ref_rejected = _dpo_case(seed=len(loss_type))
    pairs = ref_chosen.shape[0]
    beta = 0.2

    trl_leaf = token_logps.clone().requires_grad_()
    trl_loss = _trl_dpo(trl_leaf, completion_mask, ref_chosen, ref_rejected, beta, loss_type)
    trl_loss.backward()

    ours_leaf = token_logps.clone().requires_grad_()
    seq = ours_leaf.sum(1)  # the sequence log-prob TRL forms, (2B,)
    lengths = completion_mask.sum(1).float()  # TRL's IPO normaliser counts the unshifted mask
    ours = objectives.dpo_loss(seq[:pairs], seq[pairs:], ref_chosen, ref_rejected, beta=beta, loss_type=loss_type,
                               chosen_lengths=lengths[:pairs] if loss_type == "ipo" else None,
                               rejected_lengths=lengths[pairs:] if loss_type == "ipo" else None, backend=backend)
    ours.backward()
    torch.testing.assert_close(ours, trl_loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ours_leaf.grad, trl_leaf.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("backend", BACKENDS)
def test_conservative_dpo_matches_trl_pre_1_0_formula(backend):
    pc, pr, rc, rr = (-5 * torch.rand(5, generator=torch.Generator().manual_seed(i)) for i in range(4))
    beta, eps = 0.1, 0.15
    logits = (pc - pr) - (rc - rr)
    expected = (-F.logsigmoid(beta * logits) * (1 - eps) - F.logsigmoid(-beta * logits) * eps).mean()
    ours = objectives.dpo_loss(pc, pr, rc, rr, beta=beta, label_smoothing=eps, backend=backend)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-7)


def _trl_grpo(logps, old_logps, ref_logps, advantages, mask, beta, eps_low, eps_high, loss_type, max_len):
    def per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, **kwargs):
        return logps, torch.zeros_like(logps), None

    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=per_token_logps_and_entropies, aux_loss_enabled=False,
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token", beta=beta,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        loss_type=loss_type, epsilon_low=eps_low, epsilon_high=eps_high, use_vllm=False,
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        max_completion_length=max_len, accelerator=_Accelerator(), _entropy_bonus_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
    )
    b, t = logps.shape
    inputs = {"prompt_ids": torch.zeros(b, 2, dtype=torch.long), "prompt_mask": torch.ones(b, 2, dtype=torch.long),
              "completion_ids": torch.zeros(b, t, dtype=torch.long), "completion_mask": mask,
              "advantages": advantages, "old_per_token_logps": old_logps, "ref_per_token_logps": ref_logps,
              "num_items_in_batch": mask.sum()}
    from trl.trainer.grpo_trainer import GRPOTrainer

    return GRPOTrainer._compute_loss(trainer, None, inputs)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_grpo_matches_trl(loss_type, backend):
    gen = torch.Generator().manual_seed(7)
    b, t = 4, 8
    logps = -2 * torch.rand(b, t, generator=gen)
    old = logps + 0.35 * torch.randn(b, t, generator=gen)
    ref = logps + 0.2 * torch.randn(b, t, generator=gen)
    adv = torch.randn(b, generator=gen)
    mask = (torch.rand(b, t, generator=gen) < 0.8).long()
    mask[2] = 0
    beta, eps_low, eps_high, max_len = 0.04, 0.2, 0.28, 10

    trl_leaf = logps.clone().requires_grad_()
    trl_loss = _trl_grpo(trl_leaf, old, ref, adv, mask, beta, eps_low, eps_high, loss_type, max_len)
    trl_loss.backward()

    ours_leaf = logps.clone().requires_grad_()
    ours = objectives.grpo_surrogate(ours_leaf, old, adv, mask, ref_logps=ref, beta=beta, epsilon_low=eps_low,
                                     epsilon_high=eps_high, loss_type=loss_type, max_completion_length=max_len,
                                     backend=backend)
    ours.backward()
    torch.testing.assert_close(ours, trl_loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ours_leaf.grad, trl_leaf.grad, rtol=1e-5, atol=1e-7)
