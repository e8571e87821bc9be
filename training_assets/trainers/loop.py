"""``run_loop``: the one training loop every trainer uses.

Per optimizer step: fetch ``grad_accum`` micro-batches, forward under autocast (bf16/fp16; fp16
adds a GradScaler), backward, clip the global grad norm, step the optimizer and the
transformers scheduler, log loss / tokens/s / ETA, checkpoint every ``save_steps``.

Loss normalisation: each micro-batch returns ``(mean loss, weight)`` where weight is what the
mean was taken over (loss tokens for CE, sequences for DPO). The step loss is
``Σ_i w_i·loss_i / Σ_i w_i`` over every micro-batch of the step on every process, so the
gradient does not depend on how the global batch is split over micro-batches or processes
(``grad_accum=2`` ≡ a batch twice as large; two processes ≡ one with the same global batch).

Data order is a function of ``(seed, epoch)`` only and the position is a micro-batch counter,
so resuming needs no replay: restore weights, optimizer, scheduler, scaler and RNG states and
continue at the saved position — on CPU the loss trajectory is bit-identical.
"""

from __future__ import annotations

import contextlib
import logging
import math
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from training_assets.trainers import checkpoints
from training_assets.trainers.config import TrainConfig

log = logging.getLogger("training_assets.trainers")

# (model, micro-batch) -> (mean loss tensor, weight the mean is over)
LossFn = Callable[[Any, dict[str, Any]], tuple[Any, float]]
# (indices into the examples, model) -> micro-batch dict with "n_tokens" and "weight"
CollateFn = Callable[[Sequence[int], Any], dict[str, Any]]
StepCallback = Callable[[int, dict[str, float]], None]
# (step, total steps, model, resumed) after every optimizer step, and once with resumed=True after a
# resume: the weights just changed
PolicyHook = Callable[[int, int, Any, bool], None]


@dataclass
class LoopResult:
    steps: int
    losses: list[float]
    final_loss: float
    tokens: int
    tokens_per_s: float
    wall_s: float
    peak_rss_mb: float
    peak_gpu_mb: float | None
    resumed_from: str | None
    last_checkpoint: str | None
    lrs: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def step_logger(log_fn: Callable[[str], None]) -> StepCallback:
    """A ``run_loop`` callback writing one line per logged step to ``log_fn`` (a Dagster or Pipes logger)."""

    def log_step(step: int, m: dict[str, float]) -> None:
        log_fn(f"step {step} loss {m['loss']:.4f} lr {m['lr']:.2e} {m['tokens_per_s']:.0f} tok/s eta {m['eta_s']:.0f}s")

    return log_step


def peak_rss_mb() -> float:
    """Peak resident set size of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class DataSchedule:
    """Which examples each micro-batch holds: a per-epoch permutation seeded by ``(seed, epoch)``.

    Global micro-batch ``g`` of an epoch covers ``perm[g·B·W : (g+1)·B·W]`` (B = batch_size,
    W = processes); process ``r`` takes rows ``[r·B, (r+1)·B)`` of it, so the ranks' rows are
    disjoint. With several processes the last partial micro-batch is dropped so every rank gets
    the same number of rows.

    Cost: the epoch's permutation is drawn once, when the schedule first enters that epoch, and
    kept (8 bytes per example); each micro-batch is then a slice, O(B). Any position — a resume
    — is reached directly, without replaying the micro-batches before it.
    """

    def __init__(self, n_examples: int, batch_size: int, seed: int, world_size: int = 1, rank: int = 0,
                 shuffle: bool = True) -> None:
        if n_examples <= 0:
            raise ValueError("DataSchedule: no examples to train on")
        if not 0 <= rank < world_size:
            raise ValueError(f"DataSchedule: rank {rank} is outside world_size {world_size}")
        self.n, self.batch_size, self.seed, self.world, self.rank, self.shuffle = n_examples, batch_size, seed, world_size, rank, shuffle
        global_batch = batch_size * world_size
        self.per_epoch = math.ceil(n_examples / global_batch) if world_size == 1 else n_examples // global_batch
        if self.per_epoch == 0:
            raise ValueError(f"{n_examples} examples cannot fill one global batch of {global_batch} over {world_size} processes")
        self._epoch, self._order = -1, np.arange(0)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The example order of ``epoch`` (drawn on first use, then cached until the next epoch)."""
        if epoch != self._epoch:
            self._order = (np.random.default_rng([self.seed, epoch]).permutation(self.n) if self.shuffle
                           else np.arange(self.n))
            self._epoch = epoch
        return self._order

    def indices(self, position: int) -> list[int]:
        epoch, g = divmod(position, self.per_epoch)
        start = g * self.batch_size * self.world + self.rank * self.batch_size
        return self.epoch_order(epoch)[start:start + self.batch_size].tolist()


def build_optimizer(params: list[Any], config: TrainConfig) -> Any:
    import torch  # torch: import-time stays torch-free

    if config.kernel_backend == "numba":
        from training_assets.trainers.numba_optim import NumbaAdamW  # Numba: ~1.3 s to import, only runs that ask pay

        return NumbaAdamW(params, lr=config.lr, betas=config.adam_betas, weight_decay=config.weight_decay)
    # fused: one kernel over all tensors (on CPU too), about memory bandwidth; same AdamW math
    return torch.optim.AdamW(params, lr=config.lr, betas=config.adam_betas, weight_decay=config.weight_decay, fused=True)


def clip_step_zero(optimizer: Any, params: list[Any], config: TrainConfig, accelerator: Any, scaler: Any) -> None:
    """Clip the global grad norm (``max_grad_norm`` <= 0: no clip), step, zero the gradients.

    ``kernel_backend="numba"`` on one process without a GradScaler: one fused call
    (``NumbaAdamW.clip_step_zero``: the norm pass, then clip + AdamW + zeroing in one pass; the
    gradients are zeroed in place). Otherwise torch's path: ``clip_grad_norm_`` (the
    accelerator's under multi-process), the (scaler's) step, ``zero_grad(set_to_none=True)``.
    """
    import torch  # torch: import-time stays torch-free

    if config.kernel_backend == "numba" and accelerator is None and scaler is None:
        optimizer.clip_step_zero(config.max_grad_norm if config.max_grad_norm > 0 else None)
        return
    if scaler is not None:
        scaler.unscale_(optimizer)
    if config.max_grad_norm > 0:
        if accelerator is not None:
            accelerator.clip_grad_norm_(params, config.max_grad_norm)
        else:
            torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _autocast(config: TrainConfig, device_type: str) -> contextlib.AbstractContextManager:
    import torch  # torch: import-time stays torch-free

    if config.precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if config.precision == "bf16" else torch.float16
    return torch.autocast(device_type=device_type, dtype=dtype)


def enable_activation_checkpointing(model: Any) -> None:
    """Recompute activations in backward, on every transformers release pyproject allows: the method
    is ``activation_checkpointing_enable`` from 5.18 (``gradient_checkpointing_enable`` deprecated) and
    ``gradient_checkpointing_enable`` only before (5.17 on the GPU image raised AttributeError).
    Non-reentrant checkpointing works with a frozen LoRA base."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ValueError(f"gradient_checkpointing=True: {type(model).__name__} has no activation checkpointing "
                         "(neither activation_checkpointing_enable nor gradient_checkpointing_enable); set it False")


def run_loop(model: Any, n_examples: int, collate: CollateFn, loss_fn: LossFn, config: TrainConfig, *,
             accelerator: Any = None, callbacks: Sequence[StepCallback] = (), planned_steps: int | None = None,
             shuffle: bool = True, on_policy_update: PolicyHook | None = None) -> LoopResult:
    """Train ``model`` in place; returns the loss trajectory and throughput.

    ``accelerator`` (an ``accelerate.Accelerator``) turns on multi-process training: the model is
    wrapped by ``accelerator.prepare`` (DDP/FSDP/DeepSpeed per its config) and each process takes
    its slice of every global micro-batch. ``on_policy_update`` runs on every rank after each
    optimizer step and once after a resume (GRPO with vLLM pushes the new adapter to the server);
    None costs nothing.
    """
    import torch  # torch: import-time stays torch-free

    threads = torch.get_num_threads()
    if config.torch_threads > 0:
        torch.set_num_threads(config.torch_threads)
    try:  # a run trained in a long-lived process (a Dagster run's) leaves its thread count as it found it
        return _run_loop(model, n_examples, collate, loss_fn, config, accelerator, callbacks, planned_steps, shuffle,
                         on_policy_update)
    finally:
        torch.set_num_threads(threads)


def _run_loop(model: Any, n_examples: int, collate: CollateFn, loss_fn: LossFn, config: TrainConfig, accelerator: Any,
              callbacks: Sequence[StepCallback], planned_steps: int | None, shuffle: bool,
              on_policy_update: PolicyHook | None) -> LoopResult:
    import torch  # torch: import-time stays torch-free
    from transformers import get_scheduler  # transformers: seconds to import, paid on first use

    torch.manual_seed(config.seed)
    world = accelerator.num_processes if accelerator is not None else 1
    rank = accelerator.process_index if accelerator is not None else 0
    is_main = rank == 0
    schedule = DataSchedule(n_examples, config.batch_size, config.seed, world, rank, shuffle)
    total_steps = planned_steps or (config.max_steps if config.max_steps > 0
                                    else math.ceil(schedule.per_epoch / config.grad_accum) * config.epochs)
    if config.gradient_checkpointing:
        enable_activation_checkpointing(model)
        if config.lora is not None:
            model.enable_input_require_grads()
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("model has no trainable parameters (all requires_grad=False)")
    optimizer = build_optimizer(params, config)
    if accelerator is not None:
        model, optimizer = accelerator.prepare(model, optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"]]  # FSDP2 swaps in sharded params
    raw_model = accelerator.unwrap_model(model) if accelerator is not None else model
    scheduler = get_scheduler(config.lr_scheduler, optimizer, num_warmup_steps=config.warmup_steps,
                              num_training_steps=total_steps)
    device_type = "cuda" if next(raw_model.parameters()).is_cuda else "cpu"
    scaler = torch.amp.GradScaler(device_type) if config.precision == "fp16" else None

    step, position, losses, resumed_from = 0, 0, [], None
    resume = checkpoints.resolve_resume(config.resume_from, config.output_dir)
    if resume is not None:
        restored = checkpoints.load_checkpoint(resume, raw_model, optimizer, scheduler, scaler, accelerator)
        step, position, losses = restored["step"], restored["data_position"], list(restored["losses"])
        resumed_from = str(resume)
        log.info("resumed from %s at step %d (data position %d)", resume, step, position)
        if on_policy_update is not None:
            on_policy_update(step, total_steps, model, True)

    model.train()
    t0 = time.perf_counter()
    tokens = 0
    lrs: list[float] = []
    pending: list[Any] = []  # this process's step losses (device tensors) not yet read back to the host
    last_checkpoint = None

    def flush() -> None:
        """Read the pending step losses back in one transfer (one all-reduce with several processes)."""
        if not pending:
            return
        stacked = torch.stack(pending)
        if accelerator is not None and world > 1:
            stacked = accelerator.reduce(stacked, reduction="sum")
        first = step - len(pending) + 1
        pending.clear()
        for i, value in enumerate(stacked.tolist()):
            if not math.isfinite(value):
                raise FloatingPointError(f"loss became {value} at step {first + i}; lower lr (now {config.lr}) "
                                         "or use fp32/bf16")
            losses.append(value)

    while step < total_steps:
        micro = []
        for _ in range(config.grad_accum):
            micro.append(collate(schedule.indices(position), raw_model))
            position += 1
        weight_total = torch.tensor(float(sum(b["weight"] for b in micro)))
        if accelerator is not None and world > 1:
            weight_total = accelerator.reduce(weight_total, reduction="sum")
        total = max(weight_total.item(), 1e-12)  # one host read per step, not two per micro-batch
        step_loss = None
        for i, batch in enumerate(micro):
            sync = i == len(micro) - 1 or accelerator is None
            ctx = accelerator.no_sync(model) if not sync else contextlib.nullcontext()
            with ctx:
                with _autocast(config, device_type):
                    loss, weight = loss_fn(model, batch)
                # DDP averages gradients over processes; scale by world so the sum matches one process.
                scaled = loss.float() * (weight / total) * world
                if scaler is not None:
                    scaled = scaler.scale(scaled)
                if accelerator is not None:
                    accelerator.backward(scaled)
                else:
                    scaled.backward()
            if step_loss is None:
                step_loss = torch.zeros((), device=loss.device)
            step_loss += loss.detach().float() * weight / total
            tokens += int(batch["n_tokens"])
        clip_step_zero(optimizer, params, config, accelerator, scaler)
        lrs.append(scheduler.get_last_lr()[0])
        scheduler.step()
        step += 1
        if on_policy_update is not None:
            on_policy_update(step, total_steps, model, False)
        pending.append(step_loss)
        saving = config.save_steps > 0 and step % config.save_steps == 0 and step < total_steps
        if step % config.log_steps == 0 or step == total_steps or saving:
            flush()  # the only host syncs of the step loss: every log_steps, before a checkpoint, at the end
        if is_main and (step % config.log_steps == 0 or step == total_steps):
            elapsed = time.perf_counter() - t0
            metrics = {"loss": losses[-1], "lr": lrs[-1], "tokens_per_s": tokens * world / max(elapsed, 1e-9),
                       "eta_s": elapsed / max(len(lrs), 1) * (total_steps - step)}
            log.info("step %d/%d loss %.4f lr %.2e %.0f tok/s eta %.0fs", step, total_steps, metrics["loss"], metrics["lr"],
                     metrics["tokens_per_s"], metrics["eta_s"])
            for callback in callbacks:
                callback(step, metrics)
        if saving:
            last_checkpoint = _save(accelerator, is_main, config, step, raw_model, optimizer, scheduler, scaler, position, losses)
    wall = time.perf_counter() - t0
    if config.save_steps > 0 or config.resume_from is not None:
        last_checkpoint = _save(accelerator, is_main, config, step, raw_model, optimizer, scheduler, scaler, position, losses)
    peak_gpu = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    return LoopResult(steps=step, losses=losses, final_loss=losses[-1] if losses else float("nan"), tokens=tokens * world,
                      tokens_per_s=tokens * world / max(wall, 1e-9), wall_s=wall, peak_rss_mb=peak_rss_mb(),
                      peak_gpu_mb=peak_gpu, resumed_from=resumed_from, last_checkpoint=last_checkpoint, lrs=lrs)


def _save(accelerator: Any, is_main: bool, config: TrainConfig, step: int, model: Any, optimizer: Any, scheduler: Any,
          scaler: Any, position: int, losses: list[float]) -> str | None:
    """Every rank calls it: gathering sharded (FSDP / ZeRO-3) state is a collective; rank 0 writes."""
    path = checkpoints.save_checkpoint(config.output_dir, step, model, optimizer, scheduler, scaler, position, losses,
                                       config.to_dict(), config.save_total_limit, accelerator=accelerator)
    return str(path) if is_main else None
