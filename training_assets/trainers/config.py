"""The training run's configuration: ``TrainConfig`` with the ``PretrainSpec``, ``DpoSpec``, ``KtoSpec``, ``OrpoSpec`` and
``GrpoSpec`` it nests.

    TrainConfig(base_model="data/sft_checkpoint/runs/<id>/final", max_steps=100, lr=5e-5,
                lora=LoraSpec(r=16, alpha=32), dpo=DpoSpec(beta=0.1, loss_type="ipo"))

Pydantic models, frozen and closed (an unknown or misspelt field is an error, not ignored). Every
field carries its help text; choice fields are ``Literal`` types, so the Dagster run configs built
from these specs (``defs/training/config.py``) offer exactly these choices in the launchpad and
reject a typo before launch. Defaults reproduce the seed's original behaviour: single-process
fp32 AdamW at a constant learning rate. Nothing here imports torch (but to check kernel_backend="numba" against a GPU).
"""

from __future__ import annotations

import importlib.util

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from training_assets.peft_manager import LoraSpec

Precision = Literal["fp32", "fp16", "bf16"]
Distributed = Literal["none", "ddp", "fsdp", "deepspeed"]
KernelBackend = Literal["torch", "numba"]
Tracker = Literal["none", "mlflow", "wandb"]
AttnImpl = Literal["eager", "sdpa", "flash_attention_2"]
WeightDtype = Literal["auto", "bf16", "fp32"]
# transformers.get_scheduler names this loop drives (reduce_lr_on_plateau needs a metric: not offered)
LrScheduler = Literal["constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial",
                      "inverse_sqrt"]
Rollout = Literal["local", "vllm", "dataset", "mixed"]
SamplerName = Literal["lean", "transformers"]
DpoLossType = Literal["sigmoid", "ipo", "hinge"]
GrpoLossType = Literal["grpo", "bnpo", "dr_grpo", "dapo", "la_grpo"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")
# Bounds on a run's length. 10**7 optimizer steps is ~20x a frontier pretraining run (Llama 2 70B:
# ~500k steps); a larger value is a typo or a runaway request that would hold the one training slot
# for years (max_steps=10**15 planned an ETA of 5.9e14 s). 10**4 passes over the same data only
# memorise it. The time a run may take is bounded apart: trainers.run_guards, at execute.
MAX_STEPS = 10**7
MAX_EPOCHS = 10**4


class PretrainSpec(BaseModel):
    """A random-init decoder (Llama / Qwen2 style) built with ``AutoConfig.for_model`` → ``from_config``.

    Defaults are a ~0.3M-parameter toy that trains in seconds on 2 CPU cores.
    """

    model_config = _FROZEN

    model_type: str = Field("qwen2", description="AutoConfig model type: qwen2 or llama (any decoder with these fields).")
    hidden_size: int = Field(64, gt=0, description="Width of the residual stream.")
    num_hidden_layers: int = Field(2, gt=0, description="Decoder layers.")
    num_attention_heads: int = Field(4, gt=0, description="Query heads.")
    num_key_value_heads: int = Field(2, gt=0, description="Key/value heads (grouped-query attention): divides the query heads.")
    intermediate_size: int = Field(128, gt=0, description="SwiGLU MLP width.")
    max_position_embeddings: int = Field(512, gt=0, description="Longest sequence the rotary embedding is set up for.")
    vocab_size: int | None = Field(None, description="None = the tokenizer's length.")
    tie_word_embeddings: bool = Field(True, description="Share the input embedding with the LM head.")
    rope_theta: float = Field(10000.0, gt=0, description="Rotary embedding base.")

    @model_validator(mode="after")
    def _heads_divide(self) -> PretrainSpec:
        if self.hidden_size % self.num_attention_heads or self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"PretrainSpec: num_attention_heads ({self.num_attention_heads}) must divide hidden_size "
                             f"({self.hidden_size}) and num_key_value_heads ({self.num_key_value_heads}) must divide it")
        return self

    def config_kwargs(self, vocab_size: int) -> dict[str, Any]:
        kw = self.model_dump(exclude={"model_type", "vocab_size", "rope_theta"})
        kw["vocab_size"] = self.vocab_size or vocab_size
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": self.rope_theta}
        return kw

    def n_params(self, vocab_size: int) -> int:
        """Parameter count of the decoder (embeddings, attention with GQA, SwiGLU MLP, RMSNorms)."""
        h, v = self.hidden_size, self.vocab_size or vocab_size
        head = h // self.num_attention_heads
        kv = self.num_key_value_heads * head
        attn = h * h + 2 * h * kv + h * h + (h + 2 * kv if self.model_type == "qwen2" else 0)  # qwen2 has qkv bias
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + 2 * h
        embed = v * h * (1 if self.tie_word_embeddings else 2)
        return embed + self.num_hidden_layers * per_layer + h


class DpoSpec(BaseModel):
    """Direct Preference Optimisation (Rafailov et al. 2023, arXiv:2305.18290)."""

    model_config = _FROZEN

    beta: float = Field(0.1, gt=0, description="Inverse temperature on the policy/reference log-ratio margin.")
    loss_type: DpoLossType = Field("sigmoid", description="sigmoid (DPO), ipo (Azar et al. 2023) or hinge (SLiC).")
    label_smoothing: float = Field(0.0, ge=0.0, lt=0.5, description=(
        "cDPO: the assumed probability that a preference label is flipped (sigmoid loss only)."))
    precompute_ref_logps: bool = Field(True, description=(
        "Compute the reference log-probs once before training (no second model in memory); "
        "otherwise the reference runs every step."))


class KtoSpec(BaseModel):
    """Kahneman-Tversky Optimisation (Ethayarajh et al. 2024, arXiv:2402.01306) on unpaired labelled examples."""

    model_config = _FROZEN

    beta: float = Field(0.1, gt=0, description="Inverse temperature on the policy/reference log-ratio against the KL reference point.")
    desirable_weight: float = Field(1.0, ge=0, description=(
        "Loss weight of desirable (successful) examples; the paper keeps desirable_weight * n_desirable / "
        "(undesirable_weight * n_undesirable) in [1, 4/3]."))
    undesirable_weight: float = Field(1.0, ge=0, description="Loss weight of undesirable (failed) examples.")
    precompute_ref_logps: bool = Field(True, description=(
        "Compute the reference log-probs (of each example and of its mismatched KL pair) once before training "
        "(no second model in memory); otherwise the reference runs every step."))


class OrpoSpec(BaseModel):
    """Odds Ratio Preference Optimisation (Hong et al. 2024, arXiv:2403.07691): SFT on the chosen plus an odds-ratio term."""

    model_config = _FROZEN

    beta: float = Field(0.1, gt=0, description=(
        "The paper's lambda: weight of the odds-ratio term -log sigma(log odds(chosen) - log odds(rejected)) "
        "against the chosen NLL (TRL's ORPOConfig.beta)."))


class VllmSpec(BaseModel):
    """The vLLM server that samples GRPO's rollouts (``GrpoSpec.rollout="vllm"``) and how it is reached.

    The policy's LoRA adapter is synced to it every ``sync_steps`` (``trainers/policy_sync.py``);
    requests go through ``vllm_client.VllmClient`` (API key, allow-list, retries).
    """

    model_config = _FROZEN

    base_url: str | None = Field(None, description=(
        "OpenAI-compatible vLLM server, e.g. http://host:8000. Loopback only unless the operator lists it in "
        "$TRAINING_ASSETS_DEPLOY_ALLOWED_URLS (the run config names it, and it receives the API key)."))
    model: str | None = Field(None, description=(
        "The base model name the server serves (its --served-model-name); the policy's LoRA adapter is loaded "
        "on top of it at runtime."))
    api_key_env: str = Field("VLLM_API_KEY", min_length=1, description=(
        "Name of the environment variable holding the server's API key (sent as a Bearer token; the key "
        "itself never goes into a config). Unset or empty: no Authorization header."))
    adapter_dir: str | None = Field(None, description=(
        "Where the synced adapters are written (<run>-v<step>/); the vLLM server must read this path. "
        "None: <output_dir>/vllm_adapters."))
    sync_steps: int = Field(1, gt=0, description=(
        "Load the policy's adapter into vLLM every N optimizer steps (rollouts in between sample a policy up to "
        "N-1 steps old; the sampler's log-probs keep the importance ratio right)."))
    max_attempts: int = Field(5, gt=0, description="Tries per vLLM request (429, 5xx, connection errors retried).")
    backoff_s: float = Field(0.5, ge=0, description="Wait before the first retry; doubled each retry, plus up to 50% jitter.")
    max_backoff_s: float = Field(8.0, ge=0, description="Cap on one retry wait (before jitter).")
    timeout_s: float = Field(120.0, gt=0, description="Seconds one vLLM request may take.")


class GrpoSpec(BaseModel):
    """Group Relative Policy Optimisation (Shao et al. 2024, arXiv:2402.03300); rollout sources in trainers/grpo.py,
    the samplers in trainers/rollouts.py."""

    model_config = _FROZEN

    rollout: Rollout = Field("local", description=(
        "Where each group's rollouts come from. local: the policy's own samples; vllm: the policy's samples from "
        "the vLLM server of `vllm`; dataset: the logged attempts of each grpo_groups row with their stored "
        "advantages; mixed: the logged attempts (stored rewards) plus num_generations local samples in one group, "
        "advantages over the whole group (LUFFY, arXiv:2504.14945)."))
    vllm: VllmSpec | None = Field(None, description=(
        "rollout=vllm: the vLLM server that samples the rollouts (base_url, model, key, retries, sync_steps); "
        "None for the other rollouts."))
    sampler: SamplerName = Field("lean", description=(
        "How local rollouts are decoded: lean (trainers/decoding.py: the policy's own weights with fused matmuls and "
        "a preallocated KV cache, ~1.7x faster per rollout on small models; Llama/Qwen2/Mistral layouts, otherwise "
        "transformers with the reason in the result) or transformers (generate's draws, token for token)."))
    num_generations: int = Field(4, gt=0, description="Completions sampled per prompt (the group size of local/vllm rollouts).")
    max_new_tokens: int = Field(32, gt=0, description="Generated tokens per sampled completion.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the rollouts.")
    epsilon_low: float = Field(0.2, ge=0, description="Clip range below 1 for the importance ratio.")
    epsilon_high: float = Field(0.2, ge=0, description="Clip range above 1 (DAPO's clip-higher uses e.g. 0.28).")
    kl_beta: float = Field(0.0, ge=0, description="Weight of the k3 KL to the reference policy (0: no reference forward).")
    loss_type: GrpoLossType = Field("dapo", description=(
        "Token aggregation: grpo (per-sequence mean), bnpo, dr_grpo, dapo (token-level), or la_grpo "
        "(Local-Advantage GRPO: only tokens from each group's first divergence on carry the advantage)."))
    reward_weights: dict[str, float] | None = Field(None, description=(
        "Reward components -> weights for sampled completions (None: answer, tool_json, efficiency, length)."))

    @model_validator(mode="after")
    def _vllm_matches_rollout(self) -> GrpoSpec:
        if self.rollout != "vllm":
            if self.vllm is not None:  # a server named but never asked: the user meant rollout="vllm"
                raise ValueError(f"GrpoSpec: vllm is set but rollout={self.rollout!r} does not sample from it; set "
                                 "rollout='vllm' or drop vllm")
            return self
        if self.vllm is None or not self.vllm.base_url:
            raise ValueError("GrpoSpec: rollout='vllm' needs vllm.base_url (vllm=VllmSpec(base_url='http://host:8000', "
                             "model=<the server's --served-model-name>))")
        if not self.vllm.model:
            raise ValueError("GrpoSpec: rollout='vllm' needs vllm.model, the base model name the server serves "
                             "(its --served-model-name)")
        return self


class TrainConfig(BaseModel):
    """Everything a training run needs. Defaults: plain single-process fp32 AdamW at a constant learning rate."""

    model_config = _FROZEN

    base_model: str | None = Field(None, description="HF model dir to start from; None = random init from `pretrain`.")
    tokenizer: str | None = Field(None, description="HF tokenizer dir; None = the base_model dir (or an injected tokenizer).")
    output_dir: str = Field("checkpoints/run", description="Periodic checkpoints (checkpoint-<step>/) and the final model (final/).")
    epochs: int = Field(1, ge=0, le=MAX_EPOCHS, description=(
        f"Passes over the data (ignored when max_steps > 0); at most {MAX_EPOCHS}: more passes over the same data "
        "only memorise it."))
    max_steps: int = Field(-1, le=MAX_STEPS, description=(
        f"Optimizer steps; > 0 overrides epochs. At most {MAX_STEPS:,} (~20x a frontier pretraining run): a larger "
        "value is a typo that would hold the training slot for years."))
    batch_size: int = Field(8, gt=0, description="Examples per micro-batch per process (GRPO: prompts per micro-batch).")
    lr: float = Field(2e-4, gt=0, description="Peak learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled (AdamW) weight decay.")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW moment decay rates.")
    max_seq_len: int = Field(512, gt=0, description="Longer examples are truncated (from the right).")
    precision: Precision = Field("fp32", description="fp32, bf16 (autocast) or fp16 (autocast + GradScaler).")
    weight_dtype: WeightDtype = Field("auto", description=(
        "dtype the model's weights are held in (random init included). auto: the checkpoint's own dtype on a GPU, "
        "fp32 on CPU (CPUs without bf16 matrix units run bf16 matmuls many times slower; a bf16 checkpoint, "
        "SmolLM2's, trained 3 SFT steps in minutes instead of seconds); bf16 or fp32: that dtype everywhere."))
    grad_accum: int = Field(1, gt=0, description="Micro-batches per optimizer step.")
    max_grad_norm: float = Field(1.0, description="Global L2 gradient clip; <= 0 disables clipping.")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps (schedulers other than constant).")
    lr_scheduler: LrScheduler = Field("constant", description="transformers.get_scheduler schedule after the warm-up.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward (memory for compute).")
    attn_impl: AttnImpl = Field("sdpa", description="Attention kernel passed to from_pretrained/from_config (flash_attention_2: CUDA).")
    use_liger: bool = Field(False, description="Liger fused Triton kernels (CUDA, liger-kernel installed); an error otherwise.")
    packing: bool = Field(False, description="SFT: pack several examples per row with per-document position ids.")
    share_prefixes: bool = Field(True, description=(
        "SFT, unpacked: a prefix rows of a micro-batch share (a system turn with its tools) is computed once per "
        "micro-batch and its keys/values reused by each row: the same loss and gradients, fewer tokens computed. "
        "One process only (distributed='none'), without gradient checkpointing."))
    save_steps: int = Field(0, ge=0, description="Checkpoint every N optimizer steps; 0 = only at the end.")
    save_total_limit: int = Field(2, description="Keep this many newest checkpoint-<step>/ dirs; <= 0 keeps all.")
    resume_from: str | None = Field(None, description='None, "auto" (newest checkpoint in output_dir, if any) or a checkpoint dir.')
    distributed: Distributed = Field("none", description=(
        "none, ddp, fsdp or deepspeed: one process per device, started by a launcher (launch.build_launch_command)."))
    tracker: Tracker = Field("none", description="Experiment tracking: none, mlflow or wandb (offline without an API key).")
    tracking_uri: str | None = Field(None, description="MLflow URI; None = $MLFLOW_TRACKING_URI or a SQLite store.")
    run_name: str | None = Field(None, description="Tracker run name.")
    tracker_tags: dict[str, str] | None = Field(None, description="Extra tags on the tracker run (e.g. the Dagster run id).")
    lora: LoraSpec | None = Field(None, description="Train a LoRA adapter instead of all weights.")
    pretrain: PretrainSpec = Field(default_factory=PretrainSpec, description="Architecture when base_model is None.")
    dpo: DpoSpec = Field(default_factory=DpoSpec, description="DPO options.")
    kto: KtoSpec = Field(default_factory=KtoSpec, description="KTO options.")
    orpo: OrpoSpec = Field(default_factory=OrpoSpec, description="ORPO options.")
    grpo: GrpoSpec = Field(default_factory=GrpoSpec, description="GRPO options.")
    seed: int = Field(0, description="Seeds init, data order (per epoch) and dropout/sampling RNGs.")
    torch_threads: int = Field(0, ge=0, description="Intra-op CPU threads; 0 = torch's default (one per core).")
    kernel_backend: KernelBackend = Field("torch", description="Loss kernels and AdamW: torch, or the Numba kernels.")
    log_steps: int = Field(1, gt=0, description="Log loss / tokens/s / ETA every N steps.")

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.epochs <= 0 and self.max_steps <= 0:
            raise ValueError("TrainConfig: set epochs > 0 or max_steps > 0")
        if self.lr_scheduler == "constant" and self.warmup_steps > 0:
            raise ValueError(f"TrainConfig: lr_scheduler='constant' ignores warmup_steps={self.warmup_steps}; "
                             "use lr_scheduler='constant_with_warmup' (or another schedule)")
        if self.kernel_backend == "numba" and _cuda_here():
            raise ValueError("TrainConfig: kernel_backend='numba' runs on CPU tensors only and this host trains on its "
                             "CUDA GPU; use kernel_backend='torch' (with use_liger=True for fused GPU kernels)")
        if self.grpo.rollout == "vllm" and self.lora is None:
            raise ValueError("TrainConfig: grpo.rollout='vllm' needs a LoRA run (set lora=LoraSpec(...)): the policy is "
                             "synced to vLLM as a runtime LoRA adapter, and vLLM cannot hot-load full weights over HTTP; "
                             "for a full fine-tune use grpo.rollout='local'")
        return self

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (tuples as lists) that ``from_dict`` reads back to an equal config."""
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        return validated(cls, data)

    def with_(self, **changes: Any) -> TrainConfig:
        """A copy with ``changes`` applied, validated like a new config."""
        return validated(type(self), {**self.model_dump(), **changes})


def _cuda_here() -> bool:
    """Whether the trainers here put the model on a GPU (asked only for kernel_backend='numba')."""
    if importlib.util.find_spec("torch") is None:
        return False
    import torch  # heavy: only when a Numba backend must be checked against the device

    return torch.cuda.is_available()


def validated(cls: type[BaseModel], data: dict[str, Any]) -> Any:
    """``cls.model_validate(data)`` with one line per problem naming the field and what is allowed."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                problems.append(f"{cls.__name__}: unknown field {where!r} (fields: {', '.join(cls.model_fields)})")
            else:
                message = err["msg"].removeprefix("Value error, ")
                if err["type"] == "less_than_equal" and len(err["loc"]) == 1:  # a bound: say why it is there
                    message += f" ({cls.model_fields[str(err['loc'][0])].description})"
                problems.append(f"{cls.__name__}.{where}: {message}" if where else message)
        raise ValueError("; ".join(problems)) from None


def choices(literal: Any) -> tuple[str, ...]:
    """The values of a ``Literal`` type, e.g. ``choices(DpoLossType) == ("sigmoid", "ipo", "hinge")``."""
    return get_args(literal)
