"""Numba optimizer steps, in place over flat fp32 arrays: AdamW and SGD (momentum, Nesterov).

Both follow ``torch.optim`` exactly (same update order, same fp32 arithmetic), so a
``NumbaAdamW`` run tracks ``torch.optim.AdamW`` to rounding (``tests/kernels`` checks rtol 1e-5
over several steps). The scalars that depend only on the step (bias corrections) are computed
once per call in float64, as torch does; the per-element work is a single streaming pass:
AdamW reads p, g, m, v and writes p, m, v (28 bytes per parameter), the minimum for the update.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange


@njit(cache=True, parallel=True)
def adam_step(param, grad, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, weight_decay, step):
    """One AdamW step (Loshchilov & Hutter 2019, arXiv:1711.05101) on 1-D fp32 arrays, in place.

    ``p <- p (1 - lr wd)`` (decoupled weight decay), ``m <- m + (1 - b1)(g - m)``,
    ``v <- b2 v + (1 - b2) g^2``, ``p <- p - lr/(1 - b1^t) * m / (sqrt(v)/sqrt(1 - b2^t) + eps)``.
    ``step`` is t >= 1, counted by the caller.
    """
    bias_correction1 = 1.0 - beta1**step
    bias_correction2_sqrt = math.sqrt(1.0 - beta2**step)
    step_size = np.float32(lr / bias_correction1)
    inv_bc2_sqrt = np.float32(1.0 / bias_correction2_sqrt)
    decay = np.float32(1.0 - lr * weight_decay)
    one_minus_b1 = np.float32(1.0 - beta1)
    b2 = np.float32(beta2)
    one_minus_b2 = np.float32(1.0 - beta2)
    eps32 = np.float32(eps)
    for i in prange(param.shape[0]):
        g = grad[i]
        m = exp_avg[i]
        m = m + one_minus_b1 * (g - m)
        v = b2 * exp_avg_sq[i] + one_minus_b2 * (g * g)
        exp_avg[i] = m
        exp_avg_sq[i] = v
        denom = np.sqrt(v) * inv_bc2_sqrt + eps32
        param[i] = param[i] * decay - step_size * (m / denom)


@njit(cache=True, parallel=True)
def sgd_step(param, grad, momentum_buffer, lr, momentum, dampening, weight_decay, nesterov, first_step):
    """One SGD step on 1-D fp32 arrays, in place, as ``torch.optim.SGD``.

    ``g <- g + wd p``; with momentum: ``buf <- g`` on the first step, else
    ``buf <- momentum buf + (1 - dampening) g``; the direction is ``g + momentum buf`` (Nesterov,
    Sutskever et al. 2013) or ``buf``; ``p <- p - lr * direction``. Without momentum
    (momentum == 0) ``momentum_buffer`` is not touched (pass any 1-D array).
    """
    lr32 = np.float32(lr)
    wd = np.float32(weight_decay)
    mu = np.float32(momentum)
    keep = np.float32(1.0 - dampening)
    for i in prange(param.shape[0]):
        g = grad[i]
        if weight_decay != 0.0:
            g = g + wd * param[i]
        if momentum != 0.0:
            if first_step:
                buf = g
            else:
                buf = mu * momentum_buffer[i] + keep * g
            momentum_buffer[i] = buf
            g = g + mu * buf if nesterov else buf
        param[i] = param[i] - lr32 * g
