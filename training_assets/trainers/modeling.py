"""Torch helpers shared by the trainers: building the model, batching, masks, log-probs.

Imports torch: the trainer modules import it inside the methods that run tensors, so planning
stays torch-free. transformers is imported by the functions that build or sample from a model.
"""

from __future__ import annotations

import inspect
import itertools
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from training_assets.peft_manager import PeftManager, quantization_config
from training_assets.trainers import objectives
from training_assets.trainers.config import TrainConfig

IGNORE_INDEX = -100


def build_model(config: TrainConfig, vocab_size: int) -> Any:
    """A causal LM: ``config.base_model`` loaded, or a random-init ``PretrainSpec`` model (seeded)."""
    from transformers import AutoConfig, AutoModelForCausalLM  # transformers: seconds to import, paid on first use

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
        try:
            model = AutoModelForCausalLM.from_pretrained(config.base_model, **kwargs)
        except OSError as exc:  # transformers' "not a local folder nor on the hub" / "couldn't connect", many lines
            raise RuntimeError(f"base_model={config.base_model!r} could not be loaded: {str(exc).splitlines()[0]}; "
                               "a base_model is a Hugging Face model folder or, where a hub is reachable, a hub id") from exc
    dtype = weight_dtype(config.weight_dtype)
    if dtype is not None and model.dtype != dtype:
        model = model.to(dtype)
    model.config.use_cache = False
    if config.use_liger:
        apply_liger(model)
    if torch.cuda.is_available() and config.distributed == "none":
        model = model.to("cuda")
    return model


def weight_dtype(choice: str) -> torch.dtype | None:
    """The dtype ``TrainConfig.weight_dtype`` asks for here; None keeps what was loaded (auto on a GPU)."""
    if choice == "bf16":
        return torch.bfloat16
    if choice == "fp32" or not torch.cuda.is_available():  # auto on CPU: fp32
        return torch.float32
    return None


def apply_liger(model: Any) -> None:
    """Patch Liger's fused RMSNorm/SwiGLU/RoPE/CE kernels into the model (Triton: CUDA only)."""
    if not torch.cuda.is_available():
        raise RuntimeError("use_liger=True needs a CUDA GPU (Liger kernels are Triton); set use_liger=False on CPU")
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance  # the gpu extra, optional
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
    """(len(rows), length) int64: each row's first ``length`` values, then ``value`` (length: the longest row).

    One flat copy and one masked scatter instead of a tensor per row: a collate pads a few
    dozen short rows every micro-batch (4.5x faster on DPO's 16 x ~130 tokens than row by row).
    """
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    length = int(length or lengths.max())
    kept = np.minimum(lengths, length)
    out = np.full((len(rows), length), value, dtype=np.int64)
    if any(isinstance(r, np.ndarray) for r in rows):
        flat = np.concatenate([np.asarray(r[:k], dtype=np.int64) for r, k in zip(rows, kept.tolist())])
    else:
        flat = np.fromiter(itertools.chain.from_iterable(r[:k] for r, k in zip(rows, kept.tolist())),
                           dtype=np.int64, count=int(kept.sum()))
    out[np.arange(length)[None, :] < kept[:, None]] = flat
    return torch.from_numpy(out)


def ones_mask(lengths: Sequence[int], length: int | None = None) -> torch.Tensor:
    """(len(lengths), length) int64 attention mask: 1 on each row's first ``lengths[i]`` positions."""
    n = torch.as_tensor(list(lengths), dtype=torch.long)
    return (torch.arange(length or int(n.max()))[None, :] < n[:, None]).long()


def pad_sequences(seqs: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """(input_ids, loss_mask) pairs as one right-padded batch: input_ids, attention_mask, loss_mask, each (B, T)."""
    ids = pad_rows([s[0] for s in seqs], pad_id)
    return {"input_ids": ids, "attention_mask": ones_mask([len(s[0]) for s in seqs], ids.shape[1]),
            "loss_mask": pad_rows([s[1] for s in seqs], 0)}


def _model_inputs(model: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    """input_ids with either attention_mask or the block mask and positions of packed doc_ids."""
    device = device_of(model)
    kwargs = {"input_ids": batch["input_ids"].to(device)}
    if "doc_ids" in batch:
        kwargs["attention_mask"] = block_causal_mask(batch["doc_ids"].to(device))
        kwargs["position_ids"] = batch["position_ids"].to(device)
    elif "attention_mask" in batch:
        kwargs["attention_mask"] = batch["attention_mask"].to(device)
    return kwargs


def labelled_ce(model: Any, inputs: dict[str, Any], targets: torch.Tensor, backend: str) -> tuple[torch.Tensor, float]:
    """Mean cross-entropy of the positions that have a target; weight = their count.

    ``targets[:, t]`` is the token position t must predict (-100: none). The LM head and the
    log-softmax run only on those positions, (N, V) instead of (B, T, V): in chat data the loss is
    on the assistant turns, a small part of each row (a tool-calling conversation's system turn alone
    is most of it), and the full logits were the largest tensor of a step (8 x 1,200 x 49,152 fp32:
    1.9 GB a copy for SmolLM2). A DDP-wrapped model, or one whose logits are not exactly
    ``lm_head(hidden)``, goes through its own forward and its full logits are cut afterwards.
    """
    targets = targets.to(device_of(model))
    picked = targets != IGNORE_INDEX  # (B, T)
    split = _split_head(model)
    # the backbone's hidden states (then the head on the picked positions), or the model's own full logits
    out = split[0](**inputs).last_hidden_state if split else model(**inputs).logits
    if not bool(picked.any()):  # nothing to learn in this micro-batch: a zero that keeps the graph connected
        return out.sum() * 0.0, 0.0
    logits = split[1](out[picked]) if split else out[picked]  # (N, V)
    return objectives.cross_entropy(logits.float(), targets[picked], backend=backend), float(logits.shape[0])


def shifted_ce(model: Any, batch: dict[str, Any], backend: str) -> tuple[torch.Tensor, float]:
    """Mean next-token cross-entropy over tokens whose label ≠ -100; weight = that token count."""
    labels = batch["labels"]
    # position t predicts token t + 1; the last position predicts nothing
    targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)], dim=1)
    return labelled_ce(model, {**_model_inputs(model, batch), "use_cache": False}, targets, backend)


def prefix_batch(rows: Sequence[dict[str, Any]], groups: Sequence[tuple[int, int]], row_group: Sequence[int],
                 pad_id: int) -> dict[str, Any]:
    """Tensors for ``shared_prefix_ce`` from ``sft.shared_prefixes``: each group's prefix, and each row's
    suffix (what follows its group's prefix; the whole row when it has none) with its positions and
    its labels already shifted (``suffix_labels[i, j]`` is the target of suffix position ``j``)."""
    starts = [groups[g][1] if g >= 0 else 0 for g in row_group]
    suffixes = [r["input_ids"][p:] for r, p in zip(rows, starts)]
    targets = [r["labels"][p + 1:] for r, p in zip(rows, starts)]
    width = max(map(len, suffixes))
    return {
        "prefix_ids": [torch.tensor(rows[rep]["input_ids"][:length], dtype=torch.long) for rep, length in groups],
        "row_group": torch.tensor(row_group, dtype=torch.long),
        "prefix_len": torch.tensor(starts, dtype=torch.long),
        "suffix_ids": pad_rows(suffixes, pad_id, width),
        "suffix_mask": ones_mask(list(map(len, suffixes)), width),
        "suffix_labels": pad_rows(targets, IGNORE_INDEX, width),
    }


# models whose first prefix forward returned a cache other than a plain DynamicCache: later steps go straight
# to the full rows (weak keys: a model's entry goes with it)
_FULL_ROWS_ONLY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _plain_dynamic_cache(cache: Any) -> bool:
    from transformers.cache_utils import DynamicCache, DynamicLayer  # transformers: seconds to import, paid on first use

    return type(cache) is DynamicCache and all(type(layer) is DynamicLayer for layer in cache.layers)


def shared_prefix_ce(model: Any, batch: dict[str, Any], backend: str) -> tuple[torch.Tensor, float]:
    """``shifted_ce`` with each shared prefix run once (``batch["shared"]``, from ``prefix_batch``).

    Each group's prefix runs alone (no padding computed); its per-layer keys and values are padded to
    the longest prefix, gathered per row and handed to the suffix forward as its cache, with an
    attention mask that hides each row's padded prefix slots and position ids that continue its own
    prefix. Models whose cache is not a plain ``DynamicCache`` (sliding windows, hybrid layers) take
    the full rows instead.
    """
    shared, device = batch["shared"], device_of(model)
    if _FULL_ROWS_ONLY.get(model, False):
        return shifted_ce(model, batch, backend)
    caches = []
    for prefix in shared["prefix_ids"]:
        out = model(input_ids=prefix[None].to(device), use_cache=True, logits_to_keep=1) \
            if _supports_logits_to_keep(model) else model(input_ids=prefix[None].to(device), use_cache=True)
        cache = out.cache if "cache" in out else out.past_key_values  # renamed in transformers 5.24
        if not _plain_dynamic_cache(cache):
            _FULL_ROWS_ONLY[model] = True  # one wasted prefix forward per model, not one per step
            return shifted_ce(model, batch, backend)
        caches.append(cache)
    width = max(len(p) for p in shared["prefix_ids"])
    gather = shared["row_group"].to(device).clamp(min=0)  # rows without a group take group 0's slots, masked below

    def per_row(tensors: list[torch.Tensor]) -> torch.Tensor:  # (1, H, P_g, D) each -> (B, H, width, D)
        return torch.cat([torch.nn.functional.pad(t, (0, 0, 0, width - t.shape[2])) for t in tensors])[gather]

    cache = caches[0]
    for layer in range(len(cache.layers)):
        keys = per_row([c.layers[layer].keys for c in caches])
        values = per_row([c.layers[layer].values for c in caches])
        cache.layers[layer].keys, cache.layers[layer].values = keys, values
    prefix_len = shared["prefix_len"].to(device)
    prefix_mask = (torch.arange(width, device=device)[None, :] < prefix_len[:, None]).long()  # 0 where no group
    suffix_ids, suffix_mask = shared["suffix_ids"].to(device), shared["suffix_mask"].to(device)
    positions = prefix_len[:, None] + torch.arange(suffix_ids.shape[1], device=device)[None, :]
    # transformers 5.24 renamed past_key_values to cache (the old name warns, then goes in 5.40)
    cache_arg = "cache" if "cache" in _forward_parameters(model) else "past_key_values"
    inputs = {"input_ids": suffix_ids, "attention_mask": torch.cat([prefix_mask, suffix_mask], dim=1),
              "position_ids": positions, "use_cache": True, cache_arg: cache}
    return labelled_ce(model, inputs, shared["suffix_labels"], backend)


def token_logps(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """(B, T-1) log p(x_{t+1} | x_≤t) from (B, T, V) logits."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def completion_logps(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                     start: int) -> torch.Tensor:
    """(B, T - start) log p(x_t | x_<t) for t ≥ ``start``: the completion tokens of left-padded prompts.

    The same values as ``token_logps(model(...).logits, input_ids)[:, start - 1:]``, but the LM head
    and the log-softmax run only on the T - start + 1 last positions (``logits_to_keep``; the
    prompt is most of a GRPO row), through the model's own forward (DDP and PEFT wrappers included).
    """
    device = device_of(model)
    input_ids = input_ids.to(device)
    kwargs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask.to(device),
                              "position_ids": position_ids.to(device), "use_cache": False}
    keep = input_ids.shape[1] - start + 1
    if _supports_logits_to_keep(model):
        logits = model(**kwargs, logits_to_keep=keep).logits  # (B, keep, V): positions start-1 .. T-1
    else:
        logits = model(**kwargs).logits[:, -keep:]
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, input_ids[:, start:].unsqueeze(-1)).squeeze(-1)


def _causal_lm(model: Any) -> Any:
    raw = getattr(model, "module", model)  # DDP
    return raw.get_base_model() if hasattr(raw, "get_base_model") else raw  # PEFT


def _forward_parameters(model: Any) -> Any:
    return inspect.signature(_causal_lm(model).forward).parameters


def _supports_logits_to_keep(model: Any) -> bool:
    return "logits_to_keep" in _forward_parameters(model)


# GenerationConfig fields that make ``generate`` add a logits processor or a stopping criterion
_PROCESSOR_FIELDS = ("repetition_penalty", "encoder_repetition_penalty", "no_repeat_ngram_size", "bad_words_ids",
                     "min_length", "min_new_tokens", "suppress_tokens", "begin_suppress_tokens", "forced_bos_token_id",
                     "forced_eos_token_id", "sequence_bias", "renormalize_logits", "typical_p", "epsilon_cutoff",
                     "eta_cutoff", "min_p", "exponential_decay_length_penalty", "guidance_scale", "watermarking_config",
                     "stop_strings", "max_time")


def plain_sampling(model: Any) -> bool:
    """True when ``generate(do_sample=True, top_k=0, top_p=1.0)`` adds nothing but the temperature for ``model``.

    A checkpoint's generation_config.json (e.g. an instruct model's repetition_penalty) would make
    ``generate`` reshape the distribution; such models keep ``generate`` (see :func:`sample_completions`).
    """
    from transformers import GenerationConfig  # transformers: seconds to import, paid on first use

    config = getattr(_causal_lm(model), "generation_config", None)
    if config is None:
        return True
    default = GenerationConfig()
    return all(getattr(config, f, None) == getattr(default, f, None) for f in _PROCESSOR_FIELDS)


def draw_token(logits: torch.Tensor, temperature: float, unfinished: torch.Tensor, eos_token_id: int | None,
               pad_token_id: int) -> torch.Tensor:
    """(N,) one sampling step as ``generate`` draws it: float32 scores ÷ temperature, softmax, one
    ``multinomial``; rows already ended get ``pad_token_id``, and ``unfinished`` (N,) bool is
    updated in place with this step's EOS."""
    scores = logits.float()
    if temperature != 1.0:
        scores = scores / temperature
    token = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
    if eos_token_id is not None:
        token = torch.where(unfinished, token, torch.full_like(token, pad_token_id))
        unfinished &= token != eos_token_id
    return token


def sample_completions(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                       temperature: float, eos_token_id: int | None, pad_token_id: int) -> torch.Tensor:
    """(N, ≤ max_new_tokens) tokens sampled after left-padded prompts: ``generate``'s draws, without its machinery.

    The same model calls (prefill keeping only the last position's logits, then one token per step
    over a ``DynamicCache``, position ids from the attention mask), the same float32 scores ÷
    temperature, softmax and one ``torch.multinomial`` draw per step, pad after EOS and a stop
    once every row has ended: token for token what ``model.generate(do_sample=True, top_k=0,
    top_p=1.0, ...)`` samples under the same RNG state (tests/trainers/test_rollouts.py checks
    it), minus ``generate``'s per-step config, processor and stopping-criteria overhead, which
    dominates a small model's decode. Run it under ``torch.inference_mode()``.
    """
    from transformers import DynamicCache  # transformers: seconds to import, paid on first use

    device = device_of(model)
    mask = attention_mask.to(device)
    position = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
    params = _forward_parameters(model)
    # transformers 5.24 renamed past_key_values to cache (the old name still works, with a warning)
    cache = {"cache" if "cache" in params else "past_key_values": DynamicCache(config=_causal_lm(model).config)}
    keep = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
    logits = model(input_ids=input_ids.to(device), attention_mask=mask, position_ids=position, use_cache=True,
                   **cache, **keep).logits
    position = position[:, -1:]
    unfinished = torch.ones(mask.shape[0], dtype=torch.bool, device=device)
    tokens = []
    for step in range(max_new_tokens):
        token = draw_token(logits[:, -1, :], temperature, unfinished, eos_token_id, pad_token_id)
        tokens.append(token)
        if step == max_new_tokens - 1 or not bool(unfinished.any()):
            break
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        position = position + 1
        logits = model(input_ids=token[:, None], attention_mask=mask, position_ids=position, use_cache=True,
                       **cache).logits
    return torch.stack(tokens, dim=1)


def sequence_logps(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor,
                   backend: str) -> torch.Tensor:
    """(B,) Σ_t log p(x_{t+1}|x_≤t) over positions where ``loss_mask[t+1] = 1`` (the completion).

    The LM head and the log-softmax run only on the positions that predict a completion token
    (gathered per row into (B, C, V), C = longest completion), not on the whole (B, T, V): in
    preference data the prompt is most of every row. A DDP-wrapped model goes through its own
    forward (the gradient all-reduce hooks need it) and pays for the full logits.
    """
    device = device_of(model)
    input_ids, attention_mask, loss_mask = input_ids.to(device), attention_mask.to(device), loss_mask.to(device)
    target = loss_mask[:, 1:].bool()  # (B, T-1): position t predicts token t+1
    split = _split_head(model)
    if not split:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        return objectives.sequence_logprob(logits[:, :-1].float(), input_ids[:, 1:], target.float(), backend=backend)
    backbone, head = split
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state  # (B, T, H)
    counts = target.sum(dim=1)  # (B,)
    C = max(int(counts.max()), 1)
    # completion positions first (stable: in order), then the rest; keep C per row
    order = torch.argsort((~target).to(torch.int8), dim=1, stable=True)[:, :C]  # (B, C)
    picked = hidden[:, :-1].gather(1, order.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))  # (B, C, H)
    logits = head(picked)  # (B, C, V)
    labels = input_ids[:, 1:].gather(1, order)  # (B, C)
    mask = (torch.arange(C, device=device)[None, :] < counts[:, None]).float()
    return objectives.sequence_logprob(logits.float(), labels, mask, backend=backend)


def _split_head(model: Any) -> tuple[Any, Any] | None:
    """(backbone, LM head) of ``model`` when its logits are exactly ``head(backbone(...))`` and it may be
    called in parts (PEFT unwrapped; not DDP, whose gradient all-reduce hooks need its own forward), else None."""
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    if hasattr(model, "module") or not _plain_lm_head(causal_lm):
        return None
    return getattr(causal_lm, causal_lm.base_model_prefix), causal_lm.get_output_embeddings()


def _plain_lm_head(causal_lm: Any) -> bool:
    """True when logits are exactly ``lm_head(hidden)`` (no soft-capping or scaling in the forward)."""
    config = getattr(causal_lm, "config", None)
    if config is None or not hasattr(causal_lm, "base_model_prefix") or causal_lm.get_output_embeddings() is None:
        return False
    return all(getattr(config, k, None) in (None, 1.0) for k in ("final_logit_softcapping", "logit_scale", "logits_scaling"))

