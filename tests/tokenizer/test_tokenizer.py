"""Tokenizer: lossless round trip, special tokens, chat template masks, determinism, reuse."""

import json
import random

import pytest

from training_assets import sample_traces, tokenizer_trainer as tt
from training_assets.storage import sha256_tree


def _sample_texts() -> list[str]:
    batches, _ = sample_traces.make_batches()
    return [line.decode("utf-8", "replace") for batch in batches for line in batch]


@pytest.fixture(scope="module")
def tokenizer():
    return tt.train_tokenizer(_sample_texts(), vocab_size=1024)


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "Computing.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2 + 2"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "4"},
    {"role": "assistant", "content": "The answer is 4."},
]


def test_round_trip_is_lossless_on_hard_text_and_random_unicode(tokenizer):
    rng = random.Random(0)
    # random code points from every plane region that is valid in UTF-8 (surrogates excluded)
    randoms = ["".join(chr(rng.choice([rng.randint(0, 0x7F), rng.randint(0x80, 0xD7FF), rng.randint(0xE000, 0x10FFFF)]))
                       for _ in range(rng.randint(1, 60))) for _ in range(200)]
    assert tt.round_trip_failures(tokenizer, tt.HARD_TEXTS) == []
    assert tt.round_trip_failures(tokenizer, randoms) == []


def test_each_special_token_is_one_id_and_never_merged_with_text(tokenizer):
    assert tt.special_token_failures(tokenizer) == []
    end = tokenizer.convert_tokens_to_ids(tt.EOS)
    ids = tokenizer.encode("done<|end|>next", add_special_tokens=False)
    assert ids.count(end) == 1
    assert tokenizer.eos_token == tt.EOS and tokenizer.pad_token == tt.PAD and tokenizer.bos_token == tt.BOS


def test_assistant_mask_covers_assistant_turns_tool_calls_and_end_of_turn_only(tokenizer):
    out = tokenizer.apply_chat_template(CONVERSATION, return_dict=True, return_assistant_tokens_mask=True)
    tokens = tokenizer.convert_ids_to_tokens(out["input_ids"])
    masked = tokenizer.decode([i for i, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m])
    assert masked == ('Computing.<|tool_call|>{"name": "calculator", "arguments": {"expression": "2 + 2"}}'
                      "<|/tool_call|><|end|>The answer is 4.<|end|>")
    # role markers, system/user text and the tool result are context, not targets
    for token, m in zip(tokens, out["assistant_masks"], strict=True):
        if token in (tt.ROLE_TOKENS["assistant"], tt.ROLE_TOKENS["user"], tt.TOOL_RESULT_OPEN, tt.BOS):
            assert m == 0
    assert tt.end_of_turn_masked(tokenizer)[0]


def test_template_renders_tool_arguments_given_as_text_or_mapping_identically(tokenizer):
    as_mapping = json.loads(json.dumps(CONVERSATION))
    as_mapping[2]["tool_calls"][0]["function"]["arguments"] = {"expression": "2 + 2"}
    assert tokenizer.apply_chat_template(as_mapping, tokenize=False) == tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    prompt = tokenizer.apply_chat_template(CONVERSATION[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|user|>What is 2 + 2?<|end|><|assistant|>")
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
    with_tools = tokenizer.apply_chat_template(CONVERSATION[1:2], tools=tools, tokenize=False)
    assert with_tools.startswith('<|bos|><|system|>Available tools: [{"type": "function"') and "calculator" in with_tools


def test_saved_folder_loads_with_auto_tokenizer(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    text = "Grüße 👍🏽 <|tool_call|>{}"
    assert loaded.encode(text, add_special_tokens=False) == tokenizer.encode(text, add_special_tokens=False)
    assert loaded.chat_template == tt.CHAT_TEMPLATE and loaded.eos_token == tt.EOS
    assert loaded.decode(loaded.encode(text, add_special_tokens=False)) == text


def test_training_is_deterministic_byte_for_byte(tmp_path):
    texts = _sample_texts()
    a, b = tmp_path / "a", tmp_path / "b"
    tt.train_tokenizer(texts, vocab_size=700).save_pretrained(a)
    tt.train_tokenizer(texts, vocab_size=700).save_pretrained(b)
    assert sha256_tree(a) == sha256_tree(b)


def test_build_tokenizer_reuses_same_key_and_retrains_on_change(tmp_path):
    rows = [{"id": f"r{i}", "text": t} for i, t in enumerate(_sample_texts())]
    out = tmp_path / "tokenizer"
    config = tt.TokenizerConfig(vocab_size=600)
    first = tt.build_tokenizer(rows, "corpus-v1", config, out)
    assert not first.reused and first.n_held_back_rows > 0 and first.round_trip_failures == []
    assert first.end_of_turn_masked[0] and first.bytes_per_token > 1.5
    again = tt.build_tokenizer(rows, "corpus-v1", config, out)
    assert again.reused and again.tokenizer_hash == first.tokenizer_hash
    changed = tt.build_tokenizer(rows, "corpus-v2", tt.TokenizerConfig(vocab_size=640), out)
    assert not changed.reused and changed.tokenizer_hash != first.tokenizer_hash and changed.vocab_size == 640


def test_too_small_vocab_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="use at least 512"):
        tt.TokenizerConfig(vocab_size=200)
