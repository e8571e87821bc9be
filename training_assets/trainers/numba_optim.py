"""Numba optimizers (``kernels/optim.py``) as ``torch.optim.Optimizer``s: the ``kernel_backend="numba"``
of ``training_assets.trainers.loop``. Re-exported by ``training_assets.trainers.numba_ops``.

``NumbaAdamW`` is a multi-tensor AdamW (every parameter of every group in one parallel kernel
call). ``step()`` is ``torch.optim.AdamW(fused=True).step()``; ``clip_step_zero(max_norm)`` is
what a trainer runs per step, fused::

    torch.nn.utils.clip_grad_norm_(params_with_grads, max_norm)   # error_if_nonfinite=False
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)

in two passes over memory instead of five (see ``kernels/optim.py`` for the bytes). The gradients
are zeroed in place, not set to None: the next backward accumulates into them (``0 + g`` is
exact), so the losses are those of torch's path.

Constraints (each violated one raises a ValueError naming the tensor): contiguous fp32 CPU
parameters and dense contiguous gradients. Optimizer state (``exp_avg``, ``exp_avg_sq``,
``step``) has torch's names, dtypes and shapes, so a checkpoint moves between the backends.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch

from training_assets_kernels import optim as KO


def _flat_f32(name: str, tensor: torch.Tensor) -> np.ndarray:
    """Writable flat view of a parameter/state tensor (must be contiguous: updated in place)."""
    if tensor.device.type != "cpu" or tensor.dtype != torch.float32 or not tensor.is_contiguous():
        raise ValueError(f"{name}: numba optimizers update contiguous fp32 CPU tensors in place; got "
                         f"{tensor.dtype} on {tensor.device} (contiguous={tensor.is_contiguous()}); use backend='torch'")
    return tensor.detach().view(-1).numpy()


def _check_in_place(name: str, tensor: torch.Tensor) -> None:
    """What ``_flat_f32`` checks, without building a view (the multi-tensor step takes pointers)."""
    if tensor.is_sparse:
        raise ValueError(f"{name}: numba optimizers take dense tensors; use backend='torch' for sparse ones")
    if tensor.dtype != torch.float32 or tensor.device.type != "cpu" or not tensor.is_contiguous():
        _flat_f32(name, tensor)  # raises with the full message


def _grad_f32(p: torch.Tensor) -> np.ndarray:
    if p.grad.is_sparse:
        raise ValueError("numba optimizers take dense gradients; use backend='torch' for sparse ones")
    return _flat_f32("grad", p.grad)


def _state_buffer(p: torch.Tensor) -> torch.Tensor:
    """Zeroed optimizer state shaped like p, allocated by NumPy: NumPy asks the kernel for
    transparent huge pages on big buffers (torch's allocator does not), which cuts TLB misses on the
    streaming update (an AdamW step over 50M parameters ran ~20% faster here)."""
    return torch.from_numpy(np.zeros(tuple(p.shape), np.float32))


class NumbaAdamW(torch.optim.Optimizer):
    """``torch.optim.AdamW`` (no amsgrad/maximize), multi-tensor, with a fused clip + step + zero."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2):
        if lr < 0 or eps < 0 or weight_decay < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid AdamW hyper-parameters lr={lr} betas={betas} eps={eps} "
                             f"weight_decay={weight_decay}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})
        self._chunk_sizes: tuple[int, ...] = ()
        self._chunks = np.empty((0, 3), np.int64)

    def _table(self):
        """Every parameter with a gradient: its tensors (kept referenced through the kernel
        calls), their data pointers, per-tensor hyper-parameters (step still to be set) and step
        counters. Creates the state of parameters seen for the first time."""
        tensors, steps, rows = [], [], []
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            hyper = (float(group["lr"]), float(beta1), float(beta2), float(group["eps"]),
                     float(group["weight_decay"]), 0.0)
            for p in group["params"]:
                if p.grad is None:
                    continue
                _check_in_place("param", p)
                _check_in_place("grad", p.grad)
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = _state_buffer(p)
                    state["exp_avg_sq"] = _state_buffer(p)
                for name in ("exp_avg", "exp_avg_sq"):
                    _check_in_place(name, state[name])
                    if state[name].numel() != p.numel():
                        raise ValueError(f"{name} has {state[name].numel()} elements for a parameter of {p.numel()}: "
                                         "the optimizer state does not belong to these parameters")
                tensors.append((p, p.grad, state["exp_avg"], state["exp_avg_sq"]))
                steps.append(state["step"])
                rows.append(hyper)
        addresses = np.array([[t.data_ptr() for t in row] for row in tensors], np.int64).reshape(-1, 4)
        sizes = tuple(row[0].numel() for row in tensors)
        if sizes != self._chunk_sizes:
            self._chunks = KO.chunk_table(np.array(sizes, np.int64))
            self._chunk_sizes = sizes
        return tensors, addresses, np.array(rows, np.float64).reshape(-1, 6), steps

    def _update(self, tensors, addresses, hyper, steps, coef, zero_grad: bool) -> None:
        if not tensors:
            return
        torch._foreach_add_(steps, 1)
        hyper[:, 5] = torch.stack(steps).double().numpy()
        KO.adamw_update(addresses, self._chunks, hyper, np.float32(coef), zero_grad)

    @torch.no_grad()
    def step(self, closure=None, *, _fused=None):
        """``torch.optim.AdamW.step``. ``_fused`` is ``clip_step_zero``'s prepared pass: it goes
        through ``step`` so that step hooks and LR schedulers see an optimizer step."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if _fused is None:
            self._update(*self._table(), coef=1.0, zero_grad=False)
        else:
            table, coef = _fused
            self._update(*table, coef=coef, zero_grad=True)
        return loss

    @torch.no_grad()
    def clip_step_zero(self, max_norm: float | None, error_if_nonfinite: bool = False) -> float | None:
        """``clip_grad_norm_`` (L2, over every parameter of the optimizer that has a gradient) +
        ``step()`` + ``zero_grad(set_to_none=False)`` in one read of the gradients for the norm
        and one fused update pass. ``max_norm=None``: no clipping (no norm pass). Returns the
        total norm before clipping (None without clipping).

        Non-finite norm, as torch with ``error_if_nonfinite=False``: the step still runs with the
        coefficient torch computes (inf norm: 0, NaN norm: NaN), so an inf gradient entry turns
        its parameter NaN and a NaN one turns every parameter NaN; the loop's non-finite loss
        check then stops the run. ``error_if_nonfinite=True`` raises before anything is changed.
        """
        table = self._table()
        tensors, addresses = table[0], table[1]
        norm = None
        coef = np.float32(1.0)
        if max_norm is not None:
            if not max_norm > 0:
                raise ValueError(f"max_norm={max_norm}: clipping needs max_norm > 0 (None disables it)")
            norm = math.sqrt(float(KO.grad_sq_sums(addresses, self._chunks).sum())) if tensors else 0.0
            if error_if_nonfinite and not math.isfinite(norm):
                raise RuntimeError(f"the total gradient norm is {norm}; nothing was updated "
                                   "(error_if_nonfinite=False applies torch's coefficient instead)")
            coef = KO.clip_coefficient(norm, max_norm)
        self.step(_fused=(table, coef))
        return norm


_NO_BUFFER = np.empty(0, np.float32)  # sgd_step without momentum never reads its buffer


class NumbaSGD(torch.optim.Optimizer):
    """``torch.optim.SGD`` (momentum, dampening, Nesterov, weight decay) via ``training_assets_kernels.optim.sgd_step``."""

    def __init__(self, params: Iterable, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"invalid SGD hyper-parameters lr={lr} momentum={momentum} weight_decay={weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum needs momentum > 0 and dampening = 0")
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": dampening,
                                  "weight_decay": weight_decay, "nesterov": nesterov})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                first = state.get("momentum_buffer") is None
                if first and group["momentum"] != 0:
                    state["momentum_buffer"] = _state_buffer(p)
                buf = state.get("momentum_buffer")
                KO.sgd_step(_flat_f32("param", p), _grad_f32(p),
                            _NO_BUFFER if buf is None else _flat_f32("momentum_buffer", buf),
                            float(group["lr"]), float(group["momentum"]), float(group["dampening"]),
                            float(group["weight_decay"]), bool(group["nesterov"]), first)
        return loss


OPTIMIZERS = {"adamw": (torch.optim.AdamW, NumbaAdamW), "sgd": (torch.optim.SGD, NumbaSGD)}


def make_optimizer(name: str, params: Iterable, backend: str = "torch", **hyper) -> torch.optim.Optimizer:
    """``torch.optim.AdamW``/``SGD`` for backend="torch", ``NumbaAdamW``/``NumbaSGD`` for "numba"."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer {name!r} is not one of {sorted(OPTIMIZERS)}")
    if backend not in ("torch", "numba"):
        raise ValueError(f"backend={backend!r} is not 'torch' or 'numba'")
    torch_cls, numba_cls = OPTIMIZERS[name]
    return (torch_cls if backend == "torch" else numba_cls)(params, **hyper)
