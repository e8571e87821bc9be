"""LoRA / QLoRA guards and TIES merging against PEFT's own implementation."""

import json

import numpy as np
import pytest
import torch

from training_assets.peft_manager import (LoraSpec, PeftManager, QLoraUnavailableError, merge_lora_adapters,
                                          ties_merge)
from training_assets.trainers import TrainConfig, get_trainer


def test_ties_merge_by_hand():
    a = np.array([3.0, -1.0, 0.5, -2.0])
    b = np.array([-1.0, -4.0, 0.2, 2.5])
    # density 0.5 keeps the 2 largest |x| of each: a → [3, 0, 0, -2], b → [0, -4, 0, 2.5]
    # elected sign of the sums [3, -4, 0, 0.5] → [+, -, +, +]; disjoint mean over agreeing entries
    merged = ties_merge([a, b], [1.0, 1.0], density=0.5)
    np.testing.assert_allclose(merged, [3.0, -4.0, 0.0, 2.5])
    with pytest.raises(ValueError, match="differ in shape"):
        ties_merge([a, b[:3]], [1.0, 1.0])


def test_qlora_on_cpu_is_a_clear_error(tmp_path, base_model_dir, sft_examples):
    config = TrainConfig(base_model=str(base_model_dir), output_dir=str(tmp_path), max_steps=1,
                         lora=LoraSpec(r=4, quant_4bit=True))
    with pytest.raises(QLoraUnavailableError, match="CUDA"):
        get_trainer("sft", config).train(sft_examples)
    assert not (tmp_path / "final").exists()


def test_lora_target_that_matches_nothing_is_named(base_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base_model_dir))
    with pytest.raises(ValueError, match=r"\['qkv'\] match no module"):
        PeftManager(LoraSpec(r=4, target_modules=("q_proj", "qkv"))).wrap(model)


def test_lora_trains_only_the_adapter_and_plan_counts_it(tmp_path, base_model_dir, tokenizer, sft_examples):
    spec = LoraSpec(r=4, alpha=8, target_modules=("q_proj", "v_proj", "down_proj"))
    config = TrainConfig(base_model=str(base_model_dir), output_dir=str(tmp_path), max_steps=2, lr=1e-2, lora=spec)
    trainer = get_trainer("sft", config, tokenizer=tokenizer)
    plan = trainer.plan(sft_examples)
    result = trainer.train(sft_examples)
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    assert plan.trainable_params == trainable
    assert result.adapter and sorted(p.name for p in (tmp_path / "final").iterdir()) == [
        "README.md", "adapter_config.json", "adapter_model.safetensors"]


def _random_adapter(base_model_dir, out, seed, r=4, alpha=8):
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_model_dir))
    peft_model = get_peft_model(model, PeftManager(LoraSpec(r=r, alpha=alpha, target_modules=("q_proj", "v_proj"))).lora_config())
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.1)
    peft_model.save_pretrained(str(out))
    return out


def test_ties_merge_of_adapters_matches_peft_and_loads(tmp_path, base_model_dir):
    from peft import PeftModel
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    a = _random_adapter(base_model_dir, tmp_path / "a", 1, alpha=8)
    b = _random_adapter(base_model_dir, tmp_path / "b", 2, alpha=16)
    summary = merge_lora_adapters([a, b], tmp_path / "merged", weights=[0.7, 0.3], density=0.5)
    assert summary["tensors"] == 2 * 2 * 2  # 2 layers × (q, v) × (A, B)

    base = AutoModelForCausalLM.from_pretrained(str(base_model_dir))
    model = PeftModel.from_pretrained(base, str(a), adapter_name="a")
    model.load_adapter(str(b), adapter_name="b")
    model.add_weighted_adapter(["a", "b"], [0.7, 0.3], adapter_name="ties", combination_type="ties", density=0.5)
    ours = load_file(str(tmp_path / "merged" / "adapter_model.safetensors"))
    theirs = {k.replace(".ties.", "."): v.detach().numpy() for k, v in model.state_dict().items() if ".ties." in k}
    assert len(theirs) == len(ours)
    for name, value in ours.items():
        np.testing.assert_allclose(value, theirs[name], rtol=1e-6, atol=1e-7, err_msg=name)
    assert json.loads((tmp_path / "merged" / "adapter_config.json").read_text())["lora_alpha"] == 4

    merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base_model_dir)), str(tmp_path / "merged"))
    model.set_adapter("ties")
    ids = torch.tensor([[1, 4, 97, 82, 278]])
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_merge_refuses_adapters_of_different_rank(tmp_path, base_model_dir):
    a = _random_adapter(base_model_dir, tmp_path / "a", 1, r=4)
    b = _random_adapter(base_model_dir, tmp_path / "b", 2, r=8)
    with pytest.raises(ValueError, match="one rank"):
        merge_lora_adapters([a, b], tmp_path / "m")
