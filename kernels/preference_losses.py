"""Numba kernels for the preference losses without a paired reference margin: KTO and ORPO's
odds-ratio term, each forward+backward in one call.

Same contract as ``dpo_fwd_bwd`` in ``kernels/losses.py``: fp32 (B,) inputs, float64 arithmetic
inside, the mean loss and its gradient w.r.t. each input returned together (B is a batch of
sequences, so one sequential loop; there is nothing to parallelise). The torch wrappers are
``KTOLossFn`` / ``OddsRatioFn`` in ``training_assets.trainers.numba_ops``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .losses import _log_sigmoid, _sigmoid

NEG_LN2 = -0.6931471805599453  # log1mexp's branch point (TRL 1.16 ``log1mexp``; Maechler 2012)


@njit(cache=True)
def kto_fwd_bwd(policy, ref, desirable, kl, beta, desirable_weight, undesirable_weight):
    """KTO loss (mean over B examples) and d loss / d policy (B,); d loss / d ref is its negative.

    With r = policy - ref and the reference point z0 = ``kl`` (a constant of the step):
    desirable ``w_D (1 - s(beta (r - z0)))``, undesirable ``w_U (1 - s(beta (z0 - r)))``.
    Writing x = +-beta (r - z0), ``1 - s(x) = s(-x)`` (exact here, cancellation-free) and
    ``d/dr (1 - s(x)) = -+beta s(x) s(-x)``.
    """
    b = policy.shape[0]
    d_policy = np.empty(b, np.float64)
    total = 0.0
    for i in range(b):
        sign = 1.0 if desirable[i] else -1.0
        weight = desirable_weight if desirable[i] else undesirable_weight
        x = sign * beta * (np.float64(policy[i]) - np.float64(ref[i]) - kl)
        tail = _sigmoid(-x)
        total += weight * tail
        d_policy[i] = -weight * sign * beta * _sigmoid(x) * tail
    inv = 1.0 / b
    return total * inv, d_policy * inv


@njit(cache=True)
def _log1mexp(x):
    """log(1 - exp(x)) for x <= 0: log1p(-exp(x)) below -ln 2, log(-expm1(x)) above (no cancellation)."""
    if x < NEG_LN2:
        return math.log1p(-math.exp(x))
    return math.log(-math.expm1(x))


@njit(cache=True)
def orpo_odds_ratio_fwd_bwd(chosen, rejected, beta):
    """ORPO's odds-ratio term ``-beta/B sum_i log s(z_i)`` over mean log-probs c, r (B,).

    ``z = log(odds(c)/odds(r)) = (c - r) - (log1mexp(c) - log1mexp(r))`` with odds(p) = p/(1-p)
    and p = exp(mean log-prob). ``dz/dc = 1/(1 - e^c) = -1/expm1(c)``, ``dz/dr = 1/expm1(r)``,
    ``d(-log s(z))/dz = -s(-z)``. Returns (loss, z (B,), d loss/d c (B,), d loss/d r (B,)).
    """
    b = chosen.shape[0]
    log_odds = np.empty(b, np.float64)
    d_chosen = np.empty(b, np.float64)
    d_rejected = np.empty(b, np.float64)
    total = 0.0
    scale = beta / b
    for i in range(b):
        c = np.float64(chosen[i])
        r = np.float64(rejected[i])
        z = (c - r) - (_log1mexp(c) - _log1mexp(r))
        log_odds[i] = z
        total -= _log_sigmoid(z)
        dz = -scale * _sigmoid(-z)
        d_chosen[i] = -dz / math.expm1(c)
        d_rejected[i] = dz / math.expm1(r)
    return total * scale, log_odds, d_chosen, d_rejected
