"""Training objectives: cross-entropy, sequence log-prob, DPO, GRPO and the k3 KL estimator.

Every function takes ``backend="torch"`` (the default: plain autograd, any dtype/device) or
``backend="numba"`` (CPU, fp32: the fused Numba kernels of ``kernels/losses.py`` wrapped as
autograd Functions in ``training_assets.trainers.numba_ops``). Both backends compute the same
math; ``tests/kernels`` proves it to rtol 1e-5 in fp32, gradients included, and checks DPO and
GRPO against TRL 1.16.0's own loss code.

Shapes: B batch, T tokens, V vocabulary, N = flattened tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from training_assets.trainers.config import DpoLossType, GrpoLossType, KernelBackend, choices

BACKENDS = choices(KernelBackend)
DPO_LOSS_TYPES = choices(DpoLossType)
GRPO_LOSS_TYPES = choices(GrpoLossType)


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
        from training_assets.trainers import numba_ops

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
        from training_assets.trainers import numba_ops

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
        from training_assets.trainers import numba_ops

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
        from training_assets.trainers import numba_ops

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
        from training_assets.trainers import numba_ops

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
