"""The seed's end-to-end pipeline + deploy seam: traces → SFT corpus → plan → train → reliability eval →
checkpoint → registered as the role's model and loaded into the running vLLM.

    python examples/sft_pipeline.py      # a vLLM at http://localhost:8000 with runtime LoRA loading on

As the seed writes it, with the module renamed to ``training_assets`` and a tiny random-init base
(``_tiny.tiny_base()``) in place of ``Qwen/Qwen2.5-1.5B-Instruct``; the seed's inputs (trajectories,
eval cases, the live registry) come from ``_tiny``, models go under ``$TRAINING_ASSETS_MODELS``
(default ``/models``, as in the seed). Running it again is idempotent: the same checkpoint_id
returns the version the first run registered.
"""

from _tiny import MODELS, reliability_cases, sample_traces, tiny_base

from training_assets.tracking import default_tracking_uri

TINY_BASE = tiny_base()  # the seed: "Qwen/Qwen2.5-1.5B-Instruct"
openseeker_trajectories = sample_traces()
reliability_eval_cases = reliability_cases()

from training_assets.training_pipeline import run_sft_pipeline, DeploymentTarget
from training_assets.trainers import TrainConfig, peft_manager  # peft via [train]
from training_assets.peft_manager import LoraSpec
from training_assets.registry import ModelRegistry

my_registry = ModelRegistry(default_tracking_uri())  # $MLFLOW_TRACKING_URI, else the data root's SQLite store

# OpenSeeker SFT on the GB10: Qwen2.5-1.5B + LoRA, served by the local vLLM.
report = run_sft_pipeline(
    TrainConfig(
        base_model=TINY_BASE,
        output_dir=f"{MODELS}/openseeker-sft",
        epochs=1, batch_size=8, lr=2e-4,
        lora=LoraSpec(r=16, alpha=32),          # LoRA; quant_4bit=True for QLoRA
    ),
    traces=openseeker_trajectories,             # ~10k synth trajectories (data engine)
    eval_cases=reliability_eval_cases,          # AHE-3.1 internalization/safety checks
    registry=my_registry,                       # the live ModelRegistry
    deploy=DeploymentTarget(
        role="generator",
        served_model_name="qwen2.5-1.5b-openseeker",
        base_url="http://localhost:8000/v1",    # the running vLLM
    ),
    checkpoint_id="openseeker-sft-v1",
)

print({section: sorted(report[section]) if report[section] else None for section in report})
print(report.deployment["note"], "->", my_registry.pick_for_role("generator").served_model_name)
