"""The Numba kernels (``kernels/losses.py``) as torch autograd Functions, and the Numba
optimizers (``numba_optim``, re-exported here): the ``backend="numba"`` of
``training_assets.trainers.objectives``.

Wiring for a trainer with ``TrainConfig(kernel_backend="torch" | "numba")`` is two calls, both
taking the backend string as it is::

    from training_assets.trainers import numba_ops, objectives

    loss = objectives.cross_entropy(logits.reshape(-1, V), labels.reshape(-1),
                                    backend=cfg.kernel_backend)          # or dpo_loss, grpo_surrogate, ...
    optimizer = numba_ops.make_optimizer("adamw", model.parameters(), backend=cfg.kernel_backend,
                                         lr=cfg.lr, weight_decay=cfg.weight_decay)

``make_optimizer(..., backend="torch")`` returns the plain ``torch.optim`` optimizer, so the torch
default needs no branch in the trainer.

Constraints of the numba backend (each violated one raises a ValueError that says so): CPU
tensors, fp32 logits/log-probs. Cross-entropy computes its gradient during the forward (one pass
over the logits) and hands it over once: a second backward through the same graph
(``retain_graph=True``) raises instead of returning a stale gradient. Sequence log-prob keeps
the row log-sum-exps and recomputes the softmax in a fused backward (no such limit).
Non-contiguous logits are copied once to a contiguous buffer. Threads: Numba's pool
(``numba.set_num_threads``).
"""

from __future__ import annotations

import math
import sys
import threading

import numpy as np
import torch

from training_assets.trainers.numba_optim import OPTIMIZERS, NumbaAdamW, NumbaSGD, make_optimizer
from training_assets_kernels import losses as K
from training_assets_kernels import preference_losses as KP

__all__ = ["OPTIMIZERS", "NumbaAdamW", "NumbaSGD", "make_optimizer", "cross_entropy", "sequence_logprob",
           "dpo_loss", "kto_loss", "orpo_odds_ratio", "grpo_surrogate", "approx_kl", "WORKSPACE",
           "GradientWorkspace"]

_CONSUMED = (
    "the fused numba gradient was already handed to the first backward; a second backward "
    "(retain_graph=True) needs backend='torch'"
)


class GradientWorkspace:
    """Reusable fp32 gradient buffers for the logits-sized gradients.

    torch's CPU allocator returns big blocks to the OS, so a fresh (N, V) gradient each step pays
    a page fault (and the kernel zeroing the page) per 4 KiB of 4 N V bytes. Measured on the
    fused cross-entropy kernel at 4096 x 32768 (2 threads): 0.29 s into a fresh ``torch.empty``
    buffer, 0.15 s into a fresh ``np.empty`` one (NumPy asks for transparent huge pages), 0.084 s
    into a reused one. A buffer here is a NumPy array handed to torch with ``torch.from_numpy``;
    the tensor's storage holds a reference to the array until the last tensor viewing it is
    freed, so an array whose refcount is back to ours alone is provably unused and is reused.
    At most ``capacity`` buffers stay resident, whatever shapes come by (a free buffer of another
    shape is replaced); ``clear()`` drops them.
    """

    def __init__(self, capacity: int = 2):
        self.capacity = capacity
        self._buffers: list[np.ndarray] = []
        self._lock = threading.Lock()

    def _free_indices(self) -> list[int]:
        # free = referenced only by the pool's list entry (plus getrefcount's own argument)
        return [i for i in range(len(self._buffers)) if sys.getrefcount(self._buffers[i]) == 2]

    def take(self, shape: tuple[int, ...]) -> torch.Tensor:
        shape = tuple(int(d) for d in shape)
        with self._lock:
            free = self._free_indices()
            for i in free:
                if self._buffers[i].shape == shape:
                    return torch.from_numpy(self._buffers[i])
            array = np.empty(shape, np.float32)
            if len(self._buffers) < self.capacity:
                self._buffers.append(array)
            elif free:
                self._buffers[free[0]] = array  # evict a free buffer of another shape
            return torch.from_numpy(array)

    def clear(self) -> None:
        with self._lock:
            self._buffers.clear()


WORKSPACE = GradientWorkspace()


def _f32(name: str, tensor: torch.Tensor) -> np.ndarray:
    """A zero-copy fp32 NumPy view of a CPU tensor (a contiguous copy when it is strided)."""
    if tensor.device.type != "cpu":
        raise ValueError(f"{name} is on {tensor.device}; the numba backend runs on CPU: use backend='torch' there")
    if tensor.dtype != torch.float32:
        raise ValueError(f"{name} is {tensor.dtype}; the numba backend is fp32: pass {name}.float() or use "
                         "backend='torch'")
    return tensor.detach().contiguous().numpy()


def _weights(name: str, mask: torch.Tensor | None, like: torch.Tensor) -> np.ndarray:
    if mask is None:
        return np.ones(like.numel(), np.float32)
    if mask.device.type != "cpu":
        raise ValueError(f"{name} is on {mask.device}; the numba backend runs on CPU")
    return mask.detach().to(torch.float32).contiguous().reshape(-1).numpy()


def _labels(labels: torch.Tensor, counted: np.ndarray, vocab: int, what: str) -> np.ndarray:
    """int64 labels; every counted label must index the vocabulary (checked up front, not in the kernel)."""
    y = labels.detach().to(torch.int64).contiguous().reshape(-1).numpy()
    bad = counted & ((y < 0) | (y >= vocab))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{what}: label {int(y[i])} at flat position {i} is outside the vocabulary [0, {vocab})")
    return y


class CrossEntropyFn(torch.autograd.Function):
    """Mean cross-entropy over counted rows; the gradient comes from the fused forward."""

    @staticmethod
    def forward(ctx, logits, labels, ignore_index):
        x = _f32("logits", logits)
        y = _labels(labels, labels.detach().cpu().numpy() != ignore_index, x.shape[1], "cross_entropy")
        n_valid = int(np.count_nonzero(y != ignore_index))
        scale = 1.0 / n_valid if n_valid else math.nan  # all ignored: NaN loss, zero gradient (as torch)
        if ctx.needs_input_grad[0]:
            dlogits = WORKSPACE.take(x.shape)
            row_losses = K.cross_entropy_fwd_bwd(x, y, ignore_index, scale, dlogits.numpy())
            ctx.dlogits = dlogits
        else:
            row_losses = K.cross_entropy_fwd(x, y, ignore_index)
        return torch.tensor(row_losses.sum() * scale, dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad_loss):
        dlogits = ctx.dlogits
        if dlogits is None:
            raise RuntimeError(_CONSUMED)
        ctx.dlogits = None
        g = float(grad_loss)
        if g != 1.0:  # loss.backward() passes 1: no extra pass over the gradient
            dlogits.mul_(g)
        return dlogits, None, None


class SequenceLogprobFn(torch.autograd.Function):
    """(B,) sums of masked token log-probs. The forward keeps only the row log-sum-exps; the
    backward recomputes the softmax in one fused pass that also applies the upstream gradient."""

    @staticmethod
    def forward(ctx, logits, labels, mask):
        b, t, v = logits.shape
        x = _f32("logits", logits).reshape(b * t, v)
        w = _weights("mask", mask, labels)
        y = _labels(labels, w != 0, v, "sequence_logprob")
        token_logps, lse = K.token_logprob_fwd(x, y, w)
        if ctx.needs_input_grad[0]:
            ctx.row_state = (x, y, w, lse)  # x views the logits, which autograd keeps for us below
            ctx.save_for_backward(logits)
        return torch.from_numpy(token_logps.reshape(b, t).sum(1).astype(np.float32))

    @staticmethod
    def backward(ctx, grad_seq):
        (logits,) = ctx.saved_tensors  # raises if the logits were modified in place after forward
        x, y, w, lse = ctx.row_state
        b, t, v = logits.shape
        row_grad = np.repeat(grad_seq.detach().to(torch.float32).contiguous().numpy(), t)
        dlogits = WORKSPACE.take((b, t, v))
        K.token_logprob_bwd(x, y, w, lse, row_grad, dlogits.numpy().reshape(b * t, v))
        return dlogits, None, None


class DPOLossFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta, label_smoothing, loss_code,
                chosen_len, rejected_len):
        loss, d_chosen, d_rejected = K.dpo_fwd_bwd(
            _f32("policy_chosen_logps", policy_chosen), _f32("policy_rejected_logps", policy_rejected),
            _f32("ref_chosen_logps", ref_chosen), _f32("ref_rejected_logps", ref_rejected),
            chosen_len, rejected_len, float(beta), float(label_smoothing), loss_code,
        )
        ctx.save_for_backward(torch.from_numpy(d_chosen.astype(np.float32)),
                              torch.from_numpy(d_rejected.astype(np.float32)))
        return torch.tensor(loss, dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad_loss):
        d_chosen, d_rejected = (d * grad_loss for d in ctx.saved_tensors)
        return d_chosen, d_rejected, -d_chosen, -d_rejected, None, None, None, None, None


class KTOLossFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, policy_logps, ref_logps, desirable, kl, beta, desirable_weight, undesirable_weight):
        loss, d_policy = KP.kto_fwd_bwd(
            _f32("policy_logps", policy_logps), _f32("ref_logps", ref_logps), desirable.detach().cpu().numpy(),
            float(kl), float(beta), float(desirable_weight), float(undesirable_weight),
        )
        ctx.save_for_backward(torch.from_numpy(d_policy.astype(np.float32)))
        return torch.tensor(loss, dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad_loss):
        (d_policy,) = ctx.saved_tensors
        d_policy = d_policy * grad_loss
        return d_policy, -d_policy, None, None, None, None, None


class OddsRatioFn(torch.autograd.Function):
    """ORPO's odds-ratio term and the per-pair log odds ratio z (B,), which is reported, not differentiated."""

    @staticmethod
    def forward(ctx, chosen_logps_mean, rejected_logps_mean, beta):
        loss, log_odds, d_chosen, d_rejected = KP.orpo_odds_ratio_fwd_bwd(
            _f32("chosen_logps_mean", chosen_logps_mean), _f32("rejected_logps_mean", rejected_logps_mean),
            float(beta),
        )
        ctx.save_for_backward(torch.from_numpy(d_chosen.astype(np.float32)),
                              torch.from_numpy(d_rejected.astype(np.float32)))
        log_odds = torch.from_numpy(log_odds.astype(np.float32))
        ctx.mark_non_differentiable(log_odds)
        return torch.tensor(loss, dtype=torch.float32), log_odds

    @staticmethod
    def backward(ctx, grad_loss, grad_log_odds):
        d_chosen, d_rejected = (d * grad_loss for d in ctx.saved_tensors)
        return d_chosen, d_rejected, None


class GRPOSurrogateFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logps, old_logps, advantages, weights, ref_logps, beta, epsilon_low, epsilon_high):
        lp = _f32("logps", logps)
        # old_logps, advantages, ref_logps and weights are constants of the step: cast, not checked
        ref = _f32("ref_logps", ref_logps.float()) if ref_logps is not None else lp  # unread when beta == 0
        loss, dlogps = K.grpo_fwd_bwd(
            lp, _f32("old_logps", old_logps.float()), _f32("advantages", advantages.float()),
            _f32("weights", weights.float()), ref, float(beta), float(epsilon_low), float(epsilon_high),
        )
        ctx.save_for_backward(torch.from_numpy(dlogps))
        return torch.tensor(loss, dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad_loss):
        (dlogps,) = ctx.saved_tensors
        return dlogps * grad_loss, None, None, None, None, None, None, None


class ApproxKLFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logps, ref_logps, mask):
        w = _weights("mask", mask, logps)
        kl = K.approx_kl_fwd(_f32("logps", logps).reshape(-1), _f32("ref_logps", ref_logps).reshape(-1), w)
        ctx.save_for_backward(logps, ref_logps)  # inputs: autograd's version check guards them
        ctx.weights = w
        return torch.from_numpy(kl).reshape(logps.shape)

    @staticmethod
    def backward(ctx, grad_kl):
        logps, ref_logps = ctx.saved_tensors
        g = grad_kl.detach().to(torch.float32).contiguous().reshape(-1).numpy()
        d_logps, d_ref = K.approx_kl_bwd(_f32("logps", logps).reshape(-1), _f32("ref_logps", ref_logps).reshape(-1),
                                         ctx.weights, g)
        return torch.from_numpy(d_logps).reshape(logps.shape), torch.from_numpy(d_ref).reshape(logps.shape), None


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    return CrossEntropyFn.apply(logits, labels, ignore_index)


def sequence_logprob(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return SequenceLogprobFn.apply(logits, labels, mask)


def dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta,
             label_smoothing, loss_type, chosen_lengths=None, rejected_lengths=None) -> torch.Tensor:
    b = policy_chosen_logps.shape[0]
    if chosen_lengths is None or loss_type != "ipo":
        chosen_len = rejected_len = np.ones(b, np.float64)
    else:
        chosen_len = chosen_lengths.detach().to(torch.float64).cpu().numpy()
        rejected_len = rejected_lengths.detach().to(torch.float64).cpu().numpy()
    return DPOLossFn.apply(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
                           beta, label_smoothing, K.DPO_CODES[loss_type], chosen_len, rejected_len)


def kto_loss(policy_logps, ref_logps, desirable, kl, beta, desirable_weight, undesirable_weight) -> torch.Tensor:
    """Numba KTO mean loss; ``kl`` is the reference point z0, already clamped (a constant of the step)."""
    return KTOLossFn.apply(policy_logps, ref_logps, desirable, kl, beta, desirable_weight, undesirable_weight)


def orpo_odds_ratio(chosen_logps_mean, rejected_logps_mean, beta) -> tuple[torch.Tensor, torch.Tensor]:
    """Numba ORPO odds-ratio term ``-beta mean log s(z)`` and the detached log odds ratios z (B,)."""
    return OddsRatioFn.apply(chosen_logps_mean, rejected_logps_mean, beta)


def grpo_surrogate(logps, old_logps, advantages, weights, ref_logps, beta, epsilon_low, epsilon_high):
    """Numba GRPO surrogate over precomputed aggregation weights (see ``objectives.grpo_token_weights``)."""
    return GRPOSurrogateFn.apply(logps, old_logps, advantages, weights.to(torch.float32),
                                 ref_logps if beta != 0.0 else None, beta, epsilon_low, epsilon_high)


def approx_kl(logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    return ApproxKLFn.apply(logps, ref_logps, mask)
