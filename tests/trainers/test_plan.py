"""The plan is pure (no torch), and its numbers follow from the config."""

import json
import subprocess
import sys

import pytest

from training_assets.peft_manager import LoraSpec
from training_assets.trainers import DpoSpec, GrpoSpec, TrainConfig, get_trainer


def test_plan_imports_no_torch():
    code = ("import sys; from training_assets.trainers import TrainConfig, get_trainer\n"
            "for kind in ('pretrain', 'sft', 'dpo', 'grpo'): get_trainer(kind, TrainConfig(max_steps=3))\n"
            "p = get_trainer('sft', TrainConfig(batch_size=2)).plan([{'input_ids': [1] * 10, 'assistant_mask': [1] * 10}] * 5)\n"
            "assert 'torch' not in sys.modules, 'plan imported torch'\n"
            "print(p.planned_steps)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "3"


def test_plan_numbers(tokenizer):
    examples = [{"input_ids": [1] * n, "assistant_mask": [1] * n, "n_tokens": n} for n in (10, 20, 30, 40, 50)]
    plan = get_trainer("sft", TrainConfig(batch_size=2, grad_accum=2, epochs=3), tokenizer=tokenizer).plan(examples)
    assert (plan.planned_steps, plan.effective_batch, plan.tokens_per_step) == (6, 4, 120)  # ceil(5/4)·3; 30 tok × 4
    assert plan.n_params == plan.trainable_params and plan.est_memory_mb > 0
    capped = get_trainer("sft", TrainConfig(batch_size=2, max_steps=7), tokenizer=tokenizer).plan(examples)
    assert capped.planned_steps == 7 and "overrides epochs" in capped.notes[0]
    packed = get_trainer("sft", TrainConfig(batch_size=1, packing=True, max_seq_len=64), tokenizer=tokenizer).plan(examples)
    assert packed.examples == 3  # [10,20,30] [40] [50] rows of ≤ 64 tokens
    lora = get_trainer("sft", TrainConfig(lora=LoraSpec(r=4, target_modules=("q_proj",))), tokenizer=tokenizer).plan(examples)
    assert lora.trainable_params == 2 * 4 * (64 + 64)  # layers × r × (in + out)


def test_plan_counts_the_real_model(tokenizer):
    from training_assets.trainers.modeling import build_model

    config = TrainConfig()
    plan = get_trainer("pretrain", config, tokenizer=tokenizer).plan([{"input_ids": [1] * 8}])
    assert plan.n_params == sum(p.numel() for p in build_model(config, len(tokenizer)).parameters())


def test_config_round_trip_and_errors():
    config = TrainConfig(lora=LoraSpec(r=8), max_steps=5, adam_betas=(0.9, 0.95), dpo=DpoSpec(beta=0.3),
                         grpo=GrpoSpec(rollout="dataset", loss_type="la_grpo"))
    assert TrainConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert config.with_(lr=1e-3).lr == 1e-3 and config.with_(lr=1e-3).dpo.beta == 0.3
    with pytest.raises(ValueError, match="precision"):
        TrainConfig(precision="fp8")
    with pytest.raises(ValueError, match="TrainConfig.precision: Input should be 'fp32', 'fp16' or 'bf16'"):
        TrainConfig.from_dict({"precision": "fp8"})
    with pytest.raises(ValueError, match="unknown field 'learning_rate'"):
        TrainConfig.from_dict({"learning_rate": 1e-3})
    with pytest.raises(ValueError, match="TrainConfig.dpo.loss_type: Input should be 'sigmoid', 'ipo' or 'hinge'"):
        TrainConfig.from_dict({"dpo": {"loss_type": "sigmiod"}})
    with pytest.raises(ValueError, match="unknown field 'beta'"):  # DPO options are nested now
        TrainConfig.from_dict({"beta": 0.1})
    with pytest.raises(ValueError, match="vllm.base_url"):
        GrpoSpec(rollout="vllm")
    with pytest.raises(ValueError, match="constant_with_warmup"):
        TrainConfig(warmup_steps=10)
    with pytest.raises(ValueError, match="no training examples"):
        get_trainer("sft", TrainConfig()).plan([])


def test_defaults_reproduce_the_original_behaviour():
    """The seed: defaults reproduce the original behaviour — fp32, one process, a constant learning rate."""
    config = TrainConfig()
    assert (config.lr_scheduler, config.warmup_steps, config.precision, config.distributed, config.grad_accum) == (
        "constant", 0, "fp32", "none", 1)


def test_plan_and_result_are_mappings_with_attribute_access(tmp_path, tokenizer, windows):
    trainer = get_trainer("pretrain", TrainConfig(output_dir=str(tmp_path), max_steps=2, batch_size=4), tokenizer=tokenizer)
    plan = trainer.plan(windows)
    assert plan["planned_steps"] == plan.planned_steps == 2 and plan["effective_batch"] == 4
    assert {"planned_steps", "effective_batch", "tokens_per_step", "est_memory_mb"} <= set(plan)
    result = trainer.train(windows, plan=plan)
    assert result["steps"] == 2 and result["losses"] == result.loop.losses and result["final_loss"] == result.loop.losses[-1]
    assert result["plan"] == dict(plan) and result["checkpoint_dir"] == result.checkpoint_dir
    assert json.loads(json.dumps(dict(result)))["steps"] == 2  # JSON-able: what a training subprocess reports
    with pytest.raises(ValueError, match="made for 3 process"):
        trainer.train(windows, plan=trainer.plan(windows, world_size=3))
