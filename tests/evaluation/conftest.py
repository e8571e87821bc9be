"""Fixtures: a tiny random-init Qwen2 checkpoint, a locally trained tokenizer and a LoRA adapter.

Built once per session (a few seconds) and shared read-only by the tests; nothing is downloaded.
"""

import pytest

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] or '' }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]


def build_tokenizer(out_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [
        "What is 12 * 7 + 3? The answer is 87.",
        "Convert 10 miles to kilometers. The tool returned 16.09. The answer is 16.09 km.",
        'calculator {"expression": "12 * 7 + 3"} sort these words: apple, pear, fig, kiwi',
        "I cannot help with that request. I am not able to share secrets.",
    ] * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", bos_token="<|bos|>",
                                   eos_token="<|end|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def build_model(out_dir, tokenizer, seed=0):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.bos_token_id, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return model


def build_adapter(out_dir, base_dir, seed=1):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False))
    peft_model.save_pretrained(out_dir)


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """``{"tokenizer", "base", "adapter"}`` dirs: a full tiny model and a LoRA adapter on it."""
    root = tmp_path_factory.mktemp("tiny")
    tokenizer = build_tokenizer(root / "tokenizer")
    build_model(root / "base", tokenizer)
    build_adapter(root / "adapter", root / "base")
    return {"tokenizer": root / "tokenizer", "base": root / "base", "adapter": root / "adapter"}


def write_manifest(root, asset_key, kind, checkpoint_dir, base_model_dir, tokenizer_dir, data_versions=None,
                   run_id="mlflow-run-1", data_version=None, examples=None):
    """Write a checkpoint manifest through the manifest module, as the trainers do."""
    from training_assets.checkpoint_manifest import CheckpointManifest, TrainSummary, write_asset_manifest

    manifest = CheckpointManifest(
        asset=asset_key, kind=kind, checkpoint_dir=str(checkpoint_dir),
        base_model_dir=str(base_model_dir) if base_model_dir else None, tokenizer_dir=str(tokenizer_dir),
        data_version=data_version or f"dv-{asset_key}", data_versions=data_versions or {"sft_dataset": "v-sft"},
        train=TrainSummary(steps=3, final_loss=5.0), config={"lr": 1e-3}, tracker="mlflow", tracker_run_id=run_id,
        dagster_run_id="dagster-run-1", examples=examples or {})
    write_asset_manifest(root, manifest)
    return manifest


@pytest.fixture
def upstream(data_root, tiny_checkpoints):
    """A data root holding what the eval/registry stages read: a curated corpus from two trace
    batches, the tokenizer asset and the checkpoint manifests base -> sft -> dpo/grpo -> merged."""
    import shutil

    import pyarrow as pa

    from training_assets.data_engine import corpus
    from training_assets.storage import write_json_atomic, write_parquet
    from training_assets.training_data import io as training_io

    folder = data_root / corpus.CORPUS_ASSET
    folder.mkdir()
    rows = [{"id": f"t{i}", "text": "x", "source": "traces", "trace_id": f"t{i}", "task_id": "k",
             "batch_id": b, "cluster_size": 1, "n_chars": 1} for i, b in enumerate(["traces-0001-aa", "traces-0002-bb", "traces-0001-aa"])]
    rows.append({**rows[0], "id": "extra:0", "trace_id": None, "batch_id": None, "source": "extra"})
    write_parquet(folder / corpus.CORPUS_FILE, pa.Table.from_pylist(rows, schema=corpus.CORPUS_SCHEMA))
    write_json_atomic(folder / corpus.VERSION_FILE, {"id": "corpus-v1"})
    shutil.copytree(tiny_checkpoints["tokenizer"], data_root / "tokenizer")
    # each dataset's rows name the batches they came from; traces-0003-cc only reaches rows past the
    # SFT run's limit and the last GRPO group's, so nothing the model trained on came from it
    sources = {"pretrain_windows": [["traces-0001-aa"], ["traces-0001-aa", "traces-0002-bb"]],
               "sft_dataset": [["traces-0001-aa"], ["traces-0003-cc"]],
               "preference_pairs": [["traces-0002-bb", "traces-0001-aa"]],
               "grpo_groups": [["traces-0002-bb"]]}
    for name, batches in sources.items():
        schema = training_io.SCHEMAS[name]
        rows = [{f.name: [] if pa.types.is_list(f.type) else None for f in schema} | {"id": f"{name}-{i}", "source_batches": b}
                for i, b in enumerate(batches)]
        training_io.write_dataset(name, training_io.rows_to_table(name, rows), {"fixture": name}, {}, data_root)
    limits = {"sft_dataset": 1}
    base, adapter, tok = tiny_checkpoints["base"], tiny_checkpoints["adapter"], tiny_checkpoints["tokenizer"]
    chain = {
        "base_checkpoint": ("full", base, None, {"tokenizer": "tok-1", "pretrain_windows": "pw-1"}),
        "sft_checkpoint": ("full", base, None, {"tokenizer": "tok-1", "sft_dataset": "sft-1", "base_checkpoint": "dv-base_checkpoint"}),
        "dpo_checkpoint": ("adapter", adapter, base, {"preference_pairs": "pp-1", "sft_checkpoint": "dv-sft_checkpoint"}),
        "grpo_checkpoint": ("adapter", adapter, base, {"grpo_groups": "gg-1", "sft_checkpoint": "dv-sft_checkpoint"}),
        "merged_adapter": ("adapter", adapter, base, {"dpo_checkpoint": "dv-dpo_checkpoint", "grpo_checkpoint": "dv-grpo_checkpoint"}),
    }
    for key, (kind, ckpt, base_dir, versions) in chain.items():
        dataset = next((d for d in versions if d in sources), None)
        examples = {"dataset": dataset, "root": str(data_root), "limit": limits.get(dataset)} if dataset else {}
        write_manifest(data_root, key, kind, ckpt, base_dir, tok, versions, run_id=f"mlflow-{key}", examples=examples)
    return data_root


@pytest.fixture
def fake_vllm(fake_vllm_lib):
    server = fake_vllm_lib.FakeVllm()
    yield server
    server.close()


@pytest.fixture
def keyed_vllm(fake_vllm_lib):
    server = fake_vllm_lib.FakeVllm(api_key="s3cret")
    yield server
    server.close()


@pytest.fixture
def refusing_vllm(fake_vllm_lib):
    server = fake_vllm_lib.FakeVllm(refuse_load=True)
    yield server
    server.close()


@pytest.fixture
def closed_port_url():
    """A 127.0.0.1 URL nothing listens on (the port was bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def manifest_writer():
    """``write_manifest`` as a fixture (test modules cannot import conftest under importlib mode)."""
    return write_manifest


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory):
    """An initialised, empty MLflow SQLite store (``tracking.store_template``: MLflow's migrations
    run once per host, copying takes milliseconds)."""
    from training_assets.tracking import store_template

    return store_template()


@pytest.fixture
def tracking_uri(tmp_path, mlflow_template):
    """A fresh MLflow store for one test."""
    import shutil

    store = tmp_path / "mlflow"
    store.mkdir()
    shutil.copy(mlflow_template, store / "mlflow.db")
    return f"sqlite:///{store / 'mlflow.db'}"
