"""The vLLM deploy seam against a local server speaking vLLM's endpoints (vLLM itself needs a GPU)."""

import pytest

from training_assets.deploy import DeploymentError, DeploymentTarget, deploy, served_models
from training_assets.registry import ModelRegistry, RegistryError, register_checkpoint, uri_path


@pytest.fixture
def registry(tracking_uri):
    return ModelRegistry(tracking_uri)


def test_adapter_is_loaded_at_runtime_and_verified(registry, tiny_checkpoints, fake_vllm):
    target = DeploymentTarget("generator", "agent", fake_vllm.base_url)
    entry = register_checkpoint(registry, tiny_checkpoints["adapter"], target, "ck-1")
    assert entry.deployment["status"] == "loaded"
    assert [c[:2] for c in fake_vllm.calls] == [("GET", "/v1/models"), ("POST", "/v1/load_lora_adapter"),
                                                ("GET", "/v1/models")]
    assert fake_vllm.adapters == {"agent": str(uri_path(entry.adapter_uri))}
    assert "agent" in served_models(fake_vllm.base_url)
    assert registry.pick_for_role("generator").deployment["status"] == "loaded"


def test_a_new_version_replaces_the_adapter_and_rollback_restores_it(registry, tiny_checkpoints, fake_vllm, tmp_path):
    import shutil

    other = tmp_path / "adapter2"
    shutil.copytree(tiny_checkpoints["adapter"], other)
    target = DeploymentTarget("generator", "agent", fake_vllm.base_url)
    first = register_checkpoint(registry, tiny_checkpoints["adapter"], target, "ck-1")
    second = register_checkpoint(registry, other, target, "ck-2")
    assert fake_vllm.adapters["agent"] == str(uri_path(second.adapter_uri))
    registry.rollback("generator", target=target)
    assert fake_vllm.adapters["agent"] == str(uri_path(first.adapter_uri))
    assert registry.pick_for_role("generator").version == first.version


def test_an_openai_style_base_url_is_the_server_root(tiny_checkpoints, fake_vllm):
    """The seed writes base_url="http://localhost:8000/v1": the endpoints must not become /v1/v1/..."""
    target = DeploymentTarget("generator", "agent", fake_vllm.base_url + "/v1/")
    assert target.base_url == fake_vllm.base_url
    assert deploy(target, tiny_checkpoints["adapter"], tiny_checkpoints["base"]).status == "loaded"
    assert [c[1] for c in fake_vllm.calls] == ["/v1/models", "/v1/load_lora_adapter", "/v1/models"]


def test_redeploying_what_the_server_already_serves_changes_nothing(tiny_checkpoints, fake_vllm):
    target = DeploymentTarget("generator", "agent", fake_vllm.base_url)
    deploy(target, tiny_checkpoints["adapter"], tiny_checkpoints["base"])
    again = deploy(target, tiny_checkpoints["adapter"], tiny_checkpoints["base"])
    assert again.status == "already_loaded"
    assert sum(1 for c in fake_vllm.calls if c[0] == "POST") == 1


def test_unreachable_server_is_a_clear_error_and_nothing_is_registered(registry, tiny_checkpoints, closed_port_url):
    target = DeploymentTarget("generator", "agent", closed_port_url)
    with pytest.raises(DeploymentError, match="unreachable.*VLLM_ALLOW_RUNTIME_LORA_UPDATING.*nothing registered"):
        register_checkpoint(registry, tiny_checkpoints["adapter"], target, "ck-1")
    assert registry.list() == []
    with pytest.raises(RegistryError):
        registry.pick_for_role("generator")


def test_server_refusing_the_adapter_registers_nothing(registry, tiny_checkpoints, refusing_vllm):
    target = DeploymentTarget("generator", "agent", refusing_vllm.base_url)
    with pytest.raises(DeploymentError, match="refused to load adapter 'agent'.*LoRA is not enabled"):
        register_checkpoint(registry, tiny_checkpoints["adapter"], target, "ck-1")
    assert registry.list() == []


def test_registry_failure_after_the_load_unloads_the_adapter(registry, tiny_checkpoints, fake_vllm, monkeypatch):
    create = registry.client.create_model_version

    def broken(name, *args, **kwargs):  # the base registers; the adapter's own version fails
        if name == "agent-model":
            raise RuntimeError("registry down")
        return create(name, *args, **kwargs)

    monkeypatch.setattr(registry.client, "create_model_version", broken)
    target = DeploymentTarget("generator", "agent", fake_vllm.base_url)
    with pytest.raises(RegistryError, match="registry down.*deployment: unloaded agent"):
        register_checkpoint(registry, tiny_checkpoints["adapter"], target, "ck-1")
    assert fake_vllm.adapters == {}
    monkeypatch.undo()
    assert registry.list() == []
    assert registry.client.search_model_versions("name='agent-model-base'") == [], "the base it created is gone too"


def test_full_model_or_no_server_records_the_exact_serve_command(tiny_checkpoints, fake_vllm):
    full = deploy(DeploymentTarget("generator", "agent", fake_vllm.base_url), tiny_checkpoints["base"], None)
    assert full.status == "command_recorded"
    assert full.serve_command == f"vllm serve {tiny_checkpoints['base']} --served-model-name agent"
    offline = deploy(DeploymentTarget("generator", "agent"), tiny_checkpoints["adapter"], tiny_checkpoints["base"])
    assert offline.status == "command_recorded" and fake_vllm.adapters == {}
    assert f"--enable-lora --lora-modules agent={tiny_checkpoints['adapter']} --max-lora-rank 64" in offline.serve_command


def test_api_key_from_the_environment_is_sent(tiny_checkpoints, keyed_vllm, monkeypatch):
    target = DeploymentTarget("generator", "agent", keyed_vllm.base_url)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with pytest.raises(DeploymentError):
        deploy(target, tiny_checkpoints["adapter"], tiny_checkpoints["base"])
    monkeypatch.setenv("VLLM_API_KEY", "s3cret")
    assert deploy(target, tiny_checkpoints["adapter"], tiny_checkpoints["base"]).status == "loaded"


def test_a_server_outside_the_allow_list_gets_no_request_and_no_key(tiny_checkpoints, keyed_vllm, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "s3cret")
    listed = DeploymentTarget("generator", "agent", keyed_vllm.base_url, allowed_urls=("http://vllm:8000",))
    with pytest.raises(DeploymentError, match=r"not in the allow-list \['http://vllm:8000'\]"):
        deploy(listed, tiny_checkpoints["adapter"], tiny_checkpoints["base"])
    monkeypatch.setenv("TRAINING_ASSETS_DEPLOY_ALLOWED_URLS", "http://vllm:8000, https://models.internal")
    with pytest.raises(DeploymentError, match="TRAINING_ASSETS_DEPLOY_ALLOWED_URLS"):
        deploy(DeploymentTarget("generator", "agent", keyed_vllm.base_url), tiny_checkpoints["adapter"], tiny_checkpoints["base"])
    assert keyed_vllm.calls == [], "nothing was sent to a server that is not allowed"
    monkeypatch.setenv("TRAINING_ASSETS_DEPLOY_ALLOWED_URLS", f"http://vllm:8000,{keyed_vllm.base_url}/v1")
    assert deploy(DeploymentTarget("generator", "agent", keyed_vllm.base_url), tiny_checkpoints["adapter"],
                  tiny_checkpoints["base"]).status == "loaded"


def test_without_an_allow_list_only_loopback_servers_are_called(tiny_checkpoints, monkeypatch):
    from training_assets.deploy import require_allowed

    monkeypatch.delenv("TRAINING_ASSETS_DEPLOY_ALLOWED_URLS", raising=False)
    for url in ("http://localhost:8000", "http://127.0.0.1:9", "http://[::1]:8000"):
        require_allowed(url)
    with pytest.raises(DeploymentError, match="only loopback servers are"):
        deploy(DeploymentTarget("generator", "agent", "http://attacker.example:8000/v1"), tiny_checkpoints["adapter"],
               tiny_checkpoints["base"])
    with pytest.raises(DeploymentError, match="not an http"):
        require_allowed("file:///etc/passwd")
