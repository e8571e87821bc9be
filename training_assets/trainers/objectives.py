"""Training objectives: cross-entropy, sequence log-prob, DPO, KTO, ORPO, GRPO and the k3 KL estimator.

Every function takes ``backend="torch"`` (the default: plain autograd, any dtype/device) or
``backend="numba"`` (CPU, fp32: the fused Numba kernels of ``kernels/losses.py`` and
``kernels/preference_losses.py`` wrapped as autograd Functions in
``training_assets.trainers.numba_ops``). Both backends compute the same math; ``tests/kernels``
proves it to rtol 1e-5 in fp32, gradients included, and checks DPO, KTO, ORPO and GRPO against
TRL 1.16.0's own loss code. KTO and ORPO return their parts (rewards, KL, log odds) beside the
mean, as torchtune's losses do, so a trainer can log margins and accuracies.

Shapes: B batch, T tokens, V vocabulary, N = flattened tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from training_assets.trainers.config import DpoLossType, GrpoLossType, KernelBackend, choices

BACKENDS = choices(KernelBackend)
DPO_LOSS_TYPES = choices(DpoLossType)
GRPO_LOSS_TYPES = choices(GrpoLossType)

__all__ = ["BACKENDS", "DPO_LOSS_TYPES", "GRPO_LOSS_TYPES", "ORPO_MAX_MEAN_LOGP", "KtoLoss", "OrpoLoss", "approx_kl",
           "cross_entropy", "dpo_loss", "grpo_surrogate", "grpo_token_weights", "kto_kl_estimate", "kto_loss",
           "orpo_loss", "sequence_logprob"]


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")


def _check_not_empty(name: str, tensor: torch.Tensor) -> None:
    if tensor.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(tensor.shape)}): an objective needs at least one example")


def cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100, backend: str = "torch"
) -> torch.Tensor:
    """Masked next-token cross-entropy, the mean over tokens whose label is not ``ignore_index``.

    ``loss = -1/|M| * sum_{i in M} log softmax(logits_i)[labels_i]``, M = {i : labels_i != ignore_index}.
    logits (N, V), labels (N,) int. All labels ignored gives NaN (0/0), as in PyTorch.
    """
    _check_backend(backend)
    if logits.dim() != 2 or labels.dim() != 1 or logits.shape[0] != labels.shape[0]:
        raise ValueError(
            f"cross_entropy wants logits (N, V) and labels (N,); got {tuple(logits.shape)} and "
            f"{tuple(labels.shape)} (flatten (B, T, V) with .reshape(-1, V))"
        )
    _check_not_empty("logits", logits)
    if backend == "numba":
        from training_assets.trainers import numba_ops  # Numba: ~1.3 s to import, only backend="numba" pays

        return numba_ops.cross_entropy(logits, labels, ignore_index)
    return F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="mean")


def sequence_logprob(
    logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, backend: str = "torch"
) -> torch.Tensor:
    """Sum of token log-probs under the mask, one value per sequence: the log-likelihood DPO uses.

    ``logp_b = sum_t mask_bt * log softmax(logits_bt)[labels_bt]``. logits (B, T, V); labels (B, T)
    already aligned with the logits (``labels[:, t]`` is the token logits[:, t] predicts, i.e.
    shifted); mask (B, T) 0/1 (or weights). Masked positions may hold any label (e.g. -100).
    Returns (B,).
    """
    _check_backend(backend)
    if logits.dim() != 3 or labels.shape != logits.shape[:2] or mask.shape != labels.shape:
        raise ValueError(
            f"sequence_logprob wants logits (B, T, V), labels (B, T), mask (B, T); got "
            f"{tuple(logits.shape)}, {tuple(labels.shape)}, {tuple(mask.shape)}"
        )
    _check_not_empty("logits", logits)
    if backend == "numba":
        from training_assets.trainers import numba_ops  # Numba: ~1.3 s to import, only backend="numba" pays

        return numba_ops.sequence_logprob(logits, labels, mask)
    keep = mask != 0
    safe_labels = torch.where(keep, labels, torch.zeros_like(labels))  # -100 would index out of range
    token_logps = torch.log_softmax(logits, dim=-1).gather(-1, safe_labels.unsqueeze(-1)).squeeze(-1)  # (B, T)
    # where() rather than a product: a masked -inf log-prob times 0 would be NaN
    return torch.where(keep, token_logps * mask.to(token_logps.dtype), torch.zeros_like(token_logps)).sum(-1)


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    loss_type: str = "sigmoid",
    chosen_lengths: torch.Tensor | None = None,
    rejected_lengths: torch.Tensor | None = None,
    backend: str = "torch",
) -> torch.Tensor:
    """Direct preference loss over (B,) sequence log-probs, mean over pairs.

    With the implicit reward margin ``d = (pi_c - ref_c) - (pi_r - ref_r)``:

    - ``sigmoid``: DPO, Rafailov et al. 2023 (arXiv:2305.18290), Bradley-Terry
      ``-log sigma(beta d)``; with ``label_smoothing = e`` it is conservative DPO (cDPO, Mitchell
      2023): ``-(1-e) log sigma(beta d) - e log sigma(-beta d)``.
    - ``ipo``: Azar et al. 2023 (arXiv:2310.12036) Eq. 17, ``(d' - 1/(2 beta))^2`` where d' is
      the margin of length-averaged log-ratios when ``chosen_lengths``/``rejected_lengths`` (token
      counts) are given, as TRL 1.16 does, else the plain margin d.
    - ``hinge``: SLiC (Zhao et al. 2023, arXiv:2305.10425), ``relu(1 - beta d)``.
    """
    _check_backend(backend)
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"dpo loss_type={loss_type!r} is not one of {DPO_LOSS_TYPES}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing={label_smoothing} must lie in [0, 0.5) (cDPO flip probability)")
    if beta <= 0:
        raise ValueError(f"beta={beta} must be > 0")
    shape = policy_chosen_logps.shape
    for name, t in (
        ("policy_rejected_logps", policy_rejected_logps),
        ("ref_chosen_logps", ref_chosen_logps),
        ("ref_rejected_logps", ref_rejected_logps),
    ):
        if t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, policy_chosen_logps has {tuple(shape)}")
    if policy_chosen_logps.dim() != 1:
        raise ValueError(f"dpo_loss wants (B,) sequence log-probs; got shape {tuple(shape)}")
    _check_not_empty("policy_chosen_logps", policy_chosen_logps)
    if (chosen_lengths is None) != (rejected_lengths is None):
        raise ValueError("give both chosen_lengths and rejected_lengths, or neither")
    if backend == "numba":
        from training_assets.trainers import numba_ops  # Numba: ~1.3 s to import, only backend="numba" pays

        return numba_ops.dpo_loss(
            policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
            beta, label_smoothing, loss_type, chosen_lengths, rejected_lengths,
        )
    chosen_logratios = policy_chosen_logps - ref_chosen_logps
    rejected_logratios = policy_rejected_logps - ref_rejected_logps
    if loss_type == "ipo":
        if chosen_lengths is not None:
            chosen_logratios = chosen_logratios / chosen_lengths.to(chosen_logratios.dtype).clamp(min=1.0)
            rejected_logratios = rejected_logratios / rejected_lengths.to(rejected_logratios.dtype).clamp(min=1.0)
        losses = (chosen_logratios - rejected_logratios - 1 / (2 * beta)) ** 2
    else:
        logits = beta * (chosen_logratios - rejected_logratios)
        if loss_type == "sigmoid":
            losses = -(1 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)
        else:
            losses = torch.relu(1 - logits)
    return losses.mean()


class KtoLoss(NamedTuple):
    """KTO's mean loss and the parts TRL logs; every part is detached."""

    loss: torch.Tensor  # scalar, differentiable
    chosen_rewards: torch.Tensor  # (n_desirable,) beta * (logp - ref_logp) of the desirable examples
    rejected_rewards: torch.Tensor  # (n_undesirable,) the same for the undesirable ones
    kl: torch.Tensor  # scalar: the reference point z0 the loss used (the estimate clamped at 0)


def kto_kl_estimate(policy_kl_logps: torch.Tensor, ref_kl_logps: torch.Tensor) -> torch.Tensor:
    """KTO's KL estimate: the batch mean of ``log pi(y'|x) - log ref(y'|x)`` over mismatched pairs.

    (x, y') pairs each prompt with another example's completion (TRL cycles the batch's
    completions by one), so the estimate carries no signal about the example's own label. Scalar,
    detached, not yet clamped: under data parallelism average it across ranks first (TRL gathers
    the per-rank means, then clamps); :func:`kto_loss` clamps it at 0.
    """
    if policy_kl_logps.shape != ref_kl_logps.shape or policy_kl_logps.dim() != 1:
        raise ValueError(f"kto_kl_estimate wants two (B,) sequence log-probs; got {tuple(policy_kl_logps.shape)} "
                         f"and {tuple(ref_kl_logps.shape)}")
    _check_not_empty("policy_kl_logps", policy_kl_logps)
    return (policy_kl_logps - ref_kl_logps).mean().detach()


def _check_kto_inputs(policy_logps, ref_logps, desirable, kl_estimate, beta, desirable_weight,
                      undesirable_weight) -> None:
    if policy_logps.dim() != 1 or ref_logps.shape != policy_logps.shape or desirable.shape != policy_logps.shape:
        raise ValueError(
            f"kto_loss wants policy_logps, ref_logps and desirable of one shape (B,); got "
            f"{tuple(policy_logps.shape)}, {tuple(ref_logps.shape)}, {tuple(desirable.shape)}"
        )
    if desirable.dtype != torch.bool:
        raise ValueError(f"desirable is {desirable.dtype}; it must be a bool tensor (True = desirable): pass "
                         "labels.bool()")
    _check_not_empty("policy_logps", policy_logps)
    if torch.as_tensor(kl_estimate).numel() != 1:
        raise ValueError(f"kl_estimate must be one number (the batch's z0, see kto_kl_estimate); got shape "
                         f"{tuple(torch.as_tensor(kl_estimate).shape)}")
    if beta <= 0:
        raise ValueError(f"beta={beta} must be > 0")
    if desirable_weight < 0 or undesirable_weight < 0:
        raise ValueError(f"desirable_weight={desirable_weight} and undesirable_weight={undesirable_weight} must be "
                         ">= 0")


def kto_loss(
    policy_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    desirable: torch.Tensor,
    kl_estimate: torch.Tensor | float,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
    backend: str = "torch",
) -> KtoLoss:
    """Kahneman-Tversky Optimisation over unpaired examples, mean over the B examples.

    Ethayarajh et al. 2024 (arXiv:2402.01306), Eq. 7, as TRL 1.16's ``KTOTrainer`` computes it:
    with ``r = policy_logp - ref_logp`` (sequence log-probs, (B,)) and the reference point
    ``z0 = max(kl_estimate, 0)`` (detached: a constant of the step, see :func:`kto_kl_estimate`),

    - desirable (``desirable[b]`` True): ``w_D * (1 - sigma(beta (r - z0)))``,
    - undesirable: ``w_U * (1 - sigma(beta (z0 - r)))``.

    The weights ``w_D``/``w_U`` rebalance unequal counts (the paper keeps
    ``w_D n_D / (w_U n_U)`` in [1, 4/3]); the mean divides by B, not by the weights. Rewards are
    ``beta * r``. Gradients flow to policy_logps (and ref_logps, negated, if it requires them).
    """
    _check_backend(backend)
    _check_kto_inputs(policy_logps, ref_logps, desirable, kl_estimate, beta, desirable_weight, undesirable_weight)
    logratios = policy_logps - ref_logps
    z0 = torch.as_tensor(kl_estimate, dtype=logratios.dtype, device=logratios.device).detach().reshape(())
    z0 = z0.clamp(min=0)  # as TRL: a negative batch estimate is noise, the KL itself is >= 0
    rewards = beta * logratios.detach()
    parts = dict(chosen_rewards=rewards[desirable], rejected_rewards=rewards[~desirable], kl=z0)
    if backend == "numba":
        from training_assets.trainers import numba_ops  # Numba: ~1.3 s to import, only backend="numba" pays

        loss = numba_ops.kto_loss(policy_logps, ref_logps, desirable, z0, beta, desirable_weight, undesirable_weight)
        return KtoLoss(loss, **parts)
    margin = torch.where(desirable, logratios - z0, z0 - logratios)
    weights = torch.where(desirable, desirable_weight, undesirable_weight).to(logratios.dtype)
    return KtoLoss((weights * (1 - torch.sigmoid(beta * margin))).mean(), **parts)


class OrpoLoss(NamedTuple):
    """ORPO's loss ``nll + odds_ratio_loss`` and the parts TRL logs; every part is detached."""

    loss: torch.Tensor  # scalar, differentiable
    nll: torch.Tensor  # scalar: the chosen NLL as given
    odds_ratio_loss: torch.Tensor  # scalar: -beta * mean log sigma(log_odds)
    chosen_rewards: torch.Tensor  # (B,) beta * mean log-prob of the chosen responses
    rejected_rewards: torch.Tensor  # (B,) the same for the rejected ones
    log_odds: torch.Tensor  # (B,) log(odds(chosen) / odds(rejected))


ORPO_MAX_MEAN_LOGP = -1e-6  # ceiling on ORPO's mean log-probs: p = 1 would have infinite odds


def _cap_mean_logps(logps: torch.Tensor) -> torch.Tensor:
    """Mean log-probs capped at ``ORPO_MAX_MEAN_LOGP``, the gradient passed straight through.

    A mean log-prob of exactly 0 (every token certain; fp32 log-softmax rounds to 0 once the
    other logits are ~17 below the top one) has infinite odds: TRL returns an infinite loss or a
    NaN gradient there. Values above the cap are fp32 rounding noise, so capping them changes no
    real signal, and the straight-through gradient still pushes down a rejected response the
    model is certain of.
    """
    return logps - (logps - ORPO_MAX_MEAN_LOGP).clamp(min=0).detach()


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x <= 0 without cancellation (Maechler 2012), TRL 1.16's ``log1mexp``."""
    return torch.where(x < -0.6931471805599453, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def orpo_loss(
    chosen_logps_mean: torch.Tensor,
    rejected_logps_mean: torch.Tensor,
    chosen_nll: torch.Tensor,
    beta: float = 0.1,
    backend: str = "torch",
) -> OrpoLoss:
    """Odds Ratio Preference Optimisation: SFT on the chosen plus an odds-ratio penalty, no reference model.

    Hong et al. 2024 (arXiv:2403.07691), Eqs. 4-7, as TRL 1.16's ``ORPOTrainer`` computes it.
    On length-normalised log-probs c, r (B,) (the mean token log-prob of each response:
    ``sequence_logprob(...) / mask.sum(-1)``), with odds(p) = p / (1 - p) and p = exp(c):
    ``log_odds = log(odds(c) / odds(r)) = (c - r) - (log(1 - e^c) - log(1 - e^r))``, the
    log1mexp terms computed stably; ``loss = chosen_nll - beta * mean_b log sigma(log_odds_b)``.
    ``beta`` is the paper's lambda. ``chosen_nll`` is the scalar cross-entropy of the chosen
    sequences (TRL: over prompt and response), passed through with its own gradient. Log-probs are
    upcast to fp32 first, as TRL does; rewards are ``beta * c`` and ``beta * r``. The one departure
    from TRL: log-probs above ``ORPO_MAX_MEAN_LOGP`` (-1e-6) are capped there for the odds (see
    :func:`_cap_mean_logps`), where TRL gives an infinite loss or a NaN gradient at exactly 0.
    """
    _check_backend(backend)
    if chosen_logps_mean.dim() != 1 or rejected_logps_mean.shape != chosen_logps_mean.shape:
        raise ValueError(f"orpo_loss wants chosen_logps_mean and rejected_logps_mean of one shape (B,); got "
                         f"{tuple(chosen_logps_mean.shape)} and {tuple(rejected_logps_mean.shape)}")
    _check_not_empty("chosen_logps_mean", chosen_logps_mean)
    if chosen_nll.numel() != 1:
        raise ValueError(f"chosen_nll must be the scalar cross-entropy of the chosen sequences; got shape "
                         f"{tuple(chosen_nll.shape)}")
    if beta <= 0:
        raise ValueError(f"beta={beta} must be > 0")
    chosen, rejected = chosen_logps_mean.float(), rejected_logps_mean.float()
    for name, logps in (("chosen_logps_mean", chosen), ("rejected_logps_mean", rejected)):
        if bool((logps > 0).any()):  # log1mexp is NaN there: the caller passed NLLs or logits, not log-probs
            raise ValueError(f"{name} has values > 0; it must be mean token log-probs (<= 0), not NLLs")
    nll = chosen_nll.reshape(())
    capped_chosen, capped_rejected = _cap_mean_logps(chosen), _cap_mean_logps(rejected)
    if backend == "numba":
        from training_assets.trainers import numba_ops  # Numba: ~1.3 s to import, only backend="numba" pays

        odds_ratio_loss, log_odds = numba_ops.orpo_odds_ratio(capped_chosen, capped_rejected, beta)
    else:
        log_odds = (capped_chosen - capped_rejected) - (_log1mexp(capped_chosen) - _log1mexp(capped_rejected))
        odds_ratio_loss = -(beta * F.logsigmoid(log_odds)).mean()
    return OrpoLoss(nll + odds_ratio_loss, nll.detach(), odds_ratio_loss.detach(), beta * chosen.detach(),
                    beta * rejected.detach(), log_odds.detach())


def approx_kl(
    logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor | None = None, backend: str = "torch"
) -> torch.Tensor:
    """Per-token KL(pi || ref) by Schulman's k3 estimator (http://joschu.net/blog/kl-approx.html).

    ``k3 = exp(ref - logp) - (ref - logp) - 1`` >= 0, unbiased for KL under samples of pi and of
    low variance. Any shape; with a mask, masked positions are 0. Returns the same shape.
    """
    _check_backend(backend)
    if ref_logps.shape != logps.shape or (mask is not None and mask.shape != logps.shape):
        raise ValueError(
            f"approx_kl wants equal shapes; got logps {tuple(logps.shape)}, ref_logps "
            f"{tuple(ref_logps.shape)}, mask {None if mask is None else tuple(mask.shape)}"
        )
    _check_not_empty("logps", logps)
    if backend == "numba":
        from training_assets.trainers import numba_ops  # Numba: ~1.3 s to import, only backend="numba" pays

        return numba_ops.approx_kl(logps, ref_logps, mask)
    delta = ref_logps - logps
    kl = torch.exp(delta) - delta - 1
    if mask is None:
        return kl
    return torch.where(mask != 0, kl * mask.to(kl.dtype), torch.zeros_like(kl))


def grpo_token_weights(
    mask: torch.Tensor,
    loss_type: str = "dapo",
    branch_start: torch.Tensor | None = None,
    max_completion_length: int | None = None,
    num_items_in_batch: float | None = None,
) -> torch.Tensor:
    """The (B, T) weights w with ``loss = sum_bt w_bt * per_token_loss_bt`` for each aggregation.

    - ``grpo``: per-sequence mean, then mean over sequences (Shao et al. 2024, arXiv:2402.03300):
      ``w = mask / (B * max(1, |o_b|))``.
    - ``bnpo``: token sum over the batch's token count: ``w = mask / max(1, sum mask)``.
    - ``dr_grpo``: Dr. GRPO (Liu et al. 2025, arXiv:2503.20783), a constant normaliser:
      ``w = mask / (B * max_completion_length)`` (default T).
    - ``dapo``: DAPO (Yu et al. 2025, arXiv:2503.14476) token-level: ``w = mask / max(1, N_active)``
      with N_active = ``num_items_in_batch`` (the active tokens of the whole accumulated batch, as
      TRL passes it) or, by default, this batch's ``sum mask``.
    - ``la_grpo``: Local-Advantage GRPO (Franceschetti 2025, multi-turn negotiation): the rollouts
      of a group share the dialogue up to turn h and branch there, so only tokens from
      ``branch_start[b]`` on carry the (local) advantage; grpo aggregation over that token mask.
    """
    if loss_type not in GRPO_LOSS_TYPES:
        raise ValueError(f"grpo loss_type={loss_type!r} is not one of {GRPO_LOSS_TYPES}")
    batch, length = mask.shape
    weights = mask.to(torch.float32) if not mask.is_floating_point() else mask
    if loss_type == "la_grpo":
        if branch_start is None:
            raise ValueError("loss_type='la_grpo' needs branch_start (B,): the first token index of the branched turn")
        positions = torch.arange(length, device=mask.device).unsqueeze(0)  # (1, T)
        start = torch.as_tensor(branch_start, device=mask.device).reshape(-1, 1)  # (B, 1) or (1, 1)
        if start.shape[0] not in (1, batch):
            raise ValueError(f"branch_start has {start.shape[0]} entries for a batch of {batch}")
        weights = weights * (positions >= start).to(weights.dtype)
    elif branch_start is not None:
        raise ValueError(f"branch_start is only used by loss_type='la_grpo', not {loss_type!r}")
    if loss_type in ("grpo", "la_grpo"):
        return weights / (weights.sum(-1, keepdim=True).clamp(min=1.0) * batch)
    if loss_type == "bnpo":
        return weights / weights.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return weights / (batch * (max_completion_length or length))
    total = weights.sum() if num_items_in_batch is None else torch.as_tensor(float(num_items_in_batch))
    return weights / total.clamp(min=1.0)


def grpo_surrogate(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logps: torch.Tensor | None = None,
    beta: float = 0.0,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    loss_type: str = "dapo",
    branch_start: torch.Tensor | None = None,
    max_completion_length: int | None = None,
    num_items_in_batch: float | None = None,
    backend: str = "torch",
) -> torch.Tensor:
    """GRPO clipped surrogate with clip-higher and a k3 KL penalty, aggregated per ``loss_type``.

    Per token (PPO, Schulman et al. 2017; GRPO, Shao et al. 2024; clip-higher from DAPO):
    ``r = exp(logp - old_logp)``,
    ``l = -min(r A_b, clip(r, 1 - epsilon_low, 1 + epsilon_high) A_b) + beta * k3(logp, ref_logp)``,
    then ``loss = sum_bt w_bt l_bt`` with w from :func:`grpo_token_weights`. logps, old_logps,
    mask, ref_logps (B, T); advantages (B,). Gradients flow to ``logps``; old_logps, advantages and
    ref_logps are constants of the step (TRL detaches them too).
    """
    _check_backend(backend)
    if logps.dim() != 2 or old_logps.shape != logps.shape or mask.shape != logps.shape:
        raise ValueError(
            f"grpo_surrogate wants logps, old_logps, mask of one shape (B, T); got {tuple(logps.shape)}, "
            f"{tuple(old_logps.shape)}, {tuple(mask.shape)}"
        )
    if advantages.shape != logps.shape[:1]:
        raise ValueError(f"advantages must be (B,) = ({logps.shape[0]},); got {tuple(advantages.shape)}")
    _check_not_empty("logps", logps)
    if beta != 0.0 and ref_logps is None:
        raise ValueError(f"beta={beta} adds a KL penalty, which needs ref_logps (B, T)")
    if ref_logps is not None and ref_logps.shape != logps.shape:
        raise ValueError(f"ref_logps has shape {tuple(ref_logps.shape)}, logps has {tuple(logps.shape)}")
    weights = grpo_token_weights(mask, loss_type, branch_start, max_completion_length, num_items_in_batch)
    if backend == "numba":
        from training_assets.trainers import numba_ops  # Numba: ~1.3 s to import, only backend="numba" pays

        return numba_ops.grpo_surrogate(logps, old_logps, advantages, weights, ref_logps, beta, epsilon_low,
                                        epsilon_high)
    ratio = torch.exp(logps - old_logps.detach())
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    adv = advantages.detach().unsqueeze(1)  # (B, 1)
    per_token = -torch.min(ratio * adv, clipped * adv)
    if beta != 0.0:
        per_token = per_token + beta * approx_kl(logps, ref_logps.detach())
    # where() keeps garbage (inf/NaN) at padded positions out of the sum
    return torch.where(weights != 0, per_token * weights, torch.zeros_like(per_token)).sum()
