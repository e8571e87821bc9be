"""docker-compose.yml and deploy/dagster.yaml: valid for a compose client, and secure by default."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / "deploy" / "env.example"


def compose_command() -> list[str]:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    reason = ("no compose client: neither `docker-compose` (Debian package docker-compose) nor the "
              "`docker compose` plugin is installed; .ci/run installs the former")
    print(f"SKIP: {reason}")
    pytest.skip(reason)


def compose(*args: str, env_file: Path, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # a clean environment: only what the env file (and extra_env) provides reaches interpolation
    env = {"PATH": "/usr/bin:/bin:/usr/local/bin", **(extra_env or {})}
    return subprocess.run([*compose_command(), "-f", str(COMPOSE_FILE), "--env-file", str(env_file), *args],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=60)


@pytest.fixture(scope="module")
def rendered() -> dict:
    checked = compose("--profile", "gpu", "config", "-q", env_file=ENV_EXAMPLE)
    assert checked.returncode == 0, checked.stderr
    out = compose("--profile", "gpu", "config", env_file=ENV_EXAMPLE)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def test_compose_file_has_every_service_and_the_gpu_profile(rendered):
    services = rendered["services"]
    assert {"postgres", "dagster-migrate", "mlflow", "code-location", "webserver", "daemon",
            "code-location-gpu", "vllm"} <= set(services)
    assert services["vllm"]["profiles"] == ["gpu"] and services["code-location-gpu"]["profiles"] == ["gpu"]
    for name in ("vllm", "code-location-gpu"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"], name
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    for name in ("code-location", "code-location-gpu"):
        assert services[name]["command"][:5] == ["dagster", "code-server", "start", "-m", "training_assets.definitions"]
    assert set(rendered["volumes"]) >= {"postgres_data", "mlflow_artifacts", "training_data"}
    assert "training_data:/data" in " ".join(
        f"{v['source']}:{v['target']}" if isinstance(v, dict) else v for v in services["code-location"]["volumes"])


def test_only_the_uis_and_model_servers_publish_ports_and_only_on_loopback(rendered):
    services = rendered["services"]
    published = {name: s.get("ports", []) for name, s in services.items() if s.get("ports")}
    assert set(published) == {"webserver", "mlflow", "vllm", "model-server"}, published
    for name, ports in published.items():
        for port in ports:
            text = port if isinstance(port, str) else f"{port.get('host_ip', '')}:{port['published']}"
            assert text.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


def test_mlflow_accepts_its_service_name_as_host(rendered):
    command = " ".join(rendered["services"]["mlflow"]["command"])
    hosts = re.search(r"--allowed-hosts=(\S+)", command).group(1).split(",")
    assert "mlflow:5000" in hosts and "mlflow" in hosts
    assert "postgresql" in rendered["services"]["mlflow"]["environment"]["MLFLOW_BACKEND_STORE_URI"]


def test_secrets_come_only_from_the_environment(tmp_path):
    empty = tmp_path / "empty.env"
    empty.write_text("")
    token, key = "pw-9f3a1c77e2", "vk-51d0aa3b"
    refused = compose("config", "-q", env_file=empty, extra_env={"VLLM_API_KEY": key})
    assert refused.returncode != 0 and "POSTGRES_PASSWORD" in refused.stderr
    accepted = compose("config", env_file=empty, extra_env={"POSTGRES_PASSWORD": token, "VLLM_API_KEY": key})
    assert accepted.returncode == 0, accepted.stderr
    assert token in accepted.stdout and key in accepted.stdout
    # and no password is written into any file we ship
    for path in (COMPOSE_FILE, REPO / "deploy" / "dagster.yaml", REPO / "Dockerfile"):
        for line in path.read_text().splitlines():
            if re.search(r"(?i)password", line) and ":" in line and not line.lstrip().startswith("#"):
                value = line.split(":", 1)[1]
                assert "${" in value or "{env:" in value or "$$" in value or "POSTGRES_PASSWORD" in value, \
                    f"{path.name}: literal secret? {line.strip()}"


def test_vllm_refuses_to_start_without_an_api_key(tmp_path):
    """Runtime LoRA loading is on: a vLLM without a bearer token would let anyone load adapters."""
    env = tmp_path / "no-key.env"
    env.write_text("POSTGRES_PASSWORD=pw-1\n")
    refused = compose("--profile", "gpu", "config", "-q", env_file=env)
    assert refused.returncode != 0 and "VLLM_API_KEY" in refused.stderr
    blank = compose("--profile", "gpu", "config", "-q", env_file=env, extra_env={"VLLM_API_KEY": ""})
    assert blank.returncode != 0 and "VLLM_API_KEY" in blank.stderr, "an empty key is no key"


def test_vllm_sees_what_the_registry_serves_and_only_allowed_servers_are_called(rendered):
    services = rendered["services"]
    code = services["code-location"]["environment"]
    vllm = services["vllm"]
    assert vllm["environment"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True" and vllm["environment"]["VLLM_API_KEY"]
    mounts = [v if isinstance(v, dict) else dict(zip(("source", "target", "mode"), v.split(":") + ["rw"]))
              for v in vllm["volumes"]]
    [data] = [m for m in mounts if m["source"] == "training_data"]
    assert data["target"] == "/data" and (data.get("read_only") or data.get("mode") == "ro")
    serve_dir = code["TRAINING_ASSETS_SERVE_DIR"]
    assert serve_dir.startswith("/data/"), "the registry downloads into the volume vLLM mounts"
    command = " ".join(vllm["command"])
    assert f"--model={serve_dir}/" in command and f"--tokenizer={serve_dir}/" in command
    assert "--serve-artifacts" in services["mlflow"]["command"]
    allowed = code["TRAINING_ASSETS_DEPLOY_ALLOWED_URLS"].split(",")
    assert allowed == ["http://vllm:8000"] and code["VLLM_BASE_URL"].startswith(allowed[0])
    assert code["VLLM_API_KEY"] == vllm["environment"]["VLLM_API_KEY"]


def test_production_instance_config():
    config = yaml.safe_load((REPO / "deploy" / "dagster.yaml").read_text())
    db = config["storage"]["postgres"]["postgres_db"]
    assert all(isinstance(db[k], dict) and "env" in db[k] for k in ("hostname", "db_name", "username", "password"))
    coordinator = config["run_coordinator"]
    assert coordinator["class"] == "QueuedRunCoordinator"
    assert "tag_concurrency_limits" not in coordinator["config"]  # the training pool limits training steps
    assert config["concurrency"]["pools"] == {"default_limit": 1, "granularity": "op"}
    assert config["run_monitoring"]["enabled"] and config["run_retries"]["enabled"]
    assert config["run_retries"]["max_retries"] >= 1
    workspace = yaml.safe_load((REPO / "deploy" / "workspace.yaml").read_text())
    assert workspace["load_from"][0]["grpc_server"]["location_name"] == "training_assets"


def test_ray_profile_runs_head_workers_and_a_driving_code_location_on_one_image():
    out = compose("--profile", "ray", "config", env_file=ENV_EXAMPLE)
    assert out.returncode == 0, out.stderr
    services = yaml.safe_load(out.stdout)["services"]
    ray_services = ("ray-head", "ray-worker", "code-location-ray")
    for name in ray_services:
        s = services[name]
        assert s["profiles"] == ["ray"] and not s.get("ports"), name  # the GCS stays on the compose network
        assert s["image"] == "training-assets/code-ray:latest", name
        assert "training_data:/data" in " ".join(
            f"{v['source']}:{v['target']}" if isinstance(v, dict) else v for v in s["volumes"]), name
    assert services["ray-head"]["build"]["args"]["EXTRAS"].split(",")[-1] == "scale"
    assert "--address=ray-head:6379" in services["ray-worker"]["command"]
    assert services["code-location-ray"]["environment"]["RAY_ADDRESS"] == "ray-head:6379"


def test_kuberay_cluster_pins_the_projects_ray_version():
    pin = re.search(r'"ray==([\d.]+)"', (REPO / "pyproject.toml").read_text()).group(1)
    cluster, claim = yaml.safe_load_all((REPO / "deploy" / "kuberay" / "raycluster.yaml").read_text())
    assert cluster["kind"] == "RayCluster" and cluster["spec"]["rayVersion"] == pin
    pods = [cluster["spec"]["headGroupSpec"]["template"]] + [g["template"] for g in cluster["spec"]["workerGroupSpecs"]]
    for pod in pods:
        mounts = {m["mountPath"]: m["name"] for c in pod["spec"]["containers"] for m in c["volumeMounts"]}
        assert mounts["/data"] == "data"
        claims = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in pod["spec"]["volumes"]}
        assert claims["data"] == claim["metadata"]["name"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_the_model_servers_speak_the_one_tool_call_format_on_loopback(rendered):
    assert {"--enable-auto-tool-choice", "--tool-call-parser=hermes"} <= set(rendered["services"]["vllm"]["command"])
    out = compose("--profile", "serve", "config", env_file=ENV_EXAMPLE)
    assert out.returncode == 0, out.stderr
    server = yaml.safe_load(out.stdout)["services"]["model-server"]
    assert server["command"][3:4] == ["serve"] and "--continuous-batching" in server["command"]
    for port in server["ports"]:
        text = port if isinstance(port, str) else f"{port.get('host_ip', '')}:{port['published']}"
        assert text.startswith("127.0.0.1:"), port
