"""Rollout staging and the vLLM client against a local server speaking the OpenAI completions API."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from training_assets.rollout_buffer import Generation, RolloutBuffer, VLLMRolloutClient


class _FakeVLLM(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server API)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.path, body))
        choices = [{"text": f"answer {i}", "logprobs": {"tokens": [f"token_id:{10 + i}", "token_id:2"],
                                                         "token_logprobs": [-0.5 - i, -0.1]}} for i in range(body["n"])]
        payload = json.dumps({"choices": choices}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        return None


@pytest.fixture
def server():
    httpd = HTTPServer(("127.0.0.1", 0), _FakeVLLM)
    httpd.requests = []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()


def test_vllm_client_returns_token_ids_and_logprobs(server):
    client = VLLMRolloutClient(f"http://127.0.0.1:{server.server_port}", model="dpo-adapter")
    gens = client.generate([1, 4, 97], n=3, max_tokens=8, temperature=0.7)
    assert [g.token_ids for g in gens] == [[10, 2], [11, 2], [12, 2]]
    assert gens[1].logprobs == [-1.5, -0.1]
    path, body = server.requests[0]
    assert path == "/v1/completions" and body["model"] == "dpo-adapter" and body["prompt"] == [1, 4, 97]
    assert body["return_tokens_as_token_ids"] is True and body["n"] == 3


def test_unreachable_vllm_is_a_clear_error():
    client = VLLMRolloutClient("http://127.0.0.1:9", model="m", timeout_s=2)
    with pytest.raises(ConnectionError, match="unreachable"):
        client.generate([1], n=1, max_tokens=1, temperature=1.0)


def test_buffer_scores_groups_and_exports_grpo_rows():
    buffer = RolloutBuffer()
    staged = buffer.stage("g1", [{"role": "user", "content": "2+2?"}], [1, 2], expected_answer="4")
    staged.generations = [Generation("The answer is 4.", [5]), Generation("no idea", [6])]
    buffer.score(lambda completions, expected_answer=None, **kw: [1.0 if "4" in c else 0.0 for c in completions])
    (group,) = buffer.to_groups()
    assert group["rewards"] == [1.0, 0.0] and group["advantages"][0] > 0 > group["advantages"][1]
    assert abs(sum(group["advantages"])) < 1e-9
    assert json.loads(group["completions"][0])[0]["content"] == "The answer is 4."
    assert [r["advantage"] for r in buffer.rows()] == group["advantages"]
