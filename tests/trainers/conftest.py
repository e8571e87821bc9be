"""Fixtures for trainer tests: a tiny BPE tokenizer with the project chat template, a tiny random-init base."""

import json

import pytest

TEXTS = [f"The answer is {i}. Tool call search({i * 7}) returned ok. What is {i} plus one?" for i in range(200)]


def user(text):
    return [{"role": "user", "content": text}]


def assistant(text):
    return [{"role": "assistant", "content": text}]


@pytest.fixture(autouse=True)
def one_torch_thread(monkeypatch):
    """One intra-op thread here and in child processes: on a shared 2-core machine two spinning
    OpenMP threads per process run ~20× slower, and equal thread counts keep in-process and
    subprocess runs bit-comparable."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    from training_assets.tokenizer_trainer import train_tokenizer

    tok = train_tokenizer(TEXTS, vocab_size=400)
    folder = tmp_path_factory.mktemp("tokenizer")
    tok.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


@pytest.fixture(scope="session")
def base_model_dir(tmp_path_factory, tokenizer):
    """A saved random-init Qwen2 (hidden 64, 2 layers) with the tokenizer: a base for SFT/DPO/GRPO."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from training_assets.trainers import PretrainSpec

    spec = PretrainSpec()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen2", **spec.config_kwargs(len(tokenizer))))
    folder = tmp_path_factory.mktemp("base")
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="session")
def windows(tokenizer):
    """Packed pretrain windows of 32 tokens: two documents per window, labels -100 at each document start."""
    rows = []
    ids = [tokenizer(t)["input_ids"] for t in TEXTS]
    for a, b in zip(ids[0::2], ids[1::2]):
        a, b = a[:16], b[:16]
        rows.append({"input_ids": a + b, "position_ids": list(range(len(a))) + list(range(len(b))),
                     "doc_ids": [0] * len(a) + [1] * len(b),
                     "labels": [-100] + a[1:] + [-100] + b[1:]})
    return rows


@pytest.fixture(scope="session")
def sft_examples():
    return [{"messages": user(f"what is {i} plus one?") + assistant(f"The answer is {i + 1}.")} for i in range(24)]


@pytest.fixture(scope="session")
def preference_pairs():
    return [{"id": str(i), "prompt": json.dumps(user(f"what is {i} plus one?")),
             "chosen": json.dumps(assistant(f"The answer is {i + 1}.")),
             "rejected": json.dumps(assistant("Tool call search returned ok."))} for i in range(16)]


@pytest.fixture(scope="session")
def grpo_groups():
    return [{"group_id": str(i), "prompt": json.dumps(user(f"what is {i} plus one?")),
             "completions": [json.dumps(assistant(f"The answer is {i + 1}.")), json.dumps(assistant("no"))],
             "rewards": [1.0, 0.0], "advantages": [0.7071, -0.7071], "expected_answer": str(i + 1)} for i in range(8)]


@pytest.fixture(scope="session")
def write_upstream(tokenizer, windows, sft_examples, preference_pairs, grpo_groups):
    """``write_upstream(root)``: the assets the trainers read (tokenizer and the four datasets), written
    under ``root`` through their own libraries; returns ``root``."""
    import numpy as np

    from training_assets.tokenizer_trainer import tokenizer_dir
    from training_assets.training_data.io import rows_to_table, windows_to_table, write_dataset
    from training_assets.trainers.sft import encode_messages

    def write(root):
        tokenizer.save_pretrained(str(tokenizer_dir(root)))
        width = max(len(w["input_ids"]) for w in windows)
        cols = {k: np.array([w[k] + [fill] * (width - len(w[k])) for w in windows], dtype=np.int32)
                for k, fill in (("input_ids", 0), ("position_ids", 0), ("doc_ids", -1), ("labels", -100))}
        write_dataset("pretrain_windows", windows_to_table(cols), {"test": 1}, {}, root)
        sft = []
        for i, e in enumerate(sft_examples):
            ids, mask = encode_messages(tokenizer, e["messages"])
            sft.append({"id": str(i), "task_id": "t", "messages": json.dumps(e["messages"]), "input_ids": ids,
                        "assistant_mask": mask, "n_tokens": len(ids)})
        write_dataset("sft_dataset", rows_to_table("sft_dataset", sft), {"test": 1}, {}, root)
        pairs = [{**p, "task_id": "t", "failure_point": 0} for p in preference_pairs]
        write_dataset("preference_pairs", rows_to_table("preference_pairs", pairs), {"test": 1}, {}, root)
        groups = [{**g, "task_id": "t", "pass_rate": 0.5} for g in grpo_groups]
        write_dataset("grpo_groups", rows_to_table("grpo_groups", groups), {"test": 1}, {}, root)
        return root

    return write
