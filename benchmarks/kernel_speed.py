"""Numba loss/optimizer kernels against their torch twins, side by side in one run (CPU, fp32).

    .venv/bin/python benchmarks/kernel_speed.py            # full sizes (~3.5 GB RAM; 8.5 min at load 9 on 2 cores)
    .venv/bin/python benchmarks/kernel_speed.py --quick    # smoke sizes
    .venv/bin/python benchmarks/kernel_speed.py --cases optimizer_step   # one case (45 s - 2 min at load 7-11 here)

Measures (best of --repeats interleaved rounds, after a warm-up call that compiles/loads the kernels):

- fused cross-entropy fwd+bwd, N x V logits (default 4096 x 32768) vs ``F.cross_entropy``
  fwd+bwd; target >= 3x, and extra memory (peak RSS above the logits, gradient included, with
  the gradient workspace empty at the start) <= 1x the logits (plus O(N) per-row bookkeeping);
  ``zero_grad`` stays outside the timing. ``numba`` reuses its gradient buffer across steps
  (``numba_ops.WORKSPACE``); ``numba_fresh`` allocates a new one per call, as torch does, to
  show how much of the gain is the fused kernel and how much is not page-faulting 4 bytes x N x V;
- sequence log-prob fwd+bwd (B x T = N rows, same V) vs ``log_softmax`` + ``gather`` + backward,
  with a random upstream gradient per sequence (as DPO gives); target >= 3x;
- one AdamW step over 50M parameters vs ``torch.optim.AdamW(fused=True)``; target >= 1.0x;
- the trainer's whole optimizer step over 50M parameters in the tensors of a transformer (135
  tensors): ``clip_grad_norm_`` + ``AdamW(fused=True)`` + ``zero_grad(set_to_none=False)`` vs
  ``NumbaAdamW.clip_step_zero``, sides alternating over >= 5 rounds with a copy-bandwidth probe
  in each round; median ratio, its spread and each side's fraction of the copy bandwidth,
  counting 48 vs 36 bytes of DRAM traffic per parameter; target >= 1.2x;
- the roofline measured in the same run: multi-threaded copy bandwidth on pre-touched buffers
  (bytes moved: read, write-allocate, write) and exp throughput of the kernels' vectorised exp;
  each kernel's fraction of each bound, counting its bytes the same way.

The last line is ``RESULT {json}``. Times are wall-clock on a machine that may be shared: the
1-minute load average is reported next to them.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numba  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from numba import njit, prange  # noqa: E402

from training_assets_kernels import losses as K  # noqa: E402
from training_assets.trainers import numba_ops, objectives  # noqa: E402


@njit(parallel=True, cache=True)
def _copy(src, dst):
    for i in prange(src.shape[0]):
        dst[i] = src[i]


@njit(parallel=True, cache=True)
def _exp_probe(x, passes):
    """Each row: ``passes`` times sum(exp(row)) with the kernels' exp; rows stay in L1/L2."""
    total = np.zeros(x.shape[0], np.float32)
    for i in prange(x.shape[0]):
        for _ in range(passes):
            total[i] += K._row_sum_exp(x[i], np.float32(0.0))
    return total


def best_time(fn, repeats: int) -> float:
    return best_times({"fn": fn}, repeats)["fn"]


def best_times(fns: dict, repeats: int, setup=None) -> dict:
    """Min wall time of each function over ``repeats`` rounds, the functions interleaved per round
    so that a shared machine's load hits every contender alike (the min filters the bursts).
    ``setup(name)`` (untimed) runs before each call, e.g. ``zero_grad``, which is not part of fwd+bwd."""
    for fn in fns.values():
        fn()  # warm-up: compile / load kernels, fault pages in
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            if setup is not None:
                setup(name)
            gc.collect()
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


POOLED = numba_ops.WORKSPACE
NO_POOL = numba_ops.GradientWorkspace(capacity=0)  # every take() allocates: what torch does


def use_workspace(contender: str | None) -> None:
    """``numba_fresh`` runs the same kernels with a new gradient buffer per call (no reuse)."""
    numba_ops.WORKSPACE = NO_POOL if contender == "numba_fresh" else POOLED


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


def peak_extra_bytes(fn) -> int:
    """Peak resident memory above the current level while fn runs (Linux: VmHWM reset via clear_refs)."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kb("VmRSS")
    fn()
    return (_status_kb("VmHWM") - before) * 1024


def roofline(threads: int, repeats: int, quick: bool) -> dict:
    n = (32 if quick else 256) * 2**20 // 4  # 32 / 256 MiB per buffer: far beyond the caches
    src = np.ones(n, np.float32)
    dst = np.zeros(n, np.float32)  # both pre-touched: no page faults inside the timing
    repeats = max(repeats, 15)  # probes are short: more tries to find a quiet moment
    copy_s = best_time(lambda: _copy(src, dst), repeats)
    rows = np.random.default_rng(0).standard_normal((threads * 16, 4096)).astype(np.float32) - 2
    passes = 20 if quick else 200
    exp_s = best_time(lambda: _exp_probe(rows, passes), repeats)
    # bytes moved by a copy: read src, read dst for ownership (write-allocate), write dst
    return {"copy_GBps": 3 * n * 4 / copy_s / 1e9, "exp_G_per_s": rows.size * passes / exp_s / 1e9}


def bench_cross_entropy(n: int, v: int, repeats: int, roof: dict) -> dict:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(n, v, generator=gen) * 2
    labels = torch.randint(0, v, (n,), generator=gen)
    labels[torch.rand(n, generator=gen) < 0.05] = -100
    x = logits.requires_grad_()

    def zero_grad(name=None):
        x.grad = None
        use_workspace(name)

    def run(backend):
        loss = objectives.cross_entropy(x, labels, backend="torch" if backend == "torch" else "numba")
        loss.backward()
        return loss

    loss_t = run("torch").item()
    grad_t = x.grad.clone()
    zero_grad()
    loss_n = run("numba").item()
    grad_diff = (x.grad - grad_t).abs().max().item()
    del grad_t
    x.grad = None
    out = {"N": n, "V": v, "loss_rel_diff": abs(loss_n - loss_t) / abs(loss_t), "grad_max_abs_diff": grad_diff}
    logit_bytes = n * v * 4
    contenders = ("torch", "numba", "numba_fresh")
    times = best_times({c: lambda b=c: run(b) for c in contenders}, repeats, zero_grad)
    for backend in ("torch", "numba"):
        out[f"{backend}_s"] = times[backend]
        zero_grad()
        POOLED.clear()  # the measured peak includes allocating the workspace buffer
        extra = peak_extra_bytes(lambda b=backend: run(b))
        out[f"{backend}_extra_mem_x_logits"] = extra / logit_bytes
    zero_grad()
    POOLED.clear()
    out["numba_fresh_buffer_s"] = times["numba_fresh"]
    out["speedup_fresh_buffer"] = out["torch_s"] / times["numba_fresh"]
    # the gradient itself is 1x; allow the O(N) per-row bookkeeping (labels, row losses) on top
    out["pass_memory"] = extra <= logit_bytes + 64 * n
    t = out["numba_s"]
    out["speedup"] = out["torch_s"] / t
    # read the logits; write-allocate + write the gradient (its lines are not read first)
    out["roofline_mem_fraction"] = 3 * logit_bytes / t / 1e9 / roof["copy_GBps"]
    out["roofline_exp_fraction"] = n * v / t / 1e9 / roof["exp_G_per_s"]  # one exp per logit
    out["pass_speed"] = out["speedup"] >= 3.0
    return out


def bench_sequence_logprob(n: int, v: int, repeats: int, roof: dict) -> dict:
    b = 8
    t_len = n // b
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(b, t_len, v, generator=gen) * 2).requires_grad_()
    labels = torch.randint(0, v, (b, t_len), generator=gen)
    mask = (torch.rand(b, t_len, generator=gen) < 0.8).long()
    upstream = torch.randn(b, generator=gen)  # a DPO-like per-sequence gradient: no shortcut for ones

    def torch_logprob(logits, y, m):
        token = torch.log_softmax(logits, -1).gather(-1, torch.where(m != 0, y, 0).unsqueeze(-1)).squeeze(-1)
        return (token * m).sum(-1)

    def zero_grad(name=None):
        x.grad = None
        use_workspace(name)

    def run(backend):
        if backend == "torch":
            seq = torch_logprob(x, labels, mask)
        else:
            seq = objectives.sequence_logprob(x, labels, mask, backend="numba")
        (seq * upstream).sum().backward()
        return seq

    seq_t = run("torch").detach()
    grad_t = x.grad.clone()
    zero_grad()
    seq_n = run("numba").detach()
    out = {"B": b, "T": t_len, "V": v, "logprob_max_rel_diff": ((seq_n - seq_t).abs() / seq_t.abs()).max().item(),
           "grad_max_abs_diff": (x.grad - grad_t).abs().max().item()}
    del grad_t
    contenders = ("torch", "numba", "numba_fresh")
    times = best_times({c: lambda b=c: run(b) for c in contenders}, repeats, zero_grad)
    out["torch_s"], out["numba_s"] = times["torch"], times["numba"]
    out["numba_fresh_buffer_s"] = times["numba_fresh"]
    out["speedup_fresh_buffer"] = out["torch_s"] / times["numba_fresh"]
    zero_grad()
    POOLED.clear()
    elapsed = out["numba_s"]
    logit_bytes = n * v * 4
    out["speedup"] = out["torch_s"] / elapsed
    # forward reads the logits (lse per row); backward reads them again, write-allocates and
    # writes the gradient
    out["roofline_mem_fraction"] = 4 * logit_bytes / elapsed / 1e9 / roof["copy_GBps"]
    out["roofline_exp_fraction"] = 2 * n * v / elapsed / 1e9 / roof["exp_G_per_s"]  # one exp each way
    out["pass_speed"] = out["speedup"] >= 3.0
    return out


def bench_adamw(n_params: int, repeats: int, roof: dict) -> dict:
    chunks = 10
    gen = torch.Generator().manual_seed(2)
    sizes = [n_params // chunks] * chunks

    def make():
        params = [torch.nn.Parameter(torch.randn(s, generator=torch.Generator().manual_seed(i)))
                  for i, s in enumerate(sizes)]
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        return params

    params_t, params_n = make(), make()
    for p_t, p_n in zip(params_t, params_n, strict=True):
        p_n.grad = p_t.grad.clone()
    opt_t = torch.optim.AdamW(params_t, lr=1e-3, weight_decay=0.01, fused=True)
    opt_n = numba_ops.NumbaAdamW(params_n, lr=1e-3, weight_decay=0.01)
    opt_t.step()
    opt_n.step()
    max_diff = max((a - b).abs().max().item() for a, b in zip(params_n, params_t, strict=True))
    out = {"params": sum(sizes), "param_max_abs_diff_after_1_step": max_diff}
    # a step is ~0.1 s and both sides are bound by the same 28 bytes/parameter: take more rounds so
    # the minimum of each approaches its unloaded time
    times = best_times({"torch": opt_t.step, "numba": opt_n.step}, max(repeats, 20))
    out["torch_fused_s"], out["numba_s"] = times["torch"], times["numba"]
    out["speedup"] = out["torch_fused_s"] / out["numba_s"]
    bytes_moved = 7 * 4 * sum(sizes)  # read p, g, m, v; write p, m, v (lines already read: no write-allocate)
    out["roofline_mem_fraction"] = bytes_moved / out["numba_s"] / 1e9 / roof["copy_GBps"]
    out["torch_roofline_mem_fraction"] = bytes_moved / out["torch_fused_s"] / 1e9 / roof["copy_GBps"]
    out["pass_speed"] = out["speedup"] >= 1.0
    return out


def transformer_shapes(n_params: int) -> list[tuple[int, ...]]:
    """Parameter shapes of a GPT-style decoder (d=512, vocab 32000, MLP 4d; d=128, vocab 8000
    below 10M), layers added until ``n_params`` is reached: embedding, per layer LayerNorm
    weight+bias x2, fused QKV, output projection, MLP in/out (weights and biases), final norm."""
    d, vocab = (512, 32000) if n_params >= 10_000_000 else (128, 8000)
    shapes: list[tuple[int, ...]] = [(vocab, d), (d,), (d,)]
    layer = [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,), (d,), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,)]
    while sum(int(np.prod(s)) for s in shapes) < n_params:
        shapes[1:1] = layer
    return shapes


def bench_optimizer_step(n_params: int, rounds: int, max_norm: float = 1.0) -> dict:
    """The trainer's optimizer step: ``clip_grad_norm_`` + ``AdamW(fused=True).step()`` +
    ``zero_grad(set_to_none=False)`` vs ``NumbaAdamW.clip_step_zero``, on the tensors of a
    transformer. Each round times a copy probe, then both sides in alternating order, with fresh
    gradients copied in (untimed) before each; ratios are per round, figures are medians."""
    shapes = transformer_shapes(n_params)
    gen = torch.Generator().manual_seed(3)
    source = [torch.randn(s, generator=gen) for s in shapes]  # gradients; the clip is active (norm >> 1)

    def make():
        g = torch.Generator().manual_seed(4)
        params = [torch.nn.Parameter(torch.randn(s, generator=g) * 0.02) for s in shapes]
        for p, src in zip(params, source, strict=True):
            p.grad = src.clone()
        return params

    params_t, params_n = make(), make()
    opt_t = torch.optim.AdamW(params_t, lr=1e-3, weight_decay=0.01, fused=True)
    opt_n = numba_ops.NumbaAdamW(params_n, lr=1e-3, weight_decay=0.01)

    parts: dict[str, list[float]] = {"clip": [], "step": [], "zero_grad": []}

    def torch_step():
        t0 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params_t, max_norm)
        t1 = time.perf_counter()
        opt_t.step()
        t2 = time.perf_counter()
        opt_t.zero_grad(set_to_none=False)
        for name, span in zip(parts, (t1 - t0, t2 - t1, time.perf_counter() - t2), strict=True):
            parts[name].append(span)

    def refill(params):
        for p, src in zip(params, source, strict=True):
            p.grad.copy_(src)

    steps = {"torch": (torch_step, params_t), "numba": (lambda: opt_n.clip_step_zero(max_norm), params_n)}
    for name, (fn, params) in steps.items():
        refill(params)
        fn()  # warm-up: compiles, creates the state; one step each, so the states stay in step
    total = sum(p.numel() for p in params_t)
    out = {"params": total, "tensors": len(shapes), "max_norm": max_norm,
           "param_max_abs_diff_after_1_step": max((a - b).abs().max().item()
                                                  for a, b in zip(params_n, params_t, strict=True)),
           "grads_zeroed": all(bool((p.grad == 0).all()) for p in params_n)}
    n = 128 * 2**20  # 512 MiB per buffer, ~5x the L3 here
    src, dst = np.ones(n, np.float32), np.zeros(n, np.float32)  # pre-touched: no page faults timed
    _copy(src, dst)
    times: dict[str, list[float]] = {"torch": [], "numba": [], "copy": []}
    for r in range(rounds):
        gc.collect()
        start = time.perf_counter()
        _copy(src, dst)
        times["copy"].append(time.perf_counter() - start)
        for name in ("torch", "numba") if r % 2 == 0 else ("numba", "torch"):
            fn, params = steps[name]
            refill(params)
            gc.collect()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    # where torch's time goes (medians over the timed rounds; the warm-up call is dropped)
    out["torch_parts_s"] = {name: float(np.median(v[1:])) for name, v in parts.items()}
    ratios = [t / u for t, u in zip(times["torch"], times["numba"], strict=True)]
    med = {k: float(np.median(v)) for k, v in times.items()}
    copy_gbps = 3 * n * 4 / med["copy"] / 1e9  # read src, write-allocate dst, write dst
    # reads + writes of p, g, m, v per parameter. torch: norm reads g (4), the clip rewrites it (8),
    # the fused AdamW reads p g m v and writes p m v (28), zero_grad writes g (4); numba: the norm
    # reads g (4), the fused pass reads p g m v and writes p g m v (32)
    bytes_per_param = {"torch": 44, "numba": 36}
    # DRAM traffic adds a write-allocate read where a line is written without being read first:
    # only zero_grad's (4 for torch; every line numba writes was read in the same pass)
    traffic_per_param = {"torch": 48, "numba": 36}
    out.update({"rounds": rounds, "torch_s": med["torch"], "numba_s": med["numba"],
                "speedup_median": float(np.median(ratios)), "speedup_min": min(ratios), "speedup_max": max(ratios),
                "speedup_spread": max(ratios) - min(ratios), "copy_GBps": copy_gbps,
                "bytes_per_param": bytes_per_param, "traffic_per_param": traffic_per_param})
    for side in ("torch", "numba"):
        gbps = traffic_per_param[side] * total / med[side] / 1e9
        out[f"{side}_GBps"] = gbps
        out[f"{side}_copy_bw_fraction"] = gbps / copy_gbps
    out["pass_speed"] = out["speedup_median"] >= 1.2
    del src, dst
    return out


CASES = ("cross_entropy", "sequence_logprob", "adamw", "optimizer_step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run in seconds")
    parser.add_argument("--threads", type=int, default=2, help="threads for torch and numba alike")
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds per case (>= 5 for optimizer_step)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    args = parser.parse_args()
    selected = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(selected) - set(CASES))
    if unknown or not selected:
        parser.error(f"--cases: unknown {unknown or 'empty selection'}; choose from {','.join(CASES)}")
    torch.set_num_threads(args.threads)
    numba.set_num_threads(args.threads)
    n, v, adam_params = (512, 4096, 2_000_000) if args.quick else (4096, 32768, 50_000_000)
    print(f"threads={args.threads} load_avg={os.getloadavg()} cpus={os.cpu_count()}", flush=True)
    # the roofline is probed before every case and the best figure kept: on a shared machine a
    # single probe can land in a burst of someone else's load and make every fraction look high
    roof = {"copy_GBps": 0.0, "exp_G_per_s": 0.0}
    results = {"threads": args.threads, "quick": args.quick, "roofline": roof, "cases": selected,
               "load_avg_1m_start": os.getloadavg()[0]}
    cases = {"cross_entropy": lambda: bench_cross_entropy(n, v, args.repeats, roof),
             "sequence_logprob": lambda: bench_sequence_logprob(n, v, args.repeats, roof),
             "adamw": lambda: bench_adamw(adam_params, args.repeats, roof),
             "optimizer_step": lambda: bench_optimizer_step(adam_params, max(args.repeats, 5))}
    for name in selected:
        if name != "optimizer_step":  # that case measures its own copy bandwidth, round by round
            for key, value in roofline(args.threads, args.repeats, args.quick).items():
                roof[key] = max(roof[key], value)
        results[name] = cases[name]()
        print(name, json.dumps(results[name]), flush=True)
    print("roofline", json.dumps(roof), flush=True)
    results["load_avg_1m_end"] = os.getloadavg()[0]
    results["pass"] = all(results[k][f] for k in selected for f in results[k] if f.startswith("pass_"))
    print("RESULT " + json.dumps(results, sort_keys=True))

if __name__ == "__main__":
    main()
