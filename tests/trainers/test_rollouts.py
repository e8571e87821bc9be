"""Rollout staging and the vLLM client against a local server speaking the OpenAI completions API."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from training_assets.rollout_buffer import Generation, RolloutBuffer, VLLMRolloutClient
from training_assets.vllm_client import RetryPolicy, VllmError


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
    client = VLLMRolloutClient("http://127.0.0.1:9", model="m", timeout_s=2, retry=RetryPolicy(max_attempts=2, backoff_s=0.01))
    with pytest.raises(VllmError, match=r"http://127.0.0.1:9/v1/completions failed after 2 attempt\(s\); last: unreachable"):
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


def _tiny_lm(vocab=64, seed=0):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from training_assets.trainers import PretrainSpec

    torch.manual_seed(seed)
    config = AutoConfig.for_model("qwen2", **PretrainSpec(hidden_size=32, num_hidden_layers=2,
                                                          intermediate_size=64).config_kwargs(vocab))
    return AutoModelForCausalLM.from_config(config).eval()


def _left_padded(lengths, vocab, pad=0, seed=1):
    import torch

    g = torch.Generator().manual_seed(seed)
    P = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), P), generator=g)
    attn = torch.ones(len(lengths), P, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, : P - n], attn[i, : P - n] = pad, 0
    return ids, attn


@pytest.mark.parametrize("temperature,eos", [(1.0, 5), (0.7, 5), (1.0, None)])
def test_sample_completions_draws_what_generate_draws(temperature, eos):
    """The lean sampler is generate(do_sample, top_k=0, top_p=1) token for token: same RNG, same samples."""
    import torch

    from training_assets.trainers.modeling import plain_sampling, sample_completions

    model = _tiny_lm()
    assert plain_sampling(model)
    ids, attn = _left_padded([7, 7, 4, 4, 6, 6], 64)
    torch.manual_seed(3)
    with torch.no_grad():
        expected = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=temperature, top_k=0,
                                  top_p=1.0, max_new_tokens=12, pad_token_id=0, eos_token_id=eos, use_cache=True)
    torch.manual_seed(3)
    with torch.inference_mode():
        got = sample_completions(model, ids, attn, 12, temperature, eos, 0)
    assert torch.equal(got, expected[:, ids.shape[1]:])


def test_plain_sampling_is_false_when_generation_config_reshapes_the_distribution():
    from training_assets.trainers.modeling import plain_sampling

    model = _tiny_lm()
    model.generation_config.repetition_penalty = 1.1
    assert not plain_sampling(model)


def test_completion_logps_equal_full_logits_gather():
    import torch

    from training_assets.trainers.modeling import completion_logps, token_logps

    model = _tiny_lm()
    ids, attn = _left_padded([9, 6, 8], 64)
    ids = torch.cat([ids, torch.randint(3, 64, (3, 5))], dim=1)
    attn = torch.cat([attn, torch.ones(3, 5, dtype=torch.long)], dim=1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    P = 9
    with torch.no_grad():
        full = token_logps(model(input_ids=ids, attention_mask=attn, position_ids=pos).logits, ids)[:, P - 1:]
        part = completion_logps(model, ids, attn, pos, P)
    assert part.shape == (3, 5)
    torch.testing.assert_close(part, full, rtol=1e-6, atol=1e-6)
