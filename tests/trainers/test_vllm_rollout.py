"""GRPO with rollout="vllm" against a fake vLLM server in its own process (tests/fake_vllm.py).

The server checks the API key, reads each adapter at load time (a copy of its safetensors is kept)
and answers completions only for the base model or a loaded adapter, as vLLM does.
"""

import pytest

from training_assets.deploy import DeploymentError
from training_assets.trainers import GrpoSpec, LoraSpec, TrainConfig, get_trainer
from training_assets.trainers.config import VllmSpec
from training_assets.vllm_client import RetryPolicy, VllmClient, VllmError

KEY_ENV = "TEST_VLLM_KEY"


@pytest.fixture
def server(fake_vllm_lib, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "k-right")  # the child reads it once at start
    (tmp_path / "loaded").mkdir()
    with fake_vllm_lib.spawn(api_key_env=KEY_ENV, base_model="base", vocab_size=len(tokenizer),
                             record_dir=tmp_path / "loaded") as srv:
        yield srv


def vllm_config(tmp_path, url, **grpo):
    vllm = VllmSpec(base_url=url, model="base", api_key_env=KEY_ENV, backoff_s=0.01, max_backoff_s=0.02)
    spec = {"rollout": "vllm", "vllm": vllm, "num_generations": 2, "max_new_tokens": 4, **grpo}
    return dict(output_dir=str(tmp_path / "out"), run_name="run", max_steps=3, batch_size=2, lr=1e-2,
                grpo=GrpoSpec(**spec), lora=LoraSpec(r=4, alpha=8))


def varied_reward(completions, **kw):
    return [float(len(c) % 5) for c in completions]  # unequal within a group: non-zero advantages


def test_the_policy_is_synced_as_versioned_adapters_and_rollouts_ask_for_the_newest(server, tmp_path, base_model_dir):
    import torch
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    server.inject("/v1/completions", [429, 503])
    server.inject("/v1/load_lora_adapter", [503])
    held = {}
    config = TrainConfig(base_model=str(base_model_dir), **vllm_config(tmp_path, server.base_url))
    trainer = get_trainer("grpo", config, reward_fn=varied_reward,
                          callbacks=(lambda step, m: held.__setitem__(step, {k: v.detach().clone() for k, v in
                                                                          get_peft_model_state_dict(trainer.model).items()}),))
    result = trainer.train(_groups())
    state = server.state()
    log = [e for e in state["log"] if e["status"] == 200]

    assert [e["model"] for e in log if e["path"] == "/v1/load_lora_adapter"] == ["run-v1", "run-v2"]  # step 3 is last
    assert result["vllm_adapters"] == ["run-v1", "run-v2"]
    newest, asked = "base", []
    for e in log:  # each generation asks for the newest adapter loaded before it
        if e["path"] == "/v1/load_lora_adapter":
            newest = e["model"]
        elif e["path"] == "/v1/completions":
            assert e["model"] == newest
            asked.append(e["model"])
    assert asked == ["base", "base", "run-v1", "run-v1", "run-v2", "run-v2"]  # 2 prompts per step
    ops = [(e["path"].rsplit("/", 1)[1], e["model"]) for e in log if "lora" in e["path"]]
    assert ops == [("load_lora_adapter", "run-v1"), ("load_lora_adapter", "run-v2"), ("unload_lora_adapter", "run-v1")]
    assert state["adapters"] == {"run-v2": str(tmp_path / "out" / "vllm_adapters" / "run-v2")}
    assert [p.name for p in (tmp_path / "out" / "vllm_adapters").iterdir()] == ["run-v2"]  # v1 removed once unloaded

    assert all(e["authorized"] for e in state["log"])  # the key went with every request
    statuses = [(e["path"], e["status"]) for e in state["log"] if e["status"] != 200]
    assert statuses == [("/v1/completions", 429), ("/v1/completions", 503), ("/v1/load_lora_adapter", 503)]
    assert result["vllm_retries"] == 3

    for load, step in zip(state["loads"], (1, 2), strict=True):  # what vLLM read is what the trainer held
        served = load_file(load["copy"])
        assert served.keys() == held[step].keys() and len(served) > 0
        for name, tensor in held[step].items():
            assert torch.equal(served[name], tensor), name
    first, second = load_file(state["loads"][0]["copy"]), load_file(state["loads"][1]["copy"])
    assert any(not torch.equal(first[k], second[k]) for k in first)  # the policy moved between versions
    assert "k-right" not in repr(result.to_dict()) and "k-right" not in config.model_dump_json()


def test_two_processes_load_each_version_once_and_every_rank_asks_for_the_newest(server, tmp_path, base_model_dir):
    """DDP over two CPU processes (torchrun, gloo): the adapter is gathered by every rank and
    loaded by rank 0 alone, and the barrier after the load keeps either rank from asking for a
    version before the server has it."""
    import json
    import subprocess
    import sys

    from training_assets import launch
    from training_assets.trainers.accelerate_launch import write_job

    groups = tmp_path / "groups.jsonl"
    groups.write_text("".join(json.dumps(g) + "\n" for g in _groups()))
    config = TrainConfig(base_model=str(base_model_dir), distributed="ddp", **{**vllm_config(tmp_path, server.base_url),
                                                                            "batch_size": 1})
    job = write_job(tmp_path / "job.json", "grpo", config.to_dict(), {"jsonl": str(groups)}, str(tmp_path / "r.json"))
    cmd = launch.build_launch_command(launch.JOB_MODULE, job, distributed="ddp", num_processes=2, cpu=True,
                                      python=sys.executable)
    done = subprocess.run(cmd, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["world_size"] == 2 and result["vllm_adapters"] == ["run-v1", "run-v2"]

    log = [e for e in server.state()["log"] if e["status"] == 200]
    ops = [(e["path"].rsplit("/", 1)[1], e["model"]) for e in log if "lora" in e["path"]]
    assert ops == [("load_lora_adapter", "run-v1"), ("load_lora_adapter", "run-v2"), ("unload_lora_adapter", "run-v1")]
    newest, asked = "base", []
    for e in log:  # in the server's arrival order, across both ranks
        if e["path"] == "/v1/load_lora_adapter":
            newest = e["model"]
        elif e["path"] == "/v1/completions":
            assert e["model"] == newest
            asked.append(e["model"])
    assert asked == ["base", "base", "run-v1", "run-v1", "run-v2", "run-v2"]  # one prompt per rank per step
    assert all(e["authorized"] for e in server.state()["log"])
    assert [p.name for p in (tmp_path / "out" / "vllm_adapters").iterdir()] == ["run-v2"]


def test_a_wrong_key_fails_before_training_naming_the_variable(server, tmp_path, base_model_dir, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "k-wrong")
    config = TrainConfig(base_model=str(base_model_dir), **vllm_config(tmp_path, server.base_url))
    with pytest.raises(VllmError, match=rf"GET {server.base_url}/v1/models answered 401 .*\${KEY_ENV}"):
        get_trainer("grpo", config, reward_fn=varied_reward).train(_groups())
    assert not (tmp_path / "out" / "final").exists()
    assert [e["authorized"] for e in server.state()["log"]] == [False]  # refused once, not retried


def test_the_last_retry_names_the_url_and_status(server):
    server.inject("/v1/completions", [503, 503])
    client = VllmClient(server.base_url, api_key_env=KEY_ENV, retry=RetryPolicy(max_attempts=2, backoff_s=0.0))
    with pytest.raises(VllmError, match=rf"POST {server.base_url}/v1/completions failed after 2 attempt\(s\); last: answered 503"):
        client.complete("base", [1, 2], n=1, max_tokens=2, temperature=1.0)
    with pytest.raises(VllmError, match="answered 404.*`run-v9` does not exist"):  # not retried: not transient
        client.complete("run-v9", [1, 2], n=1, max_tokens=2, temperature=1.0)
    assert client.retries == 1


def test_loading_a_name_twice_or_a_missing_folder_is_a_clear_error(fake_vllm_lib, tmp_path):
    import json

    import numpy as np
    from safetensors.numpy import save_file

    adapter = tmp_path / "run-v1"
    adapter.mkdir()
    save_file({"base_model.model.lora_A.weight": np.zeros((2, 4), dtype=np.float32)}, str(adapter / "adapter_model.safetensors"))
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 2}))
    server = fake_vllm_lib.FakeVllm()
    try:
        client = VllmClient(server.base_url, retry=RetryPolicy(max_attempts=2, backoff_s=0.0))
        client.load_adapter("run-v1", str(adapter))
        with pytest.raises(VllmError, match="has already been loaded.*--enable-lora"):
            client.load_adapter("run-v1", str(adapter))
        with pytest.raises(VllmError, match="answered 400.*No adapter found"):
            client.load_adapter("run-v2", str(tmp_path / "missing"))
    finally:
        server.close()
    assert server.adapters == {"run-v1": str(adapter)}


def test_sync_every_sync_steps_at_once_after_a_resume_and_never_after_the_last_step(monkeypatch, tmp_path):
    from training_assets.trainers.policy_sync import VllmPolicySync

    sync = VllmPolicySync(client=None, base_model="base", run="r", adapter_dir=tmp_path, sync_steps=2)
    synced = []
    monkeypatch.setattr(sync, "sync", lambda model, step: synced.append(step))
    sync.after_step(3, 10, None, True)  # resumed at step 3: the server must get the restored adapter now
    for step in range(4, 11):
        sync.after_step(step, 10, None, False)
    assert synced == [3, 4, 6, 8]  # 10 is the last step: no rollout follows it


def test_backoff_doubles_up_to_the_cap_with_bounded_jitter():
    policy = RetryPolicy(backoff_s=0.5, max_backoff_s=3.0, jitter=0.5)
    assert [policy.delay_s(k, 0.0) for k in range(4)] == [0.5, 1.0, 2.0, 3.0]
    assert policy.delay_s(3, 0.999) < 4.5


def test_full_fine_tune_with_vllm_rollout_is_refused_at_validation():
    with pytest.raises(ValueError, match="cannot hot-load full weights over HTTP"):
        TrainConfig(grpo=GrpoSpec(rollout="vllm", vllm=VllmSpec(base_url="http://127.0.0.1:8000", model="base")))
    with pytest.raises(ValueError, match="needs vllm.model"):
        GrpoSpec(rollout="vllm", vllm=VllmSpec(base_url="http://127.0.0.1:8000"))


def test_a_server_outside_the_allow_list_gets_no_request(monkeypatch):
    monkeypatch.delenv("TRAINING_ASSETS_DEPLOY_ALLOWED_URLS", raising=False)
    with pytest.raises(DeploymentError, match="TRAINING_ASSETS_DEPLOY_ALLOWED_URLS"):
        VllmClient("http://vllm.example:8000")
    monkeypatch.setenv("TRAINING_ASSETS_DEPLOY_ALLOWED_URLS", "http://vllm.example:8000")
    assert VllmClient("http://vllm.example:8000/v1").base_url == "http://vllm.example:8000"


def _groups():
    import json

    return [{"group_id": str(i), "prompt": json.dumps([{"role": "user", "content": f"what is {i} plus one?"}]),
             "completions": [], "rewards": [], "advantages": [], "expected_answer": str(i + 1)} for i in range(6)]
