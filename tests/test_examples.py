"""The seed's examples (``examples/``) run as written, module renamed and a tiny base in place of the real one."""

import json
import runpy
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def run_example(tmp_path, data_root, monkeypatch):
    """``run_example(name)``: the example's globals after running it as ``__main__`` in ``tmp_path``.

    One torch thread, as in tests/trainers: two spinning OpenMP threads on a shared 2-core host ran
    ~20x slower.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRAINING_ASSETS_MODELS", str(tmp_path / "models"))
    monkeypatch.syspath_prepend(str(EXAMPLES))  # `from _tiny import ...`, as `python examples/x.py` finds it
    monkeypatch.delitem(sys.modules, "_tiny", raising=False)  # it reads $TRAINING_ASSETS_MODELS at import

    def run(name):
        return runpy.run_path(str(EXAMPLES / name), run_name="__main__")

    yield run
    torch.set_num_threads(threads)


@pytest.fixture
def vllm_on_8000(fake_vllm_lib):
    """A stand-in for the seed's "running vLLM" at localhost:8000 (the port its example names)."""
    try:
        server = fake_vllm_lib.FakeVllm(port=8000)
    except OSError as exc:
        pytest.skip(f"127.0.0.1:8000 is taken ({exc}); the seed's pipeline example deploys to that address")
    yield server
    server.close()


def test_build_plan_train_from_plain_trace_dicts(run_example):
    done = run_example("train_from_traces.py")
    assert isinstance(done["traces"][0], dict) and len(done["examples"]) > 0
    for trainer, result, data in ((done["trainer"], done["report"], done["examples"]),
                                  (done["dpo"], done["dpo_report"], done["pairs"]),
                                  (done["grpo"], done["grpo_report"], done["groups"])):
        plan = trainer.plan(data)
        assert plan["planned_steps"] == -(-len(data) // 8) and plan["effective_batch"] == 8  # epochs=1, batch 8
        assert result["steps"] == plan["planned_steps"] == len(result["losses"])
        assert result["final_loss"] == result["losses"][-1] and Path(result["checkpoint_dir"]).is_dir()
    assert done["report"]["final_loss"] < done["report"]["losses"][0]  # SFT learns something in one epoch


def test_sft_pipeline_registers_and_deploys_idempotently(run_example, vllm_on_8000):
    first = run_example("sft_pipeline.py")
    report = first["report"]
    assert set(report) == {"data", "plan", "train", "eval", "checkpoint", "deployment"}
    assert report["data"]["examples"] > 0 and report["train"]["steps"] == report["plan"]["planned_steps"]
    assert report["checkpoint"]["kind"] == "adapter" and report["eval"]["n_cases"] == 32
    deployment = report["deployment"]
    assert deployment["deployment"]["status"] == "loaded" and deployment["base_url"] == "http://localhost:8000"
    assert "qwen2.5-1.5b-openseeker" in vllm_on_8000.adapters
    assert not any(c[1].startswith("/v1/v1") for c in vllm_on_8000.calls)  # the seed's /v1 is not doubled

    again = run_example("sft_pipeline.py")["report"]["deployment"]
    assert again["version"] == deployment["version"] and again["note"].startswith("already registered")
    assert first["my_registry"].pick_for_role("generator").checkpoint_id == "openseeker-sft-v1"
    assert len(first["my_registry"].list()) == 1


def test_pretrain_pipeline_trains_its_tokenizer_first(run_example, tmp_path):
    done = run_example("pretrain_from_scratch.py")
    report = done["report"]
    assert report.data["documents"] == len(done["curated_records"]) and report.data["windows"] > 0
    manifest = report.checkpoint
    assert manifest["kind"] == "full" and manifest["tokenizer_dir"] == str(tmp_path / "models" / "tiny-lm" / "tokenizer")
    assert manifest["config"]["precision"] == "bf16" and manifest["config"]["pretrain"]["hidden_size"] == 64
    assert manifest["config"]["lr_scheduler"] == "cosine" and report.train["steps"] == report.plan["planned_steps"] > 0
    assert json.loads((tmp_path / "models" / "tiny-lm" / "manifest.json").read_text()) == manifest


def test_scale_out_writes_the_fsdp_config_and_the_launch_command(run_example, tmp_path):
    from accelerate.commands.config.config_args import ClusterConfig

    done = run_example("scale_out.py")
    assert ClusterConfig.from_yaml_file(str(tmp_path / "fsdp.yaml")).distributed_type.value == "FSDP"
    assert ClusterConfig.from_yaml_file(str(tmp_path / "zero3.yaml")).distributed_type.value == "DEEPSPEED"
    cmd = done["cmd"]
    assert cmd[:5] == ["python", "-m", "accelerate.commands.launch", "--config_file", "fsdp.yaml"]
    assert cmd[-2:] == ["-m", "training_assets.trainers.pretrain_trainer"]
    node = done["node_cmd"]
    assert node[node.index("--num_machines") + 1] == "2" and node[node.index("--main_process_ip") + 1] == "10.0.0.1"


def test_examples_are_the_seed_text_with_the_module_renamed():
    """Each seed code line the examples reproduce appears in them verbatim (after the rename)."""
    seed_lines = [
        'examples = td.build_sft_examples(traces)',
        'print(trainer.plan(examples))   # {planned_steps, effective_batch, ...}',
        'report = trainer.train(examples)   # {steps, losses, final_loss, ...}',
        'from training_assets.training_pipeline import run_sft_pipeline, DeploymentTarget',
        'from training_assets.trainers import TrainConfig, peft_manager',
        'base_url="http://localhost:8000/v1",    # the running vLLM',
        'checkpoint_id="openseeker-sft-v1",',
        'train_tokenizer_first=True,             # BPE tokenizer trained on the corpus',
        'write_config(fsdp_accelerate_config(num_processes=8, mixed_precision="bf16"), "fsdp.yaml")',
        'cmd = build_launch_command("training_assets.trainers.pretrain_trainer",',
    ]
    text = "\n".join(p.read_text() for p in EXAMPLES.glob("*.py"))
    missing = [line for line in seed_lines if line not in text]
    assert missing == []
    assert "data_science_mcp" not in text
