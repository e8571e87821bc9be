"""One tool-call format for a pretrained ChatML base: its template, extended, saved with every checkpoint.

    tokenizer = with_tool_template(AutoTokenizer.from_pretrained(folder))
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)

The format is Hermes / Qwen2.5's, in ChatML: the tools are listed in the system turn inside
``<tools></tools>`` (one JSON schema per line, OpenAI's ``{"type": "function", "function": ...}``);
the assistant calls them with ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
(one block per call, several allowed); each result comes back inside ``<tool_response>`` in a
user turn (consecutive tool results share one turn). vLLM's ``hermes`` tool parser reads this
format, and ``parse_tool_calls`` below reads it from raw text where a server returns it unparsed.

The assistant's own tokens, its ``<|im_end|>`` included, sit inside ``{% generation %}`` markers so
``apply_chat_template(..., return_assistant_tokens_mask=True)`` gives the loss mask; training,
evaluation and serving all render with this one template (saved in the tokenizer folder of every
checkpoint), so they see exactly the same text. A base that already ships a template with tool
calls and generation markers keeps its own (``needs_tool_template``).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

CHATML_START, CHATML_END = "<|im_start|>", "<|im_end|>"
TOOL_CALL_FORMAT = "hermes"  # vLLM: --enable-auto-tool-choice --tool-call-parser hermes
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# The tool section the system turn carries when tools are given: one text, used by the template
# and by ``fold_tools`` (which puts it into a trace's system message at ingest).
TOOLS_HEADER = ("\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_FOOTER = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def _literal(text: str) -> str:
    """``text`` as a Jinja string literal."""
    return json.dumps(text)


# ChatML with tools (Hermes) and generation markers. Whitespace control (`-`) keeps the rendered
# text exactly ChatML: every turn is `<|im_start|>ROLE\n...<|im_end|>\n`.
TOOL_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}"
    "{%- set system = " + _literal(DEFAULT_SYSTEM) + " -%}{%- set rest = messages -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system -}}"
    "{%- if tools -%}"
    "{{- " + _literal(TOOLS_HEADER) + " -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- " + _literal(TOOLS_FOOTER) + " -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for message in rest -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}"
    "{%- if message['content'] -%}{{- message['content'] -}}{%- endif -%}"
    "{%- for call in message['tool_calls'] or [] -%}"
    "{%- set fn = call['function'] if call['function'] is defined else call -%}"
    "{%- if message['content'] or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' -}}"
    "{%- if fn['arguments'] is string -%}{{- fn['arguments'] -}}{%- else -%}{{- fn['arguments'] | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>' -}}"
    "{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- elif message['role'] == 'tool' -%}"
    "{%- if loop.first or rest[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' -}}"
    "{%- if loop.last or rest[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def canonical_tool(tool: Any) -> Any:
    """``tool`` with every object's keys in sorted order: the one order a tool schema has here.

    A trace's tools reach training through stores that write JSON with sorted keys, while a server
    renders ``tools=`` in the order the client sent them (the template's ``tojson`` keeps it). The
    two texts differed (``{"type": "function", "function": {"name": ...`` served against
    ``{"function": {"description": ...`` trained, the properties ``value, from_unit, to_unit``
    against ``from_unit, to_unit, value``) and a model trained on one, served with the other, called
    ``convert_units`` with ``value`` alone. So the harness sends canonical tools and ``fold_tools``
    writes them canonically, whatever order a trace kept."""
    if isinstance(tool, dict):
        return {k: canonical_tool(tool[k]) for k in sorted(tool)}
    if isinstance(tool, list):
        return [canonical_tool(v) for v in tool]
    return tool


def tools_json(tool: Any) -> str:
    """A tool schema as the template's ``tojson`` writes its canonical form (transformers: json.dumps,
    ensure_ascii=False; keys sorted, ``canonical_tool``)."""
    return json.dumps(canonical_tool(tool), ensure_ascii=False)


def fold_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """``messages`` with ``tools`` written into the system turn exactly as the template renders them
    when a server is given them canonically (``canonical_tool``: what the harness sends), in any key
    order they were stored (the default system prompt when there is none): rendering the
    folded conversation without tools gives the same text, so a trace's tools need not travel
    beside it through datasets and trainers. No tools: ``messages`` unchanged."""
    if not tools:
        return messages
    section = TOOLS_HEADER + "".join("\n" + tools_json(t) for t in tools) + TOOLS_FOOTER
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "content": (messages[0].get("content") or "") + section}, *messages[1:]]
    return [{"role": "system", "content": DEFAULT_SYSTEM + section}, *messages]


_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def template_hash(template: str) -> str:
    return hashlib.sha256(template.encode()).hexdigest()[:16]


def needs_tool_template(template: str | None) -> bool:
    """True unless the base's own template already renders tool calls with generation markers."""
    return not (template and "tool_call" in template and "generation" in template)


def with_tool_template(tokenizer: Any) -> Any:
    """``tokenizer`` with the tool-call template (unless its own already has tools and generation
    markers). ChatML only: a base whose end-of-turn token is not ``<|im_end|>`` is refused."""
    if not needs_tool_template(tokenizer.chat_template):
        return tokenizer
    vocab = tokenizer.get_vocab()
    missing = [t for t in (CHATML_START, CHATML_END) if t not in vocab]
    if missing:
        raise ValueError(f"the base's tokenizer has no {', '.join(missing)}: the tool template is ChatML; "
                         "use a ChatML base or one whose own template renders tool calls and generation markers")
    tokenizer.chat_template = TOOL_TEMPLATE
    return tokenizer


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]], list[str]]:
    """Split raw assistant text into (content without the calls, calls, errors).

    Each call is ``{"name": str, "arguments": dict}``; a block that is not ``{"name": str,
    "arguments": object}`` JSON, or one cut off by the token cap (no ``</tool_call>``), is an error
    naming the block, returned, never raised: a model's malformed call is a failed step of its attempt.

    >>> parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>')
    ('', [{'name': 'calculator', 'arguments': {'expression': '1+1'}}], [])
    """
    calls: list[dict[str, Any]] = []
    errors: list[str] = []
    for block in _CALL.findall(text):
        try:
            obj = json.loads(block)
        except ValueError as exc:
            errors.append(f"tool call block is not JSON ({exc.msg}): {block[:120]}")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not isinstance(obj.get("arguments", {}), dict):
            errors.append(f"tool call block has no \"name\" string or no \"arguments\" object: {block[:120]}")
            continue
        calls.append({"name": obj["name"], "arguments": obj.get("arguments", {})})
    content = _CALL.sub("", text).strip()
    if "<tool_call>" in content:  # an opened call never closed (cut by the token cap)
        errors.append(f"tool call block cut off (no </tool_call>): {content[content.index('<tool_call>'):][:120]}")
        content = content[:content.index("<tool_call>")].strip()
    return content, calls, errors
