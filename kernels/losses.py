"""Numba kernels for the training losses: softmax, fused cross-entropy, sequence log-prob, DPO,
GRPO surrogate and k3 KL, each forward+backward in one call.

Arrays are NumPy, fp32 for tensors of logits/log-probs (the torch wrappers in
``training_assets.trainers.numba_ops`` hand in zero-copy views). Rows of logits are independent,
so every large kernel is a ``prange`` over rows; each row's reductions run inside one thread and
cross-row sums are taken sequentially afterwards, so results do not depend on the thread count.

Why it is faster than the torch composition on CPU (see ``benchmarks/kernel_speed.py``):

- cross-entropy is one read of the logits and one write of the gradient: the forward stores
  ``exp(x - max)`` in the gradient buffer and rescales it in place while the row is still in L2,
  so no log-prob tensor, no zero-filled one-hot tensor and no second ``exp`` pass exist;
- sequence log-prob reads the logits once in the forward (keeping one log-sum-exp per row) and
  once in the backward, which writes the gradient already scaled by the upstream gradient;
- ``exp`` is a Cephes-style polynomial (``_exp32``, relative error < 1e-6 on [-80, 80], tested)
  that LLVM vectorises to AVX-512; numba without Intel SVML would call scalar ``expf`` per element;
- row max uses ``llvm.maxnum`` (vectorisable without fast-math), and only the sum of
  exponentials is compiled with ``reassoc`` (a reordered fp32 sum; the tests hold it to rtol 1e-5
  against torch). Nothing is compiled with ``nnan``/``ninf``, so ``-inf`` logits stay exact.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir  # numba's own code generator: used to declare two LLVM intrinsics
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .threads import launch

launch()  # Numba's pool, started with OpenMP nesting off (kernels/threads.py)

LOG2E = np.float32(1.4426950408889634)
LN2_HI = np.float32(0.693359375)  # ln 2 split in two (Cody-Waite): n * LN2_HI is exact for |n| < 2^15
LN2_LO = np.float32(-2.12194440e-4)
EXP_MIN = np.float32(-87.0)  # below this expf is (sub)normal dust; the kernel returns 0 there
EXP_MAX = np.float32(88.0)

# loss codes shared with the torch wrappers
DPO_SIGMOID, DPO_IPO, DPO_HINGE = 0, 1, 2
DPO_CODES = {"sigmoid": DPO_SIGMOID, "ipo": DPO_IPO, "hinge": DPO_HINGE}

_REDUCE = {"reassoc", "nsz"}  # reorders fp32 sums so LLVM can vectorise them; no nnan/ninf


@intrinsic
def _int_bits_as_float32(typingctx, bits):
    """Reinterpret an int32's bits as a float32 (a free bitcast that LLVM vectorises)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float32))

    return sig, codegen


@intrinsic
def _maxnum32(typingctx, a, b):
    """IEEE maxNum of two float32 (``llvm.maxnum``): vectorises in reductions without fast-math."""
    sig = types.float32(types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f32 = context.get_value_type(types.float32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32, f32]), "llvm.maxnum.f32")
        return builder.call(fn, args)

    return sig, codegen


# fastmath=False explicitly: numba otherwise inherits the caller's flags, and ``reassoc`` from the
# summing loops would let LLVM refold the Cody-Waite reduction (seen: 4e-6 relative error at |x| = 80)
@njit(cache=True, fastmath=False)
def _exp32(x):
    """exp(x) in float32 by Cody-Waite reduction and a degree-7 polynomial (Cephes ``expf``).

    ``x = n ln2 + r`` with |r| <= ln2/2; ``exp(x) = 2^n * p(r)``; 2^n is built from its bits.
    Returns 0 for x < -87 (so ``exp(-inf) = 0``) and saturates at x = 88.
    """
    t = min(max(x, EXP_MIN), EXP_MAX)
    n = np.floor(t * LOG2E + np.float32(0.5))
    r = t - n * LN2_HI
    r = r - n * LN2_LO
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1.0)
    scale = _int_bits_as_float32((np.int32(n) + np.int32(127)) << np.int32(23))
    return p * scale if x >= EXP_MIN else np.float32(0.0)


@njit(cache=True)
def _row_max(row):
    m = np.float32(-np.inf)
    for j in range(row.shape[0]):
        m = _maxnum32(m, row[j])
    return m


@njit(cache=True, fastmath=_REDUCE)
def _row_sum_exp(row, shift):
    """sum_j exp(row_j - shift), without storing the terms."""
    s = np.float32(0.0)
    for j in range(row.shape[0]):
        s += _exp32(row[j] - shift)
    return s


@njit(cache=True, fastmath=_REDUCE)
def _row_store_exp(row, shift, out):
    """out_j = exp(row_j - shift); returns their sum."""
    s = np.float32(0.0)
    for j in range(row.shape[0]):
        e = _exp32(row[j] - shift)
        out[j] = e
        s += e
    return s


@njit(cache=True)
def _row_scale(out, scale):
    for j in range(out.shape[0]):
        out[j] *= scale


@njit(cache=True)
def _row_zero(out):
    for j in range(out.shape[0]):
        out[j] = np.float32(0.0)


@njit(cache=True, parallel=True)
def softmax(x, out):
    """Row softmax of x (N, V) into out (N, V): ``exp(x - max) / sum exp(x - max)``."""
    for i in prange(x.shape[0]):
        m = _row_max(x[i])
        s = _row_store_exp(x[i], m, out[i])
        _row_scale(out[i], np.float32(1.0) / s)


@njit(cache=True, parallel=True)
def log_softmax(x, out):
    """Row log-softmax of x (N, V) into out (N, V): ``x - max - log sum exp(x - max)``."""
    for i in prange(x.shape[0]):
        row = x[i]
        m = _row_max(row)
        lse = m + np.float32(math.log(_row_sum_exp(row, m)))
        o = out[i]
        for j in range(row.shape[0]):
            o[j] = row[j] - lse


@njit(cache=True, parallel=True)
def cross_entropy_fwd(logits, labels, ignore_index):
    """Per-row cross-entropy ``lse(x_i) - x_i[y_i]`` (0 where y_i == ignore_index); (N,) float64."""
    n = logits.shape[0]
    losses = np.zeros(n, np.float64)
    for i in prange(n):
        y = labels[i]
        if y == ignore_index:
            continue
        row = logits[i]
        m = _row_max(row)
        losses[i] = m + math.log(_row_sum_exp(row, m)) - row[y]
    return losses


@njit(cache=True, parallel=True)
def cross_entropy_fwd_bwd(logits, labels, ignore_index, grad_scale, dlogits):
    """Fused cross-entropy: per-row losses (N,) float64 and, in the same pass, the gradient.

    ``dlogits_i = grad_scale * (softmax(x_i) - onehot(y_i))`` for counted rows, 0 for ignored ones.
    For the mean over M counted rows the caller passes ``grad_scale = 1/M``. The row's
    exponentials are written straight into ``dlogits`` and rescaled there while the 4V bytes of
    the row are still in cache: one read of the logits, one write of the gradient.
    """
    n = logits.shape[0]
    losses = np.zeros(n, np.float64)
    for i in prange(n):
        y = labels[i]
        g = dlogits[i]
        if y == ignore_index:
            _row_zero(g)
            continue
        row = logits[i]
        m = _row_max(row)
        s = _row_store_exp(row, m, g)
        losses[i] = m + math.log(s) - row[y]
        _row_scale(g, np.float32(grad_scale / s))
        g[y] -= np.float32(grad_scale)
    return losses


@njit(cache=True, parallel=True)
def token_logprob_fwd(logits, labels, weights):
    """Weighted token log-probs ``w_r * (x_r[y_r] - lse_r)`` (R,) float64 and the row log-sum-exps
    ``lse_r`` (R,) float32 that :func:`token_logprob_bwd` needs; rows with w_r = 0 give 0 and are
    not read. One read of the logits, no full-size output."""
    n = logits.shape[0]
    out = np.zeros(n, np.float64)
    lse = np.zeros(n, np.float32)
    for i in prange(n):
        w = weights[i]
        if w == 0:
            continue
        row = logits[i]
        m = _row_max(row)
        log_sum = math.log(_row_sum_exp(row, m))
        lse[i] = m + np.float32(log_sum)
        out[i] = w * (np.float64(row[labels[i]]) - np.float64(m) - log_sum)
    return out, lse


@njit(cache=True, parallel=True)
def token_logprob_bwd(logits, labels, weights, lse, row_grad, dlogits):
    """Gradient of ``sum_r g_r * w_r * log softmax(x_r)[y_r]``, fused into one pass per row:
    ``dlogits_r = g_r w_r (onehot(y_r) - exp(x_r - lse_r))`` (0 where g_r w_r = 0).

    Recomputing the softmax from the saved lse costs one more read of the logits and one exp per
    logit, but avoids keeping a gradient-sized buffer from forward to backward and a second
    read+write pass to apply the upstream gradient.
    """
    for i in prange(logits.shape[0]):
        c = np.float32(row_grad[i] * weights[i])
        g = dlogits[i]
        if c == 0:
            _row_zero(g)
            continue
        row = logits[i]
        shift = lse[i]
        for j in range(row.shape[0]):
            g[j] = -c * _exp32(row[j] - shift)
        g[labels[i]] += c


@njit(cache=True)
def _log_sigmoid(z):
    """log sigma(z) = min(z, 0) - log1p(exp(-|z|)), stable for any z (float64)."""
    return min(z, 0.0) - math.log1p(math.exp(-abs(z)))


@njit(cache=True)
def _sigmoid(z):
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


@njit(cache=True)
def dpo_fwd_bwd(policy_chosen, policy_rejected, ref_chosen, ref_rejected, chosen_len, rejected_len, beta,
                label_smoothing, loss_code):
    """DPO loss (mean over B pairs) and its gradient w.r.t. the policy log-probs (float64 math).

    d = (pc - rc) - (pr - rr). sigmoid/cDPO: ``-(1-e) log s(beta d) - e log s(-beta d)``;
    ipo: ``(pc-rc)/Lc - (pr-rr)/Lr - 1/(2 beta))^2`` (L = 1 without lengths); hinge:
    ``relu(1 - beta d)``. Returns (loss, d loss/d pc (B,), d loss/d pr (B,)); the reference
    gradients are their negatives.
    """
    b = policy_chosen.shape[0]
    d_chosen = np.empty(b, np.float64)
    d_rejected = np.empty(b, np.float64)
    total = 0.0
    for i in range(b):
        chosen_ratio = np.float64(policy_chosen[i]) - np.float64(ref_chosen[i])
        rejected_ratio = np.float64(policy_rejected[i]) - np.float64(ref_rejected[i])
        if loss_code == DPO_IPO:
            lc = max(np.float64(chosen_len[i]), 1.0)
            lr = max(np.float64(rejected_len[i]), 1.0)
            h = chosen_ratio / lc - rejected_ratio / lr - 1.0 / (2.0 * beta)
            total += h * h
            d_chosen[i] = 2.0 * h / lc
            d_rejected[i] = -2.0 * h / lr
            continue
        z = beta * (chosen_ratio - rejected_ratio)
        if loss_code == DPO_SIGMOID:
            total += -(1.0 - label_smoothing) * _log_sigmoid(z) - label_smoothing * _log_sigmoid(-z)
            dz = -(1.0 - label_smoothing) * _sigmoid(-z) + label_smoothing * _sigmoid(z)
        else:
            total += max(1.0 - z, 0.0)
            dz = -1.0 if 1.0 - z > 0.0 else 0.0  # relu'(0) = 0, as in torch
        d_chosen[i] = beta * dz
        d_rejected[i] = -beta * dz
    inv = 1.0 / b
    return total * inv, d_chosen * inv, d_rejected * inv


@njit(cache=True, parallel=True)
def grpo_fwd_bwd(logps, old_logps, advantages, weights, ref_logps, beta, epsilon_low, epsilon_high):
    """GRPO clipped surrogate ``sum_bt w_bt l_bt`` and d/d logps (B, T), float64 math.

    ``r = exp(logp - old)``; ``l = -min(r A, clip(r, 1-el, 1+eh) A) + beta k3``; the gradient of
    the surrogate is ``-A r`` where the unclipped branch is the min, else 0 -- the same as torch's
    min/clamp backward (inclusive clip bounds).
    ``ref_logps`` is ignored when beta == 0 (pass any array of the right shape).
    """
    nb, nt = logps.shape
    row_loss = np.zeros(nb, np.float64)
    dlogps = np.zeros((nb, nt), np.float32)
    lo = 1.0 - epsilon_low
    hi = 1.0 + epsilon_high
    for b in prange(nb):
        adv = np.float64(advantages[b])
        acc = 0.0
        for t in range(nt):
            w = np.float64(weights[b, t])
            if w == 0.0:
                continue
            lp = np.float64(logps[b, t])
            ratio = math.exp(lp - np.float64(old_logps[b, t]))
            token_loss = -min(ratio * adv, min(max(ratio, lo), hi) * adv)
            # the unclipped branch is the min inside the clip range, above it when A < 0 and below
            # it when A > 0; only that branch depends on logp (clip outside its range is constant)
            unclipped_wins = (lo <= ratio <= hi) or (ratio > hi and adv < 0.0) or (ratio < lo and adv > 0.0)
            token_grad = -ratio * adv if unclipped_wins else 0.0
            if beta != 0.0:
                delta = np.float64(ref_logps[b, t]) - lp
                e = math.exp(delta)
                token_loss += beta * (e - delta - 1.0)
                token_grad += beta * (1.0 - e)
            acc += w * token_loss
            dlogps[b, t] = w * token_grad
        row_loss[b] = acc
    return row_loss.sum(), dlogps


@njit(cache=True, parallel=True)
def approx_kl_fwd(logps, ref_logps, weights):
    """Per-element k3 ``exp(ref - logp) - (ref - logp) - 1`` times weights (flat arrays)."""
    n = logps.shape[0]
    out = np.empty(n, np.float32)
    for i in prange(n):
        w = np.float64(weights[i])
        if w == 0.0:
            out[i] = 0.0
            continue
        delta = np.float64(ref_logps[i]) - np.float64(logps[i])
        out[i] = w * (math.exp(delta) - delta - 1.0)
    return out


@njit(cache=True, parallel=True)
def approx_kl_bwd(logps, ref_logps, weights, grad_out):
    """Gradients of :func:`approx_kl_fwd`: d/dlogp = g w (1 - exp(ref - logp)), d/dref = -d/dlogp."""
    n = logps.shape[0]
    d_logps = np.empty(n, np.float32)
    d_ref = np.empty(n, np.float32)
    for i in prange(n):
        w = np.float64(weights[i])
        if w == 0.0:
            d_logps[i] = 0.0
            d_ref[i] = 0.0
            continue
        d = np.float64(grad_out[i]) * w * (1.0 - math.exp(np.float64(ref_logps[i]) - np.float64(logps[i])))
        d_logps[i] = d
        d_ref[i] = -d
    return d_logps, d_ref
