"""Full model and optimizer state across process layouts: one process, DDP, FSDP (1 and 2), DeepSpeed ZeRO-3.

A checkpoint is written by rank 0 from *full* (unsharded) state, so it loads in plain
transformers / PEFT whatever trained it. Gathering that state is a collective: **every rank calls
these functions**, rank 0 gets the tensors, the other ranks get ``None``.

* ``replicated`` (one process, or DDP: every rank holds the whole model and the same optimizer
  state): rank 0 reads its own copy, no communication.
* ``fsdp`` (any parameter is a ``DTensor`` — FSDP2 ``fully_shard`` — or the model holds an FSDP1
  wrapper): ``torch.distributed.checkpoint.state_dict`` with ``full_state_dict=True,
  cpu_offload=True`` all-gathers the shards to rank 0's CPU; restoring uses
  ``broadcast_from_rank0=True``, so only rank 0 reads the files and every rank keeps its shard.
  The same calls Accelerate's own ``get_state_dict`` / ``save_state`` make for FSDP2.
* ``deepspeed`` (Accelerate's ``DistributedType.DEEPSPEED``): weights through
  ``accelerator.get_state_dict`` (ZeRO-3 consolidates 16-bit weights on rank 0; needs
  ``zero3_save_16bit_model``, which ``launch.deepspeed_zero3_config`` sets); the fp32 master
  weights and optimizer partitions stay in DeepSpeed's own per-rank checkpoint
  (``engine.save_checkpoint``), which resume loads back (``engine.load_checkpoint``).

Names are the model's own fully qualified names with wrapper prefixes removed (DDP's
``module.``, FSDP1's ``_fsdp_wrapped_module.``, activation checkpointing's
``_checkpoint_wrapped_module.``), i.e. what ``model.state_dict()`` gives on one process.
"""

from __future__ import annotations

from typing import Any, Literal

Layout = Literal["replicated", "fsdp", "deepspeed"]
WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def rank_and_world() -> tuple[int, int]:
    import torch.distributed as dist  # torch: import-time stays torch-free

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def barrier() -> None:
    import torch.distributed as dist  # torch: import-time stays torch-free

    if rank_and_world()[1] > 1:
        dist.barrier()


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (small picklable values between our own processes)."""
    import torch.distributed as dist  # torch: import-time stays torch-free

    if rank_and_world()[1] == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    import torch.distributed as dist  # torch: import-time stays torch-free

    world = rank_and_world()[1]
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


def layout(model: Any, accelerator: Any = None) -> Layout:
    if accelerator is not None and str(getattr(accelerator, "distributed_type", "")).endswith("DEEPSPEED"):
        return "deepspeed"
    from torch.distributed.tensor import DTensor  # torch: import-time stays torch-free

    if any(isinstance(p, DTensor) for p in model.parameters()):
        return "fsdp"
    from torch.distributed.fsdp import FullyShardedDataParallel  # torch: import-time stays torch-free

    if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        return "fsdp"
    return "replicated"


def unwrap(model: Any) -> Any:
    """The user's module under a DDP / DeepSpeed engine wrapper (FSDP wraps in place: unchanged)."""
    while hasattr(model, "module") and type(model).__name__ in ("DistributedDataParallel", "DeepSpeedEngine"):
        model = model.module
    return model


def clean_name(name: str) -> str:
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def trainable_names(model: Any) -> list[str]:
    return [clean_name(n) for n, p in unwrap(model).named_parameters() if p.requires_grad]


def alias_names(model: Any) -> set[str]:
    """State-dict names that share a tensor with an earlier name (tied LM head): left out of files."""
    seen: set[int] = set()
    aliases = set()
    for name, tensor in unwrap(model).state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            aliases.add(clean_name(name))
        seen.add(id(tensor))
    return aliases


def _options(**kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions  # torch: import-time stays torch-free

    return StateDictOptions(full_state_dict=True, **kwargs)


def full_model_state(model: Any, accelerator: Any = None) -> dict[str, Any] | None:
    """Every weight (a PEFT model: its trainable ones), unsharded, on rank 0's CPU; ``None`` on the other ranks.

    Collective under FSDP / DeepSpeed (which gather the whole model before the adapter is picked).
    """
    rank, _ = rank_and_world()
    kind = layout(model, accelerator)
    if kind == "deepspeed":
        state = accelerator.get_state_dict(deepspeed_engine(accelerator))  # ZeRO-3: 16-bit weights on rank 0
    elif kind == "fsdp":
        from torch.distributed.checkpoint.state_dict import get_model_state_dict  # torch: import-time stays torch-free

        state = get_model_state_dict(model, options=_options(cpu_offload=True))
    else:
        state = unwrap(model).state_dict() if rank == 0 else None
    if rank != 0:
        return None
    skip = alias_names(model)
    if hasattr(unwrap(model), "peft_config"):  # an adapter saves only its trainable factors: copy no frozen base
        keep = set(trainable_names(model))
        skip |= {clean_name(k) for k in state if clean_name(k) not in keep}
    return {clean_name(k): v.detach().contiguous().cpu() for k, v in state.items() if clean_name(k) not in skip}


def full_optimizer_state(model: Any, optimizer: Any, accelerator: Any = None) -> dict[str, Any] | None:
    """The optimizer state dict on rank 0 (FSDP: gathered, keyed by parameter name); ``None`` elsewhere.

    DeepSpeed keeps its optimizer in its own checkpoint (``deepspeed_save``): ``{}`` here.
    """
    rank, _ = rank_and_world()
    kind = layout(model, accelerator)
    if kind == "deepspeed":
        return {} if rank == 0 else None
    if kind == "fsdp":
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict  # torch: import-time stays torch-free

        state = get_optimizer_state_dict(model, _torch_optimizer(optimizer), options=_options(cpu_offload=True))
        return state if rank == 0 else None
    return optimizer.state_dict() if rank == 0 else None


def load_model_state(model: Any, tensors: dict[str, Any] | None, accelerator: Any = None) -> None:
    """Copy ``tensors`` (rank 0's; other ranks may pass ``None`` under FSDP) into the model. Collective under FSDP."""
    import torch  # torch: import-time stays torch-free

    kind = layout(model, accelerator)
    if kind == "deepspeed":
        return  # restored with the optimizer from DeepSpeed's own checkpoint (deepspeed_load)
    if kind == "fsdp":
        from torch.distributed.checkpoint.state_dict import set_model_state_dict  # torch: import-time stays torch-free

        set_model_state_dict(model, tensors or {}, options=_options(broadcast_from_rank0=True, strict=False))
        return
    params = {clean_name(n): p for n, p in unwrap(model).named_parameters()}
    with torch.no_grad():
        for name, value in (tensors or {}).items():
            params[name].copy_(value)


def load_optimizer_state(model: Any, optimizer: Any, state: dict[str, Any] | None, accelerator: Any = None) -> None:
    kind = layout(model, accelerator)
    if kind == "deepspeed":
        return
    if kind == "fsdp":
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict  # torch: import-time stays torch-free

        set_optimizer_state_dict(model, _torch_optimizer(optimizer), state or {},
                                 options=_options(broadcast_from_rank0=True))
        return
    optimizer.load_state_dict(state)


def deepspeed_engine(accelerator: Any) -> Any:
    """The ``DeepSpeedEngine`` Accelerate built in ``prepare`` (the trainers hold the bare module)."""
    wrapped = getattr(accelerator, "deepspeed_engine_wrapped", None)
    if wrapped is None:
        raise RuntimeError("distributed='deepspeed' but the Accelerator has no DeepSpeed engine: was the model "
                           "passed through accelerator.prepare?")
    return wrapped.engine


def deepspeed_save(accelerator: Any, folder: Any) -> None:
    """Every rank writes its ZeRO partition (fp32 masters + optimizer) under ``folder`` (DeepSpeed's format)."""
    deepspeed_engine(accelerator).save_checkpoint(str(folder), tag="zero", save_latest=False)


def deepspeed_load(accelerator: Any, folder: Any) -> None:
    """Every rank loads its partition back (DeepSpeed reads its own files, written by this run)."""
    path, _ = deepspeed_engine(accelerator).load_checkpoint(str(folder), tag="zero", load_optimizer_states=True,
                                                            load_lr_scheduler_states=False)
    if path is None:
        raise RuntimeError(f"DeepSpeed found no checkpoint to load under {folder}")


def _torch_optimizer(optimizer: Any) -> Any:
    """The torch optimizer under Accelerate's ``AcceleratedOptimizer`` wrapper."""
    return getattr(optimizer, "optimizer", optimizer)
