"""`training-assets mcp` as a real process: stdio (what an MCP client launches) and streamable HTTP with a
bearer token; a non-loopback bind address without a token is refused."""

import os
import signal
import subprocess
import time

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.agent.conftest import BIN, REPO, error_text, free_port
from training_assets.agent.tools import TOOLS


def _child_env(agent_env: dict, **extra: str) -> dict[str, str]:
    # the SDK hands a stdio child only HOME/PATH/SHELL/TERM/USER/LOGNAME unless env= is given
    return {**{k: v for k, v in os.environ.items() if k in ("HOME", "PATH", "LANG", "HF_HUB_OFFLINE")},
            "DAGSTER_HOME": str(agent_env["home"]), "TRAINING_ASSETS_DATA": str(agent_env["root"]), **extra}


def test_stdio_subprocess_serves_a_personas_tools_plans_and_refuses(agent_env):
    params = StdioServerParameters(command=str(BIN / "training-assets"), args=["mcp", "--persona", "training_engineer"],
                                   env=_child_env(agent_env), cwd=str(REPO))

    async def main():
        async with Client(params, read_timeout_seconds=120) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            plan = await client.call_tool("train_sft", {"config": {"max_steps": 2}})
            refused = await client.call_tool("register_model", {})
            prompt = await client.get_prompt("training_engineer", {"task": "train sft"})
            resources = {str(r.uri) for r in (await client.list_resources()).resources}
            return tools, plan, refused, prompt, resources

    tools, plan, refused, prompt, resources = anyio.run(main)
    assert "train_sft" in tools and "register_model" not in tools
    assert not plan.is_error and plan.structured_content["executed"] is False
    assert plan.structured_content["run_config"]["ops"]["sft_checkpoint"]["config"] == {"max_steps": 2}
    assert "not available to persona training_engineer" in error_text(refused)
    assert "Training engineer" in prompt.messages[0].content.text and "train sft" in prompt.messages[0].content.text
    assert {"training-assets://assets", "training-assets://registry", "training-assets://skills/train_model"} <= resources


def _serve_http(agent_env: dict, port: int, token: str | None, host: str = "127.0.0.1") -> subprocess.Popen:
    env = _child_env(agent_env, **({"TRAINING_ASSETS_MCP_TOKEN": token} if token else {}))
    return subprocess.Popen([str(BIN / "training-assets"), "mcp", "--transport", "streamable-http", "--host", host,
                             "--port", str(port)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def test_streamable_http_requires_the_bearer_token_on_every_request(agent_env):
    port, token = free_port(), "s3cret-token-for-the-test"
    proc = _serve_http(agent_env, port, token)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                status = httpx2.post(url, json={}, timeout=2).status_code
                break
            except httpx2.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()[-2000:]
                time.sleep(0.3)
        assert status == 401, "a request without the token is refused"
        assert httpx2.post(url, json={}, headers={"Authorization": "Bearer wrong"}, timeout=5).status_code == 401

        async def main():
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
                async with Client(streamable_http_client(url, http_client=http)) as client:
                    tools = {t.name for t in (await client.list_tools()).tools}
                    listed = await client.call_tool("list_assets", {"keys": ["tokenizer"]})
                    return tools, listed

        tools, listed = anyio.run(main)
        assert len(tools) == len(TOOLS) and not listed.is_error
        assert listed.structured_content["assets"][0]["stale_status"] == "MISSING"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "example.org"])
def test_a_non_loopback_address_without_a_token_is_refused(agent_env, host):
    proc = _serve_http(agent_env, free_port(), None, host=host)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert f"refusing to serve on {host}" in out.decode() and "TRAINING_ASSETS_MCP_TOKEN" in out.decode()


@pytest.mark.parametrize("header,passes", [
    (b"Bearer s3cret", True), (b"bearer s3cret", True), (b"BEARER  s3cret", True),  # RFC 7235: any case
    (b"Bearer wrong", False), (b"Bearer s3cret2", False), (b"Basic s3cret", False), (b"Bearers3cret", False),
    (b"s3cret", False), (None, False)])
def test_the_bearer_scheme_is_case_insensitive_and_the_token_exact(header, passes):
    from training_assets.agent.http import BearerTokenMiddleware

    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope["path"])

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": "/mcp", "headers": [(b"authorization", header)] if header is not None else []}
    anyio.run(BearerTokenMiddleware(app, "s3cret"), scope, None, send)
    assert (reached == ["/mcp"]) is passes
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == ([] if passes else [401])
