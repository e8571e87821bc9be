"""Torch helpers shared by the trainers: building the model, batching, masks, log-probs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from training_assets.peft_manager import PeftManager, quantization_config
from training_assets.trainers.base import TrainConfig

IGNORE_INDEX = -100


def build_model(config: TrainConfig, vocab_size: int) -> Any:
    """A causal LM: ``config.base_model`` loaded, or a random-init ``PretrainSpec`` model (seeded)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs: dict[str, Any] = {"attn_implementation": config.attn_impl}
    if config.attn_impl == "flash_attention_2" and not torch.cuda.is_available():
        raise RuntimeError("attn_impl='flash_attention_2' needs a CUDA GPU with flash-attn; use 'sdpa' on CPU")
    if config.base_model is None:
        hf_config = AutoConfig.for_model(config.pretrain.model_type, **config.pretrain.config_kwargs(vocab_size))
        torch.manual_seed(config.seed)
        model = AutoModelForCausalLM.from_config(hf_config, **kwargs)
    else:
        if config.lora is not None and config.lora.quant_4bit:
            kwargs["quantization_config"] = quantization_config(config.lora)
        model = AutoModelForCausalLM.from_pretrained(config.base_model, **kwargs)
    model.config.use_cache = False
    if config.use_liger:
        apply_liger(model)
    if torch.cuda.is_available() and config.distributed == "none":
        model = model.to("cuda")
    return model


def apply_liger(model: Any) -> None:
    """Patch Liger's fused RMSNorm/SwiGLU/RoPE/CE kernels into the model (Triton: CUDA only)."""
    if not torch.cuda.is_available():
        raise RuntimeError("use_liger=True needs a CUDA GPU (Liger kernels are Triton); set use_liger=False on CPU")
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
    except ImportError as exc:
        raise RuntimeError("use_liger=True needs liger-kernel: pip install 'training-assets[gpu]'") from exc
    _apply_liger_kernel_to_instance(model=model)


def attach_lora(model: Any, config: TrainConfig) -> Any:
    if config.lora is None:
        return model
    return PeftManager(config.lora).wrap(model, gradient_checkpointing=config.gradient_checkpointing, seed=config.seed)


def device_of(model: Any) -> torch.device:
    return next(model.parameters()).device


def block_causal_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) bool mask: token i sees j iff j ≤ i and both are in the same document.

    Packed rows then behave as separate sequences under SDPA/eager attention; padding
    (doc id -1) attends only to itself so softmax rows stay finite.
    """
    T = doc_ids.shape[1]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool, device=doc_ids.device))
    same = (doc_ids[:, :, None] == doc_ids[:, None, :]) & (doc_ids[:, :, None] >= 0)
    return ((causal & same) | torch.eye(T, dtype=torch.bool, device=doc_ids.device))[:, None]


def pad_rows(rows: Sequence[Sequence[int]], value: int, length: int | None = None) -> torch.Tensor:
    length = length or max(len(r) for r in rows)
    out = torch.full((len(rows), length), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.as_tensor(list(r)[:length], dtype=torch.long)
    return out


def forward_logits(model: Any, batch: dict[str, Any]) -> torch.Tensor:
    """(B, T, V) logits for a batch with input_ids and either attention_mask or doc_ids/position_ids."""
    device = device_of(model)
    kwargs = {"input_ids": batch["input_ids"].to(device)}
    if "doc_ids" in batch:
        kwargs["attention_mask"] = block_causal_mask(batch["doc_ids"].to(device))
        kwargs["position_ids"] = batch["position_ids"].to(device)
    elif "attention_mask" in batch:
        kwargs["attention_mask"] = batch["attention_mask"].to(device)
    return model(**kwargs, use_cache=False).logits


def shifted_ce(model: Any, batch: dict[str, Any], backend: str) -> tuple[torch.Tensor, float]:
    """Mean next-token cross-entropy over tokens whose label ≠ -100; weight = that token count."""
    from training_assets.trainers import objectives

    logits = forward_logits(model, batch)  # (B, T, V)
    labels = batch["labels"].to(logits.device)[:, 1:]  # (B, T-1): token t predicts t+1
    logits = logits[:, :-1]
    n_targets = int((labels != IGNORE_INDEX).sum())
    if n_targets == 0:  # nothing to learn in this micro-batch: a zero that keeps the graph connected
        return logits.sum() * 0.0, 0.0
    V = logits.shape[-1]
    loss = objectives.cross_entropy(logits.reshape(-1, V).float(), labels.reshape(-1), backend=backend)
    return loss, float(n_targets)


def token_logps(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """(B, T-1) log p(x_{t+1} | x_≤t) from (B, T, V) logits."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def sequence_logps(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor,
                   backend: str) -> torch.Tensor:
    """(B,) Σ_t log p(x_{t+1}|x_≤t) over positions where ``loss_mask[t+1] = 1`` (the completion).

    The LM head and the log-softmax run only on the positions that predict a completion token
    (gathered per row into (B, C, V), C = longest completion), not on the whole (B, T, V): in
    preference data the prompt is most of every row. A DDP-wrapped model goes through its own
    forward (the gradient all-reduce hooks need it) and pays for the full logits.
    """
    from training_assets.trainers import objectives

    device = device_of(model)
    input_ids, attention_mask, loss_mask = input_ids.to(device), attention_mask.to(device), loss_mask.to(device)
    target = loss_mask[:, 1:].bool()  # (B, T-1): position t predicts token t+1
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    split = not hasattr(model, "module") and _plain_lm_head(causal_lm)
    if not split:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        return objectives.sequence_logprob(logits[:, :-1].float(), input_ids[:, 1:], target.float(), backend=backend)
    backbone = getattr(causal_lm, causal_lm.base_model_prefix)
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state  # (B, T, H)
    counts = target.sum(dim=1)  # (B,)
    C = max(int(counts.max()), 1)
    # completion positions first (stable: in order), then the rest; keep C per row
    order = torch.argsort((~target).to(torch.int8), dim=1, stable=True)[:, :C]  # (B, C)
    picked = hidden[:, :-1].gather(1, order.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))  # (B, C, H)
    logits = causal_lm.get_output_embeddings()(picked)  # (B, C, V)
    labels = input_ids[:, 1:].gather(1, order)  # (B, C)
    mask = (torch.arange(C, device=device)[None, :] < counts[:, None]).float()
    return objectives.sequence_logprob(logits.float(), labels, mask, backend=backend)


def _plain_lm_head(causal_lm: Any) -> bool:
    """True when logits are exactly ``lm_head(hidden)`` (no soft-capping or scaling in the forward)."""
    config = getattr(causal_lm, "config", None)
    if config is None or not hasattr(causal_lm, "base_model_prefix") or causal_lm.get_output_embeddings() is None:
        return False
    return all(getattr(config, k, None) in (None, 1.0) for k in ("final_logit_softcapping", "logit_scale", "logits_scaling"))


def save_final(model: Any, out_dir: Any) -> None:
    """HF dir, atomically: config.json + model.safetensors (full) or adapter_config.json + adapter_model.safetensors.

    Same weights and config give the same bytes (the checkpoint's data version hashes this dir).
    """
    from training_assets.storage import atomic_dir

    with atomic_dir(out_dir) as tmp:
        if hasattr(model, "peft_config"):
            PeftManager.save(model, tmp)
        else:
            model.save_pretrained(str(tmp), safe_serialization=True)
