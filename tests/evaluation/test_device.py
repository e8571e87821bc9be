"""Eval device/dtype selection (auto: CUDA + bf16 with a GPU, else CPU fp32) and batched greedy generation."""

import pytest

from training_assets import evaluation as eh
from training_assets.checkpoint_loading import load_checkpoint
from training_assets.evaluation import suite


@pytest.fixture
def no_cuda(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def two_gpus(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_auto_on_a_host_without_cuda_is_cpu_fp32_and_cuda_is_refused(no_cuda):
    assert eh.resolve_device().to_dict() | {"reason": ""} == {"device": "cpu", "dtype": "float32", "reason": ""}
    assert eh.resolve_device("cpu", "bfloat16").dtype == "bfloat16"  # an explicit dtype is taken as given
    with pytest.raises(ValueError, match="'cuda:0': torch sees no CUDA device here; use device='cpu'"):
        eh.resolve_device("cuda:0")
    with pytest.raises(ValueError, match='"auto", "cpu", "cuda" or "cuda:N"'):
        eh.resolve_device("gpu")
    with pytest.raises(ValueError, match="eval dtype 'fp8'"):
        eh.resolve_device("cpu", "fp8")


def test_auto_with_cuda_picks_the_first_gpu_in_bf16(two_gpus):
    assert (eh.resolve_device().device, eh.resolve_device().dtype) == ("cuda:0", "bfloat16")
    assert (eh.resolve_device("cuda").device, eh.resolve_device("CUDA:1", "float16").dtype) == ("cuda:0", "float16")
    assert eh.resolve_device("cpu").dtype == "float32"
    with pytest.raises(ValueError, match="only 2 CUDA device"):
        eh.resolve_device("cuda:2")


def test_load_for_eval_loads_in_the_chosen_dtype_and_moves_to_the_chosen_device(two_gpus, monkeypatch):
    seen = {}

    class Model:
        def to(self, device):
            seen["device"] = device
            return self

    def fake_load(path, merge_adapter, dtype):
        seen.update(path=path, merge=merge_adapter, dtype=dtype)
        return Model(), "tok"

    monkeypatch.setattr(suite, "load_checkpoint", fake_load)
    _, tok, placement = suite.load_for_eval("ckpt", "auto", "auto")
    assert seen == {"path": "ckpt", "merge": True, "dtype": "bfloat16", "device": "cuda:0"} and tok == "tok"
    assert placement.device == "cuda:0"


def test_batched_greedy_answers_equal_one_at_a_time(tiny_checkpoints):
    import torch
    from transformers import AutoModelForCausalLM

    _, tokenizer = load_checkpoint(tiny_checkpoints["base"])
    config = AutoModelForCausalLM.from_pretrained(tiny_checkpoints["base"]).config
    config.tie_word_embeddings = False  # a tied random model repeats the prompt's last (special) token: empty answers
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    cases = eh.load_cases()[:6]  # prompts of different lengths: the batch is left-padded
    lengths = {len(tokenizer(suite._prompt_text(tokenizer, c))["input_ids"]) for c in cases}
    assert len(lengths) > 1
    one = eh.generate_answers(model, tokenizer, cases, max_new_tokens=8, batch_size=1)
    batched = eh.generate_answers(model, tokenizer, cases, max_new_tokens=8, batch_size=4)
    assert batched == one and len(set(one)) > 1


def test_the_report_records_where_it_ran_and_keeps_the_fp32_identity(tiny_checkpoints, no_cuda):
    cases = eh.load_cases()[:3]
    payload = eh.run_eval_report(tiny_checkpoints["base"], cases, eh.GateThresholds(), max_new_tokens=4, batch_size=2)
    assert payload["placement"]["device"] == "cpu" and payload["placement"]["dtype"] == "float32"
    assert payload["eval_config"] == eh.eval_config_id(cases, [], None, 4)  # unchanged for fp32 reports
    assert eh.eval_config_id(cases, [], None, 4, "bfloat16") != payload["eval_config"]
