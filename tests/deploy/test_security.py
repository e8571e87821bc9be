"""Security defaults that are properties of the source: nothing unpickles a file it did not make
safely, nothing runs code shipped inside a model directory, the local UI binds loopback, and no
client that sends a key follows a redirect or connects elsewhere than the host its check parsed."""

import ast
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(REPO / "training_assets").rglob("*.py"), *(REPO / "kernels").rglob("*.py")])


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    return ""


def keyword(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name and isinstance(kw.value, ast.Constant):
            return kw.value.value
    return None


def unsafe_loads(source: str) -> list[str]:
    """Each call that can execute code from a file's contents, with why."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = dotted(node.func)
        where = f"line {node.lineno}: {name}"
        if name in {"pickle.load", "pickle.loads", "cloudpickle.load", "cloudpickle.loads", "dill.load",
                    "dill.loads", "joblib.load", "pd.read_pickle", "pandas.read_pickle", "torch.serialization.load"}:
            found.append(f"{where} unpickles")
        elif name == "torch.load" and keyword(node, "weights_only") is not True:
            found.append(f"{where} without weights_only=True")
        elif name in {"np.load", "numpy.load"} and keyword(node, "allow_pickle") is True:
            found.append(f"{where} with allow_pickle=True")
        elif keyword(node, "trust_remote_code") is True:
            found.append(f"{where} with trust_remote_code=True")
        elif keyword(node, "use_safetensors") is False:
            found.append(f"{where} with use_safetensors=False")
    return found


def test_the_checker_catches_each_unsafe_pattern():
    bad = """
import pickle, torch, numpy as np
pickle.load(f)
torch.load(p)
torch.load(p, weights_only=False)
np.load(p, allow_pickle=True)
AutoModel.from_pretrained(d, trust_remote_code=True)
AutoModel.from_pretrained(d, use_safetensors=False)
"""
    assert len(unsafe_loads(bad)) == 6
    assert unsafe_loads("import torch\ntorch.load(p, weights_only=True)\nnp.load(p)\n") == []


def test_no_source_file_unpickles_or_runs_shipped_code():
    assert SOURCES, "no sources found"
    problems = {str(p.relative_to(REPO)): unsafe_loads(p.read_text(encoding="utf-8")) for p in SOURCES}
    problems = {path: found for path, found in problems.items() if found}
    assert not problems, f"unsafe deserialisation: {problems}"


def test_local_ui_binds_loopback():
    makefile = (REPO / "Makefile").read_text()
    ui_lines = [line for line in makefile.splitlines() if "dagster dev" in line or "dagster-webserver" in line]
    assert ui_lines and all("-h 127.0.0.1" in line for line in ui_lines), ui_lines


def test_registry_entry_takes_its_server_from_the_deployment_resource(tmp_path, monkeypatch):
    """A run config naming a server the instance does not allow fails before anything is read or sent."""
    import dagster as dg

    from training_assets.defs.registry.assets import registry_entry
    from training_assets.defs.registry.resources import VllmDeployment
    from training_assets.defs.resources import DataRoot, MlflowTracking

    monkeypatch.delenv("VLLM_BASE_URL", raising=False)
    monkeypatch.setenv("TRAINING_ASSETS_DEPLOY_ALLOWED_URLS", "http://vllm:8000")
    resources = {"data_root": DataRoot(path=str(tmp_path)), "deployment": VllmDeployment(),
                 "mlflow": MlflowTracking(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")}
    result = dg.materialize([registry_entry], resources=resources, raise_on_error=False,
                            run_config={"ops": {"registry_entry": {"config": {"base_url": "http://evil.example:8000"}}}})
    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    text = str(failure.step_failure_data.error)
    assert "base_url" in text and "not in the allow-list ['http://vllm:8000']" in text
    # the resource's own server and the listed ones are what a run may use
    resource = VllmDeployment(base_url="http://vllm:8000/v1", allowed_urls=["https://models.internal"])
    assert resource.target("generator", "agent").base_url == "http://vllm:8000"
    assert resource.target("generator", "agent", "https://models.internal/v1").base_url == "https://models.internal"
    with pytest.raises(dg.Failure, match="not in the allow-list"):
        resource.target("generator", "agent", "http://127.0.0.1:8000")


class _Recorder(BaseHTTPRequestHandler):
    """Answers what the test set on its server (``answer``: status, headers, body) and records each request."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.server.seen.append({"path": self.path, "authorization": self.headers.get("Authorization"),
                                 "body": self.rfile.read(length)})
        status, headers, body = self.server.answer
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        return None


@pytest.fixture
def loopback_server():
    """``start(status, headers, body)``: a real HTTP server on 127.0.0.1 in a thread; ``.seen`` its requests."""
    servers = []

    def start(status=200, headers=None, body=b"{}"):
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
        httpd.answer, httpd.seen = (status, headers or {}, body), []
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return httpd

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def _clients():
    """Each client that sends a key, as ``(name, call(base_url), error type)``."""
    from training_assets.agent.driver import ChatEndpoint
    from training_assets.agent.errors import AgentError
    from training_assets.deploy import DeploymentError, served_models
    from training_assets.vllm_client import RetryPolicy, VllmClient, VllmError

    return [("deploy", lambda url: served_models(url), DeploymentError),
            ("vllm_client", lambda url: VllmClient(url, retry=RetryPolicy(max_attempts=3, backoff_s=0.0))
             .complete("m", [1], n=1, max_tokens=1, temperature=1.0), VllmError),
            ("agent", lambda url: ChatEndpoint(f"{url}/v1", "m", api_key="s3cret").complete([], []), AgentError)]


@pytest.mark.parametrize("status", [302, 307])
def test_no_client_that_sends_a_key_follows_a_redirect(loopback_server, monkeypatch, status):
    """A server that may get the key answers 3xx to another server: the request ends there, one clear
    error naming the endpoint and where it pointed; the other server never sees a request (nor the key)."""
    monkeypatch.setenv("VLLM_API_KEY", "s3cret")
    monkeypatch.delenv("TRAINING_ASSETS_DEPLOY_ALLOWED_URLS", raising=False)  # loopback: both servers allowed
    elsewhere = loopback_server()
    location = f"http://localhost:{elsewhere.server_port}/stolen"
    redirecting = loopback_server(status, {"Location": location})
    base = f"http://127.0.0.1:{redirecting.server_port}"
    for name, call, error in _clients():
        with pytest.raises(Exception) as raised:
            call(base)
        assert elsewhere.seen == [], f"{name} followed the redirect: {elsewhere.seen}"
        message = str(raised.value)
        assert isinstance(raised.value, error) and f"answered {status} redirect to {location}" in message, (name, message)
        assert base in message and "point the URL at the final server" in message and "\n" not in message, message
    assert [r["authorization"] for r in redirecting.seen] == ["Bearer s3cret"] * 3, "one request each, not retried"


def test_a_url_that_parses_two_ways_or_carries_user_info_is_refused_before_any_request(loopback_server, monkeypatch):
    """``urlsplit`` reads ``http://169.254.169.254\\@127.0.0.1/`` as host 127.0.0.1 (loopback: allowed), other
    HTTP libraries as 169.254.169.254: such a URL never passes the allow-list, whatever it would reach."""
    from training_assets.deploy import DeploymentError, require_allowed

    monkeypatch.setenv("VLLM_API_KEY", "s3cret")
    monkeypatch.delenv("TRAINING_ASSETS_DEPLOY_ALLOWED_URLS", raising=False)
    server = loopback_server()
    port = server.server_port
    with pytest.raises(DeploymentError, match="backslash"):
        require_allowed(f"http://169.254.169.254\\@127.0.0.1:{port}/")
    with pytest.raises(DeploymentError, match=r"user info \(user@host\)"):
        require_allowed(f"http://user:pw@127.0.0.1:{port}/")
    for name, call, error in _clients():
        for url in (f"http://169.254.169.254\\@127.0.0.1:{port}", f"http://user:pw@127.0.0.1:{port}"):
            with pytest.raises((error, DeploymentError), match="backslash|user info"):  # VllmClient: the allow-list
                call(url)
    assert server.seen == []
    assert require_allowed(f"http://[::1]:{port}/v1/models").origin == ("http", "::1", port)
