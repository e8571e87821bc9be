"""TrainConfig, PretrainSpec and the pure training plan.

Nothing here imports torch: ``plan(...)`` answers "how many steps, how many tokens per step,
how much memory" in milliseconds, so the CLI and Dagster can show it before anything trains.
The trainers (``pretrain``, ``sft``, ``dpo``, ``grpo``) subclass ``TrainerBase`` in their own
modules and share ``trainers.loop.run_loop``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from training_assets.peft_manager import LoraSpec

PRECISIONS = ("fp32", "fp16", "bf16")
DISTRIBUTED = ("none", "ddp", "fsdp", "deepspeed")
KERNEL_BACKENDS = ("torch", "numba")
TRACKERS = ("none", "mlflow")
ROLLOUTS = ("local", "vllm", "dataset", "mixed")


@dataclass(frozen=True)
class PretrainSpec:
    """A random-init decoder (Llama / Qwen2 style) built with ``AutoConfig.for_model`` → ``from_config``.

    Defaults are a ~0.3M-parameter toy that trains in seconds on 2 CPU cores.
    """

    model_type: str = "qwen2"  # "qwen2" or "llama" (any AutoConfig decoder with these fields works)
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2  # grouped-query attention: kv heads divide attention heads
    intermediate_size: int = 128
    max_position_embeddings: int = 512
    vocab_size: int | None = None  # None = the tokenizer's length
    tie_word_embeddings: bool = True
    rope_theta: float = 10000.0

    def config_kwargs(self, vocab_size: int) -> dict[str, Any]:
        kw = {k: v for k, v in asdict(self).items() if k not in ("model_type", "vocab_size", "rope_theta")}
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


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs. Defaults give plain single-process fp32 AdamW training."""

    base_model: str | None = None  # HF model dir to start from; None = random init from `pretrain`
    tokenizer: str | None = None  # HF tokenizer dir; None = the base_model dir (a tokenizer may also be injected)
    output_dir: str = "checkpoints/run"  # periodic checkpoints (checkpoint-<step>/) and the final model/
    epochs: int = 1  # passes over the data (ignored when max_steps > 0)
    max_steps: int = -1  # optimizer steps; > 0 overrides epochs
    batch_size: int = 8  # examples per micro-batch per process
    lr: float = 2e-4  # peak learning rate
    weight_decay: float = 0.0  # decoupled (AdamW) weight decay
    adam_betas: tuple[float, float] = (0.9, 0.999)
    max_seq_len: int = 512  # longer examples are truncated (from the right)
    precision: str = "fp32"  # fp32 | bf16 (autocast) | fp16 (autocast + GradScaler)
    grad_accum: int = 1  # micro-batches per optimizer step
    max_grad_norm: float = 1.0  # global L2 clip; <= 0 disables clipping
    warmup_steps: int = 0  # linear warm-up steps
    lr_scheduler: str = "linear"  # any transformers.get_scheduler name: linear, cosine, constant, ...
    gradient_checkpointing: bool = False  # recompute activations in backward (memory for compute)
    attn_impl: str = "sdpa"  # eager | sdpa | flash_attention_2 (CUDA) — passed to from_pretrained/from_config
    use_liger: bool = False  # Liger fused kernels (CUDA, liger-kernel installed); error if unavailable
    packing: bool = False  # SFT: pack several examples per row with per-document position ids
    save_steps: int = 0  # checkpoint every N optimizer steps; 0 = only at the end
    save_total_limit: int = 2  # keep this many newest checkpoint-<step>/ dirs; <= 0 keeps all
    resume_from: str | None = None  # None | "auto" (newest checkpoint in output_dir, if any) | a checkpoint dir
    distributed: str = "none"  # none | ddp | fsdp | deepspeed (multi-process via launch.build_launch_command)
    tracker: str = "none"  # none | mlflow
    tracking_uri: str | None = None  # MLflow URI; None = $MLFLOW_TRACKING_URI or a SQLite store
    run_name: str | None = None  # tracker run name
    tracker_tags: dict[str, str] | None = None  # extra tags on the tracker run (e.g. the Dagster run id)
    lora: LoraSpec | None = None  # train a LoRA adapter instead of all weights
    pretrain: PretrainSpec = field(default_factory=PretrainSpec)  # architecture when base_model is None
    seed: int = 0  # seeds init, data order (per epoch) and dropout/sampling RNGs
    torch_threads: int = 0  # intra-op CPU threads; 0 = torch's default (one per core)
    kernel_backend: str = "torch"  # torch | numba: loss kernels and AdamW from trainers.objectives / numba_ops
    log_steps: int = 1  # log loss / tokens/s / ETA every N steps
    # DPO (Rafailov et al. 2023)
    beta: float = 0.1  # DPO inverse temperature on the log-ratio margin
    dpo_loss_type: str = "sigmoid"  # sigmoid | ipo | hinge
    label_smoothing: float = 0.0  # cDPO: assumed probability that a preference label is flipped
    precompute_ref_logps: bool = True  # reference log-probs computed once before training (no 2nd model in memory)
    # GRPO (Shao et al. 2024, DeepSeekMath)
    # Rollout source (see trainers/grpo.py): local = the policy's own samples by generate; vllm = the
    # policy's samples from a vLLM server; dataset = the logged attempts of each grpo_groups row with
    # their stored advantages; mixed = logged attempts (stored rewards) + num_generations local samples
    # in one group, advantages normalised over the whole group (LUFFY, arXiv:2504.14945)
    rollout: str = "local"
    vllm_base_url: str | None = None  # OpenAI-compatible vLLM server for rollout="vllm"
    num_generations: int = 4  # completions per prompt (group size)
    max_new_tokens: int = 32  # generated tokens per completion
    temperature: float = 1.0  # sampling temperature for rollouts
    epsilon_low: float = 0.2  # clip range below 1 for the importance ratio
    epsilon_high: float = 0.2  # clip range above 1 (DAPO clip-higher uses e.g. 0.28)
    kl_beta: float = 0.0  # weight of the k3 KL to the reference policy (0 = no reference forward)
    grpo_loss_type: str = "dapo"  # grpo | bnpo | dr_grpo | dapo aggregation
    reward_weights: dict[str, float] | None = None  # reward components → weights (None = reward engine default)

    def __post_init__(self) -> None:
        checks = [
            (self.precision in PRECISIONS, f"precision must be one of {PRECISIONS}, got {self.precision!r}"),
            (self.distributed in DISTRIBUTED, f"distributed must be one of {DISTRIBUTED}, got {self.distributed!r}"),
            (self.kernel_backend in KERNEL_BACKENDS, f"kernel_backend must be one of {KERNEL_BACKENDS}, got {self.kernel_backend!r}"),
            (self.tracker in TRACKERS, f"tracker must be one of {TRACKERS}, got {self.tracker!r}"),
            (self.batch_size > 0, f"batch_size must be positive, got {self.batch_size}"),
            (self.grad_accum > 0, f"grad_accum must be positive, got {self.grad_accum}"),
            (self.epochs > 0 or self.max_steps > 0, "set epochs > 0 or max_steps > 0"),
            (self.rollout in ROLLOUTS, f"rollout must be one of {ROLLOUTS}, got {self.rollout!r}"),
            (self.rollout != "vllm" or bool(self.vllm_base_url), "rollout='vllm' needs vllm_base_url (e.g. http://host:8000)"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"TrainConfig: {message}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["lora"] = self.lora.to_dict() if self.lora else None
        d["adam_betas"] = list(self.adam_betas)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"TrainConfig: unknown fields {unknown}")
        d = dict(d)
        if d.get("lora") is not None and not isinstance(d["lora"], LoraSpec):
            d["lora"] = LoraSpec.from_dict(d["lora"])
        if isinstance(d.get("pretrain"), dict):
            d["pretrain"] = PretrainSpec(**d["pretrain"])
        if "adam_betas" in d:
            d["adam_betas"] = tuple(d["adam_betas"])
        return cls(**d)

    def with_(self, **changes: Any) -> TrainConfig:
        return replace(self, **changes)


@dataclass
class Plan:
    """What a run will do, computed without torch."""

    kind: str
    examples: int
    planned_steps: int
    effective_batch: int  # examples per optimizer step (batch_size × grad_accum × processes)
    tokens_per_step: int  # mean tokens per example × effective batch (sequences × 2 for DPO pairs)
    n_params: int | None
    trainable_params: int | None
    est_memory_mb: float | None  # weights + grads + AdamW state (+ activations estimate)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_param_count(config: TrainConfig, vocab_size: int | None) -> tuple[int | None, str]:
    """Parameter count from the PretrainSpec or the base model's config.json (no torch)."""
    if config.base_model is None:
        if vocab_size is None and config.pretrain.vocab_size is None:
            return None, "vocab size unknown (no tokenizer given): parameter count not estimated"
        return config.pretrain.n_params(vocab_size or 0), "from PretrainSpec"
    cfg_path = Path(config.base_model) / "config.json"
    if not cfg_path.is_file():
        return None, f"{cfg_path} not found: parameter count not estimated"
    hf = json.loads(cfg_path.read_text())
    spec = PretrainSpec(
        model_type=hf.get("model_type", "llama"), hidden_size=hf["hidden_size"], num_hidden_layers=hf["num_hidden_layers"],
        num_attention_heads=hf["num_attention_heads"],
        num_key_value_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"], vocab_size=hf["vocab_size"],
        tie_word_embeddings=hf.get("tie_word_embeddings", False))
    return spec.n_params(hf["vocab_size"]), f"from {cfg_path}"


def lora_param_count(config: TrainConfig) -> int | None:
    """Trainable parameters of the LoRA adapter: r·(in+out) per targeted Linear."""
    if config.lora is None:
        return None
    if config.base_model is None:
        p = config.pretrain
        h, i, layers = p.hidden_size, p.intermediate_size, p.num_hidden_layers
        kv = p.num_key_value_heads * (h // p.num_attention_heads)
    else:
        cfg_path = Path(config.base_model) / "config.json"
        if not cfg_path.is_file():
            return None
        hf = json.loads(cfg_path.read_text())
        h, i, layers = hf["hidden_size"], hf["intermediate_size"], hf["num_hidden_layers"]
        kv = (hf.get("num_key_value_heads") or hf["num_attention_heads"]) * (h // hf["num_attention_heads"])
    shapes = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
              "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    r = config.lora.r
    return layers * sum(r * (a + b) for m, (a, b) in shapes.items() if m in config.lora.target_modules)


def make_plan(kind: str, config: TrainConfig, n_examples: int, mean_tokens: float, vocab_size: int | None,
              world_size: int = 1, sequences_per_example: int = 1) -> Plan:
    """Steps, effective batch, tokens per step and a memory estimate for a run.

    Memory (fp32 master weights): weights 4 B/param, grads and AdamW moments 12 B per *trainable*
    param, plus activations ≈ 34·h·T·B·layers bytes (Korthikanti et al. 2022, no recompute);
    the estimate is an order of magnitude, not a promise.
    """
    notes: list[str] = []
    if n_examples <= 0:
        raise ValueError(f"{kind}: no training examples; build the dataset first (training-assets build-dataset)")
    effective = config.batch_size * config.grad_accum * world_size
    steps_per_epoch = max(1, math.ceil(n_examples / effective))
    steps = config.max_steps if config.max_steps > 0 else steps_per_epoch * config.epochs
    if config.max_steps > 0:
        notes.append(f"max_steps={config.max_steps} overrides epochs ({steps_per_epoch} steps per epoch)")
    n_params, why = model_param_count(config, vocab_size)
    trainable = lora_param_count(config) if config.lora else n_params
    est = None
    if n_params is not None and trainable is not None:
        weight_bytes = 2 if config.precision != "fp32" and config.lora else 4
        if config.lora and config.lora.quant_4bit:
            weight_bytes = 0.5
        spec = config.pretrain
        h, layers = spec.hidden_size, spec.num_hidden_layers
        if config.base_model is not None:
            hf = json.loads((Path(config.base_model) / "config.json").read_text())
            h, layers = hf["hidden_size"], hf["num_hidden_layers"]
        tokens = min(mean_tokens, config.max_seq_len) * config.batch_size * sequences_per_example
        act_factor = 0.15 if config.gradient_checkpointing else 1.0
        activations = 34 * h * tokens * layers * act_factor
        est = (n_params * weight_bytes + trainable * 12 + activations) / 2**20
    else:
        notes.append(why)
    tokens_per_step = int(round(min(mean_tokens, config.max_seq_len) * effective * sequences_per_example))
    return Plan(kind=kind, examples=n_examples, planned_steps=int(steps), effective_batch=effective,
                tokens_per_step=tokens_per_step, n_params=n_params, trainable_params=trainable,
                est_memory_mb=None if est is None else round(est, 1), notes=notes)


@dataclass
class TrainResult:
    """What ``trainer.train`` produced: the plan, the loop's numbers and where the model is."""

    kind: str
    plan: Plan
    loop: Any  # trainers.loop.LoopResult
    checkpoint_dir: str  # HF dir (full model) or PEFT adapter dir
    adapter: bool
    base_model_dir: str | None
    tokenizer_dir: str
    mlflow_run_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def train_summary(self) -> dict[str, Any]:
        """The manifest's ``train`` block."""
        lp = self.loop
        return {"steps": lp.steps, "final_loss": lp.final_loss, "tokens_per_s": round(lp.tokens_per_s, 1),
                "peak_rss_mb": round(lp.peak_rss_mb, 1), "peak_gpu_mb": lp.peak_gpu_mb, "losses": lp.losses,
                "wall_s": round(lp.wall_s, 3), "tokens": lp.tokens, "resumed_from": lp.resumed_from, **self.extra}


class TrainerBase:
    """Shared shape of the trainers: ``plan`` (pure), ``prepare`` → ``collate`` → ``loss`` inside ``run_loop``.

    Subclasses set ``kind`` and implement ``example_tokens`` (for the plan), ``prepare`` (tokenise
    once), ``collate`` (rows → tensors) and ``loss`` (→ mean loss, weight). ``model`` and
    ``tokenizer`` may be injected (tests, pipelines); otherwise they come from the config.
    """

    kind = "base"
    sequences_per_example = 1

    def __init__(self, config: TrainConfig, model: Any = None, tokenizer: Any = None, accelerator: Any = None,
                 callbacks: tuple[Any, ...] = ()) -> None:
        self.config, self.model, self.tokenizer, self.accelerator, self.callbacks = config, model, tokenizer, accelerator, callbacks

    # -- planning (no torch)
    def example_tokens(self, example: dict[str, Any]) -> int:
        raise NotImplementedError

    def plan(self, examples: list[dict[str, Any]], world_size: int = 1) -> Plan:
        examples = list(examples)
        lengths = [self.example_tokens(e) for e in examples]
        mean = sum(lengths) / len(lengths) if lengths else 0.0
        vocab = len(self.tokenizer) if self.tokenizer is not None else None
        return make_plan(self.kind, self.config, len(examples), mean, vocab, world_size, self.sequences_per_example)

    # -- training
    def prepare(self, examples: list[dict[str, Any]], tokenizer: Any) -> list[dict[str, Any]]:
        raise NotImplementedError

    def collate(self, rows: list[dict[str, Any]], model: Any) -> dict[str, Any]:
        raise NotImplementedError

    def loss(self, model: Any, batch: dict[str, Any]) -> tuple[Any, float]:
        raise NotImplementedError

    def before_loop(self, model: Any, rows: list[dict[str, Any]]) -> None:
        """Hook run once before the loop (DPO precomputes reference log-probs here)."""

    def load_tokenizer(self) -> Any:
        if self.tokenizer is not None:
            return self.tokenizer
        source = self.config.tokenizer or self.config.base_model
        if source is None:
            raise ValueError(f"{self.kind}: no tokenizer: set TrainConfig.tokenizer (a tokenizer dir) or pass tokenizer=")
        from training_assets.trainers.checkpoints import load_tokenizer_dir

        self.tokenizer = load_tokenizer_dir(source)
        return self.tokenizer

    def tokenizer_dir(self, tokenizer: Any) -> str:
        """Where the run's tokenizer lives: the configured dir, else a copy saved under output_dir/tokenizer.

        Checkpoint dirs hold no tokenizer on purpose: next to a config.json, AutoTokenizer would
        load a model-specific class that tokenises our BPE differently (see load_tokenizer_dir).
        """
        if self.config.tokenizer:
            return str(Path(self.config.tokenizer).resolve())
        folder = Path(self.config.output_dir) / "tokenizer"
        if self.accelerator is None or self.accelerator.is_main_process:
            tokenizer.save_pretrained(str(folder))
        return str(folder.resolve())

    def train(self, examples: list[dict[str, Any]]) -> TrainResult:
        """Train on ``examples``; writes checkpoints and ``<output_dir>/final``; returns the result."""
        from training_assets import tracking
        from training_assets.trainers import modeling
        from training_assets.trainers.loop import run_loop

        tokenizer = self.load_tokenizer()
        examples = list(examples)
        world = self.accelerator.num_processes if self.accelerator is not None else 1
        plan = self.plan(examples, world_size=world)
        rows = self.prepare(examples, tokenizer)
        model = self.model if self.model is not None else modeling.build_model(self.config, len(tokenizer))
        if self.config.lora is not None and not hasattr(model, "peft_config"):
            model = modeling.attach_lora(model, self.config)
        self.model = model
        self.before_loop(model, rows)
        is_main = self.accelerator is None or self.accelerator.is_main_process
        with tracking.start_run(self.config, plan, enabled=is_main) as run:
            result = run_loop(model, len(rows), lambda idx, m: self.collate([rows[i] for i in idx], m), self.loss,
                              self.config, accelerator=self.accelerator, callbacks=(*self.callbacks, run.log_step),
                              planned_steps=plan.planned_steps)
            final = Path(self.config.output_dir) / "final"
            if is_main:
                modeling.save_final(model, final)
            run.finish(result, str(final))
        return TrainResult(kind=self.kind, plan=plan, loop=result, checkpoint_dir=str(final.resolve()),
                           adapter=self.config.lora is not None,
                           base_model_dir=str(Path(self.config.base_model).resolve()) if self.config.base_model else None,
                           tokenizer_dir=self.tokenizer_dir(tokenizer), mlflow_run_id=run.run_id)
