"""Rollout staging and the vLLM client against a local server speaking the OpenAI completions API."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from training_assets.rollout_buffer import Generation, RolloutBuffer, VllmRolloutClient
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
    client = VllmRolloutClient(f"http://127.0.0.1:{server.server_port}", model="dpo-adapter")
    gens = client.generate([1, 4, 97], n=3, max_tokens=8, temperature=0.7)
    assert [g.token_ids for g in gens] == [[10, 2], [11, 2], [12, 2]]
    assert gens[1].logprobs == [-1.5, -0.1]
    path, body = server.requests[0]
    assert path == "/v1/completions" and body["model"] == "dpo-adapter" and body["prompt"] == [1, 4, 97]
    assert body["return_tokens_as_token_ids"] is True and body["n"] == 3


def test_unreachable_vllm_is_a_clear_error():
    client = VllmRolloutClient("http://127.0.0.1:9", model="m", timeout_s=2, retry=RetryPolicy(max_attempts=2, backoff_s=0.01))
    with pytest.raises(VllmError, match=r"http://127.0.0.1:9/v1/completions failed after 2 attempt\(s\); last: unreachable"):
        client.generate([1], n=1, max_tokens=1, temperature=1.0)


def test_buffer_scores_groups_and_hands_out_training_rows():
    buffer = RolloutBuffer()
    staged = buffer.stage("g1", [{"role": "user", "content": "2+2?"}], [1, 2], expected_answer="4")
    staged.generations = [Generation("The answer is 4.", [5]), Generation("no idea", [6])]
    seen = []

    def reward(completions, expected_answer=None, **kw):
        seen.extend(json.loads(c)[0]["content"] for c in completions)
        return [1.0 if "4" in c else 0.0 for c in completions]

    buffer.score(reward)
    rows = buffer.rows()
    assert seen == ["The answer is 4.", "no idea"], "the reward reads each completion as an assistant message"
    assert [r["reward"] for r in rows] == [1.0, 0.0] and rows[0]["advantage"] > 0 > rows[1]["advantage"]
    assert abs(sum(r["advantage"] for r in rows)) < 1e-9
    assert [(r["group_id"], r["prompt_ids"], r["completion_ids"], r["completion_mask"]) for r in rows] == \
        [("g1", [1, 2], [5], [1]), ("g1", [1, 2], [6], [1])]


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


def _tiny(model_type, vocab=64, seed=0, kv_heads=None, lora=False):
    """A random-init Qwen2 / Llama (``kv_heads`` < heads: grouped-query attention), optionally LoRA-wrapped
    with non-zero B matrices (a fresh adapter's B is zero: its delta would vanish)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from training_assets.trainers import PretrainSpec

    torch.manual_seed(seed)
    kwargs = PretrainSpec(hidden_size=32, num_hidden_layers=2, intermediate_size=64).config_kwargs(vocab)
    if kv_heads is not None:
        kwargs["num_key_value_heads"] = kv_heads
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **kwargs)).eval()
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.2)
        model.eval()
    return model


LEAN_MODELS = [("qwen2", None, False), ("llama", 2, False), ("qwen2", None, True)]


@pytest.mark.parametrize("model_type,kv_heads,lora", LEAN_MODELS)
def test_lean_decoder_logits_match_the_models_own_forward(model_type, kv_heads, lora):
    """Prefill and cached decode steps give the logits of a full forward over the same tokens (left padding,
    grouped-query attention, LoRA deltas folded in), to float rounding."""
    import torch

    from training_assets.trainers.decoding import LeanDecoder

    model = _tiny(model_type, kv_heads=kv_heads, lora=lora)
    ids, attn = _left_padded([7, 4, 6], 64)
    extra = torch.randint(3, 64, (3, 4))
    decoder = LeanDecoder(model)
    n, P = ids.shape
    total = P + extra.shape[1]
    mask = attn.bool()
    position = (attn.cumsum(-1) - 1).masked_fill(~mask, 1)
    freqs = torch.arange(total, dtype=torch.float32)[:, None] * decoder.inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * decoder.rope_scale, emb.sin() * decoder.rope_scale
    half = decoder.head_dim // 2
    sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)  # the signed table ``sample`` makes
    keys = [torch.zeros(n, decoder.kv_heads, total, decoder.head_dim) for _ in decoder.layers]
    values = [torch.zeros_like(k) for k in keys]
    valid = torch.zeros(n, total, dtype=torch.bool)
    valid[:, :P] = mask
    prefill_mask = (torch.ones(P, P, dtype=torch.bool).tril() & mask[:, None, :] | torch.eye(P, dtype=torch.bool))[:, None]
    full_ids, full_attn = torch.cat([ids, extra], 1), torch.cat([attn, torch.ones_like(extra)], 1)
    full_pos = (full_attn.cumsum(-1) - 1).masked_fill(full_attn == 0, 1)
    with torch.inference_mode():
        reference = model(input_ids=full_ids, attention_mask=full_attn, position_ids=full_pos).logits  # (N, T, V)
        got = [decoder._forward(ids, position, 0, prefill_mask, keys, values, cos, sin)]
        for j in range(extra.shape[1] - 1):
            valid[:, P + j] = True
            got.append(decoder._forward(extra[:, j:j + 1], position[:, -1:] + j + 1, P + j, valid[:, None, None, :P + j + 1],
                                        keys, values, cos, sin))
    torch.testing.assert_close(torch.stack(got, 1), reference[:, P - 1:total - 1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("model_type,kv_heads,lora", LEAN_MODELS)
def test_lean_decoder_samples_what_the_transformers_sampler_samples(model_type, kv_heads, lora):
    """Same RNG, same draws: the logits agree to ~1e-6, far below what moves a multinomial draw here."""
    import torch

    from training_assets.trainers.decoding import LeanDecoder
    from training_assets.trainers.modeling import sample_completions

    model = _tiny(model_type, kv_heads=kv_heads, lora=lora)
    ids, attn = _left_padded([7, 7, 4, 4, 6, 6], 64)
    for temperature, eos in ((1.0, 5), (0.7, None)):
        torch.manual_seed(3)
        with torch.inference_mode():
            expected = sample_completions(model, ids, attn, 12, temperature, eos, 0)
        torch.manual_seed(3)
        with torch.inference_mode():
            got = LeanDecoder(model).sample(ids, attn, 12, temperature, eos, 0)
        assert torch.equal(got, expected)


def test_lean_decoder_says_what_it_does_not_cover():
    from transformers import AutoConfig, AutoModelForCausalLM

    from training_assets.trainers import rollouts
    from training_assets.trainers.decoding import LeanDecoder, unsupported

    gpt2 = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt2", n_layer=1, n_embd=16, n_head=2, vocab_size=64))
    assert unsupported(gpt2) == "GPT2LMHeadModel is not one of ('LlamaForCausalLM', 'Qwen2ForCausalLM', 'MistralForCausalLM')"
    with pytest.raises(ValueError, match="decode with transformers instead"):
        LeanDecoder(gpt2)
    assert rollouts.choose_sampler(gpt2, "lean")["sampler"] == "transformers"
    from peft import LoraConfig, get_peft_model

    dora = get_peft_model(_tiny("qwen2"), LoraConfig(r=2, target_modules=["q_proj"], use_dora=True))
    assert "LoRA variant (DoRA or similar)" in unsupported(dora)
    model = _tiny("qwen2")
    assert rollouts.choose_sampler(model, "lean") == {"sampler": "lean", "reason": "GrpoSpec.sampler='lean'"}
    assert rollouts.choose_sampler(model, "transformers")["sampler"] == "transformers"
    model.generation_config.repetition_penalty = 1.1
    assert rollouts.choose_sampler(model, "lean")["sampler"] == "generate"
