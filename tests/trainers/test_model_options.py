"""TrainConfig.weight_dtype (the dtype weights are held in) and activation checkpointing across transformers releases."""

import pytest
import torch

from training_assets.trainers import TrainConfig
from training_assets.trainers.modeling import build_model


@pytest.fixture(scope="module")
def bf16_base(base_model_dir, tmp_path_factory):
    """The session's tiny base saved in bf16, as SmolLM2's checkpoint is."""
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("bf16")
    AutoModelForCausalLM.from_pretrained(str(base_model_dir), dtype=torch.bfloat16).save_pretrained(str(folder))
    return folder


@pytest.mark.parametrize("choice, expected", [("auto", torch.float32), ("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_a_bf16_checkpoint_is_held_in_the_chosen_dtype_fp32_on_cpu_by_default(bf16_base, tmp_path, choice, expected):
    config = TrainConfig(base_model=str(bf16_base), output_dir=str(tmp_path), max_steps=1, weight_dtype=choice)
    if choice == "auto" and torch.cuda.is_available():
        expected = torch.bfloat16  # auto on a GPU: the checkpoint's own dtype
    assert build_model(config, 0).dtype == expected


def test_random_init_honours_weight_dtype(tokenizer, tmp_path):
    config = TrainConfig(output_dir=str(tmp_path), max_steps=1, weight_dtype="bf16")
    assert build_model(config, len(tokenizer)).dtype == torch.bfloat16


def test_an_unknown_weight_dtype_is_refused_when_the_config_is_built(tmp_path):
    with pytest.raises(ValueError, match="weight_dtype"):
        TrainConfig(output_dir=str(tmp_path), max_steps=1, weight_dtype="fp8")


class _OldModel:  # transformers < 5.18: only gradient_checkpointing_enable
    def __init__(self):
        self.calls = []

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.calls.append(("gradient", gradient_checkpointing_kwargs))


class _NewModel(_OldModel):
    def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None):
        self.calls.append(("activation", activation_checkpointing_kwargs))


def test_activation_checkpointing_is_found_under_either_transformers_name():
    from training_assets.trainers.loop import enable_activation_checkpointing

    old, new = _OldModel(), _NewModel()
    enable_activation_checkpointing(old)
    enable_activation_checkpointing(new)
    assert old.calls == [("gradient", {"use_reentrant": False})] and new.calls == [("activation", {"use_reentrant": False})]
    with pytest.raises(ValueError, match="gradient_checkpointing=True: object has no activation checkpointing"):
        enable_activation_checkpointing(object())


def test_the_numba_backend_on_a_gpu_host_is_refused_when_the_config_is_built(tmp_path, monkeypatch):
    from training_assets.trainers import config as config_module

    TrainConfig(output_dir=str(tmp_path), max_steps=1, kernel_backend="numba")  # CPU here: accepted
    monkeypatch.setattr(config_module, "_cuda_here", lambda: True)
    with pytest.raises(ValueError, match="kernel_backend='numba' runs on CPU tensors only.*kernel_backend='torch'"):
        TrainConfig(output_dir=str(tmp_path), max_steps=1, kernel_backend="numba")


def test_a_trainer_process_imports_no_polars():
    import subprocess
    import sys

    code = ("import sys; from training_assets.trainers import get_trainer; import training_assets.trainers.jobs, "
            "training_assets.trainers.grpo, training_assets.trainers.dpo, training_assets.rollout_buffer; "
            "print(sorted(m for m in sys.modules if m == 'polars' or m.startswith('polars.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-500:]
    assert out.stdout.strip() == "[]"  # a GPU image need not carry polars for the trainers
