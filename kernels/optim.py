"""Numba optimizer steps, in place over fp32 arrays: a multi-tensor AdamW with the global
grad-norm clip and the gradient zeroing fused in, and SGD (momentum, Nesterov).

Both follow ``torch.optim`` (same update order, same fp32 arithmetic), so ``NumbaAdamW`` tracks
``torch.optim.AdamW(fused=True)`` to rounding (``tests/kernels/test_optim_kernels.py``).

The multi-tensor AdamW works on a table, not on Python lists: ``addresses[t] = (param, grad,
exp_avg, exp_avg_sq)`` data pointers of tensor ``t`` (contiguous fp32, validated and kept alive
by the caller, ``training_assets.trainers.numba_optim``), ``chunks[c] = (t, start, stop)`` spans
of at most ``CHUNK`` elements, ``hyper[t] = (lr, beta1, beta2, eps, weight_decay, step)``. One
``prange`` over the chunks covers every tensor of every parameter group, so a model of hundreds
of small tensors is one call and a big tensor is split across threads.

A trainer's optimizer step (``clip_grad_norm_`` + ``AdamW`` + ``zero_grad``) is two passes:

1. ``grad_sq_sums``: one read of every gradient; per-chunk sums of squares in float64 (summed
   in chunk order afterwards, so the norm does not depend on the thread count);
2. ``adamw_update``: one pass that reads p, g, m, v, applies the clip coefficient to g in
   registers, updates m, v, p and writes 0 to g.

Bytes per parameter (reads + writes of p, g, m, v): 4 + 32 = 36. torch's composition moves 44:
``clip_grad_norm_`` reads g for the norm (4) and rewrites it scaled (8), the fused AdamW reads
p, g, m, v and writes p, m, v (28), ``zero_grad(set_to_none=False)`` writes g (4).
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import carray, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .threads import launch

launch()  # Numba's pool, started with OpenMP nesting off (kernels/threads.py)

CHUNK = 1 << 16  # elements per span: 256 KiB of each of the four arrays, far above the per-span overhead
_REDUCE = {"reassoc", "nsz"}  # lets LLVM vectorise the float64 sum of squares; no nnan/ninf


@intrinsic
def _f32_ptr(typingctx, address):
    """An int64 address as a ``float32*`` (for ``numba.carray``)."""
    sig = types.CPointer(types.float32)(types.int64)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.float32)))

    return sig, codegen


@intrinsic
def _fma32(typingctx, a, b, c):
    """``a * b + c`` rounded once (``llvm.fma``): torch's vectorised lerp is an fmadd."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f32 = context.get_value_type(types.float32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32, f32, f32]), "llvm.fma.f32")
        return builder.call(fn, args)

    return sig, codegen


@njit(cache=True, inline="always")
def _span(address, start, stop):
    return carray(_f32_ptr(address + 4 * start), stop - start)


def chunk_table(sizes: np.ndarray, chunk: int = CHUNK) -> np.ndarray:
    """(n_chunks, 3) int64 rows ``(tensor, start, stop)`` covering ``sizes`` in spans <= chunk."""
    sizes = np.asarray(sizes, np.int64)
    if sizes.ndim != 1 or (sizes < 0).any() or chunk <= 0:
        raise ValueError(f"chunk_table needs non-negative 1-D sizes and chunk > 0; got {sizes!r}, {chunk}")
    per = (sizes + chunk - 1) // chunk
    tensor = np.repeat(np.arange(sizes.shape[0], dtype=np.int64), per)
    first = np.repeat(np.cumsum(per) - per, per)
    start = (np.arange(tensor.shape[0], dtype=np.int64) - first) * chunk
    stop = np.minimum(start + chunk, sizes[tensor])
    return np.stack([tensor, start, stop], axis=1)


@njit(cache=True, parallel=True, fastmath=_REDUCE)
def grad_sq_sums(addresses, chunks):
    """Per-chunk float64 sums of squares of the gradients (column 1 of ``addresses``)."""
    out = np.empty(chunks.shape[0], np.float64)
    for c in prange(chunks.shape[0]):
        g = _span(addresses[chunks[c, 0], 1], chunks[c, 1], chunks[c, 2])
        s = 0.0
        for i in range(g.shape[0]):
            x = np.float64(g[i])
            s += x * x
        out[c] = s
    return out


def clip_coefficient(total_norm: float, max_norm: float) -> np.float32:
    """``torch.nn.utils.clip_grad_norm_``'s coefficient, in its fp32 arithmetic:
    ``clamp(max_norm * reciprocal(norm + 1e-6), max=1)`` (torch's ``max_norm / t`` is
    ``t.reciprocal() * max_norm``). Non-finite norms as torch with ``error_if_nonfinite=False``:
    an inf norm gives 0 (finite gradient entries become 0, inf ones NaN), a NaN norm gives NaN
    (every gradient entry, hence every updated parameter, becomes NaN); nothing is skipped."""
    norm32 = np.float32(total_norm)
    coef = np.float32(np.float32(1.0) / (norm32 + np.float32(1e-6))) * np.float32(max_norm)
    return np.float32(1.0) if coef > 1 else np.float32(coef)  # NaN > 1 is False: NaN stays NaN


@njit(cache=True, inline="always")
def _adamw_span(p, g, m, v, step_size, bc2_sqrt, decay, lerp_coeff, lerp_from_grad, b2, one_minus_b2, eps, coef,
                zero):
    for i in range(p.shape[0]):
        grad = g[i] * coef
        mi = m[i]
        # torch's lerp(m, g, w): m + w (g - m) for |w| < 0.5, else g + (w - 1)(g - m), one fmadd
        mi = _fma32(lerp_coeff, grad - mi, grad if lerp_from_grad else mi)
        vi = _fma32(one_minus_b2 * grad, grad, v[i] * b2)  # contracted so in torch's build
        m[i] = mi
        v[i] = vi
        denom = np.sqrt(vi) / bc2_sqrt + eps
        p[i] = p[i] * decay - step_size * mi / denom
        if zero:
            g[i] = 0.0


@njit(cache=True, parallel=True)
def adamw_update(addresses, chunks, hyper, coef, zero_grad):
    """One AdamW step (Loshchilov & Hutter 2019, arXiv:1711.05101) over every chunk, in place.

    With ``g' = coef * g`` (fp32, as torch's ``_foreach_mul_`` leaves it): ``p <- p (1 - lr wd)``
    (decoupled weight decay), ``m <- m + (1 - b1)(g' - m)``, ``v <- b2 v + (1 - b2) g'^2``,
    ``p <- p - lr/(1 - b1^t) * m / (sqrt(v)/sqrt(1 - b2^t) + eps)``, then ``g <- 0`` when
    ``zero_grad``. The step scalars are computed per tensor in float64, as torch does.
    """
    for c in prange(chunks.shape[0]):
        t = chunks[c, 0]
        start, stop = chunks[c, 1], chunks[c, 2]
        lr, beta1, beta2, eps, weight_decay, step = (hyper[t, 0], hyper[t, 1], hyper[t, 2], hyper[t, 3],
                                                     hyper[t, 4], hyper[t, 5])
        bias_correction1 = 1.0 - beta1**step
        bias_correction2_sqrt = math.sqrt(1.0 - beta2**step)
        weight = np.float32(1.0 - beta1)
        from_grad = not abs(weight) < 0.5
        _adamw_span(_span(addresses[t, 0], start, stop), _span(addresses[t, 1], start, stop),
                    _span(addresses[t, 2], start, stop), _span(addresses[t, 3], start, stop),
                    np.float32(lr / bias_correction1), np.float32(bias_correction2_sqrt),
                    np.float32(1.0 - lr * weight_decay), weight - np.float32(1.0) if from_grad else weight, from_grad,
                    np.float32(beta2), np.float32(1.0 - beta2), np.float32(eps), coef, zero_grad)


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
