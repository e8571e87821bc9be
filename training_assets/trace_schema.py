"""The trace schema: one agent attempt at one task, in the OpenAI chat format.

A *trace* holds the whole conversation (system / user / assistant / tool messages, assistant
``tool_calls`` whose ``arguments`` are JSON text, tool results that name their
``tool_call_id``), the final answer, the outcome and where it came from. Two other shapes are
accepted and converted: ShareGPT (``conversations`` of ``{from, value}``) and plain
``{prompt, completion}``.

``parse_trace(obj)`` validates one decoded JSON value (pydantic); ``validation_reason`` maps a
``ValidationError`` onto the short reason codes users see; ``nesting_reason`` refuses JSON text
nested deeper than ``MAX_JSON_DEPTH`` before anything parses it; ``render_messages`` is the
plain-text form of a conversation that curation, decontamination and the tokenizer's corpus share.
Validation happens once, at ingest (``traces.iter_batch``): downstream stages read the columns
``raw_traces`` stores and never re-validate.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from itertools import accumulate
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

Role = Literal["system", "user", "assistant", "tool"]

# JSON text (a line, a tool call's arguments) nested deeper than this is quarantined
# (too_deeply_nested) before it is parsed. json.loads, pydantic and model_dump recurse once per
# level: 100k levels raise RecursionError, a few hundred make model_dump fail. Real traces nest < 10.
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)  # an unterminated one runs to the end
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_DEPTH_STEP = [0] * 256
_DEPTH_STEP[ord("[")] = _DEPTH_STEP[ord("{")] = 1
_DEPTH_STEP[ord("]")] = _DEPTH_STEP[ord("}")] = -1


def json_depth(text: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in JSON text, brackets inside strings not counted.

    A scan, not a parse, so it cannot recurse: strings are cut out, the brackets kept, and the
    depth is the running sum of +1 (open) / -1 (close). Malformed text gets a number too.

    >>> json_depth(b'{"a": [1, {"b": "[[[["}]}')
    3
    """
    brackets = _JSON_STRING.sub(b"", text).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)


def nesting_reason(text: bytes, limit: int = MAX_JSON_DEPTH) -> tuple[str, str] | None:
    """``("too_deeply_nested", detail)`` when ``text`` nests deeper than ``limit``, else None."""
    if text.count(b"[") + text.count(b"{") <= limit:  # fewer brackets than the limit: no scan needed
        return None
    depth = json_depth(text)
    if depth <= limit:
        return None
    return "too_deeply_nested", f"JSON nested {depth} levels deep; at most MAX_JSON_DEPTH={limit} are read"


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="Tool name the agent called.")
    arguments: str = Field(description="Call arguments as JSON text (OpenAI format).")

    @model_validator(mode="before")
    @classmethod
    def _arguments_as_json_text(cls, data: Any) -> Any:
        # Some loggers store arguments as an object; the chat format wants JSON text. Convert
        # canonically instead of quarantining an otherwise good trace.
        if isinstance(data, dict) and isinstance(data.get("arguments"), dict):
            data = {**data, "arguments": json.dumps(data["arguments"], sort_keys=True)}
        return data

    @model_validator(mode="after")
    def _arguments_parse(self) -> ToolFunction:
        too_deep = nesting_reason(self.arguments.encode("utf-8", "surrogatepass"))
        if too_deep is not None:  # checked before json.loads, which would recurse once per level
            raise PydanticCustomError("too_deeply_nested", "arguments of tool call {name}: {detail}",
                                      {"name": repr(self.name), "detail": too_deep[1]})
        try:
            json.loads(self.arguments)
        except ValueError as exc:
            raise PydanticCustomError(
                "tool_arguments_not_json",
                "arguments of tool call {name} are not JSON: {error}",
                {"name": repr(self.name), "error": str(exc)},
            ) from None
        return self


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: ToolFunction


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Role
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = Field(default=None, description="For role=tool: the call it answers.")
    name: str | None = None

    @model_validator(mode="after")
    def _role_fields(self) -> Message:
        if self.role == "tool" and not self.tool_call_id:
            raise PydanticCustomError("orphan_tool_result", "tool message has no tool_call_id")
        if self.tool_calls and self.role != "assistant":
            raise PydanticCustomError(
                "invalid_value", "only assistant messages carry tool_calls (got role {role})",
                {"role": repr(self.role)},
            )
        if self.role != "assistant" and self.role != "tool" and self.content is None:
            raise PydanticCustomError("missing_field", "{role} message has no content", {"role": self.role})
        return self


class Outcome(BaseModel):
    model_config = ConfigDict(extra="forbid")

    success: bool
    score: float | None = Field(default=None, description="Task score, higher is better.")
    failure_point: int | None = Field(
        default=None, ge=0, description="Index into messages of the first failing step."
    )
    error: str | None = None


class TraceMetadata(BaseModel):
    model_config = ConfigDict(extra="allow")  # free-form tags are kept, never dropped

    agent: str | None = None
    model: str | None = None
    created_at: datetime | None = None
    source: str | None = None
    tools: list[dict[str, Any]] | None = Field(
        default=None, description="The tool schemas the agent was offered (OpenAI chat-completions `tools`); "
                                  "ingest writes them into the system turn in the one tool-call format.")


class Trace(BaseModel):
    """One agent attempt at one task, in the OpenAI chat format."""

    model_config = ConfigDict(extra="forbid")

    trace_id: str = Field(min_length=1)
    task_id: str = Field(min_length=1, description="Attempts at the same task share it.")
    system: str | None = Field(default=None, description="System prompt (first system message).")
    prompt: str = Field(description="The task as the user put it (first user message).")
    messages: list[Message] = Field(min_length=1)
    final_answer: str | None = None
    outcome: Outcome
    metadata: TraceMetadata = Field(default_factory=TraceMetadata)

    @model_validator(mode="before")
    @classmethod
    def _derive_prompt_and_system(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
            return data
        data = dict(data)
        first = {}
        for msg in data["messages"]:
            if isinstance(msg, dict) and isinstance(msg.get("role"), str):
                first.setdefault(msg["role"], msg.get("content"))
        if "prompt" not in data and isinstance(first.get("user"), str):
            data["prompt"] = first["user"]
        if "system" not in data and isinstance(first.get("system"), str):
            data["system"] = first["system"]
        return data

    @model_validator(mode="after")
    def _conversation_is_consistent(self) -> Trace:
        open_calls: set[str] = set()
        for index, msg in enumerate(self.messages):
            for call in msg.tool_calls or ():
                open_calls.add(call.id)
            if msg.role == "tool" and msg.tool_call_id not in open_calls:
                raise PydanticCustomError(
                    "orphan_tool_result",
                    "messages[{index}] answers tool_call_id {call}, which no earlier assistant "
                    "message made",
                    {"index": index, "call": repr(msg.tool_call_id)},
                )
        if not any(m.role == "user" for m in self.messages):
            raise PydanticCustomError("missing_field", "messages has no user message")
        fp = self.outcome.failure_point
        if fp is not None and fp >= len(self.messages):
            raise PydanticCustomError(
                "invalid_value",
                "outcome.failure_point {fp} is past the last message (index {last})",
                {"fp": fp, "last": len(self.messages) - 1},
            )
        return self

    @property
    def tool_call_count(self) -> int:
        return sum(len(m.tool_calls or ()) for m in self.messages)


# --------------------------------------------------------------------------- other formats

SHAREGPT_ROLES = {
    "system": "system", "human": "user", "user": "user", "gpt": "assistant",
    "assistant": "assistant", "tool": "tool", "function": "tool", "observation": "tool",
}


def _stable_id(prefix: str, *parts: str) -> str:
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]
    return f"{prefix}-{digest}"


def _from_sharegpt(obj: dict[str, Any]) -> dict[str, Any]:
    turns = obj["conversations"]
    if not isinstance(turns, list):
        raise PydanticCustomError("wrong_type", "conversations must be a list of {{from, value}}")
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
            raise PydanticCustomError(
                "missing_field", "conversations[{i}] needs 'from' and 'value'", {"i": i}
            )
        role = SHAREGPT_ROLES.get(turn["from"])
        if role is None:
            raise PydanticCustomError(
                "unknown_role", "conversations[{i}].from {role} is not a known role",
                {"i": i, "role": repr(turn["from"])},
            )
        if role == "tool":
            # ShareGPT does not link results to calls; keep the text as a user-visible observation.
            role = "user"
        messages.append({"role": role, "content": turn["value"]})
    text = json.dumps(messages, sort_keys=True)
    first_user = next((m["content"] for m in messages if m["role"] == "user"), "")
    final = next((m["content"] for m in reversed(messages) if m["role"] == "assistant"), None)
    return {
        "trace_id": str(obj.get("id") or _stable_id("sharegpt", text)),
        "task_id": str(obj.get("task_id") or _stable_id("task", str(first_user))),
        "messages": messages,
        "final_answer": final,
        # ShareGPT rows are curated demonstrations: taken as successful unless told otherwise.
        "outcome": obj.get("outcome", {"success": True}),
        "metadata": {**(obj.get("metadata") or {}), "source": (obj.get("metadata") or {}).get("source", "sharegpt")},
    }


def _from_prompt_completion(obj: dict[str, Any]) -> dict[str, Any]:
    prompt, completion = obj["prompt"], obj["completion"]
    if not isinstance(prompt, str) or not isinstance(completion, str):
        raise PydanticCustomError("wrong_type", "prompt and completion must be strings")
    return {
        "trace_id": str(obj.get("id") or _stable_id("pc", prompt, completion)),
        "task_id": str(obj.get("task_id") or _stable_id("task", prompt)),
        "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}],
        "final_answer": completion,
        "outcome": obj.get("outcome", {"success": True}),
        "metadata": {**(obj.get("metadata") or {}), "source": (obj.get("metadata") or {}).get("source", "prompt_completion")},
    }


def parse_trace(obj: Any) -> Trace:
    """Validate one decoded JSON value as a trace (native, ShareGPT or prompt/completion)."""
    if not isinstance(obj, dict):
        raise PydanticCustomError("not_an_object", "line is JSON but not an object ({kind})",
                                  {"kind": type(obj).__name__})
    if "messages" not in obj and "conversations" in obj:
        obj = _from_sharegpt(obj)
    elif "messages" not in obj and "prompt" in obj and "completion" in obj:
        obj = _from_prompt_completion(obj)
    return Trace.model_validate(obj)


# --------------------------------------------------------------------------- reasons

# pydantic's built-in error types, mapped onto the reason codes users see
_TYPE_ERRORS = re.compile(r"(_type|_parsing|_instance)$|^(too_short|too_long|greater_than_equal)$")


# When one line has several problems, the most specific one names it.
REASON_PRIORITY = ("too_deeply_nested", "unknown_role", "tool_arguments_not_json", "orphan_tool_result",
                   "not_an_object", "wrong_type", "unknown_field", "missing_field", "invalid_value")


def _error_reason(err: dict[str, Any]) -> str:
    kind = err["type"]
    if kind == "missing":
        return "missing_field"
    if kind == "literal_error" and err["loc"] and err["loc"][-1] == "role":
        return "unknown_role"
    if kind == "extra_forbidden":
        return "unknown_field"
    if kind in REASON_PRIORITY:
        return kind
    if _TYPE_ERRORS.search(kind):
        return "wrong_type"
    return "invalid_value"


def validation_reason(exc: ValidationError) -> tuple[str, str]:
    """(reason code, detail for a person) of a failed validation: the most specific error names it."""
    errors = exc.errors(include_url=False)
    reasons = [_error_reason(err) for err in errors]
    reason = min(reasons, key=REASON_PRIORITY.index)
    details = []
    for err in sorted(errors, key=lambda e: REASON_PRIORITY.index(_error_reason(e)))[:3]:
        loc = ".".join(str(p) for p in err["loc"])
        details.append(f"{loc}: {err['msg']}" if loc else err["msg"])
    more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
    return reason, "; ".join(details) + more


# --------------------------------------------------------------------------- text form


def render_messages(messages: Sequence[Mapping[str, Any]]) -> str:
    """A conversation as plain text: one block per message, a role header then its content.

    Tool calls are written as ``call NAME(ARGUMENTS_JSON)`` and tool results as
    ``NAME returned: ...``; deterministic, so the same conversation always gives the same text
    (and content hash).

    >>> render_messages([{"role": "user", "content": "2 + 2?"},
    ...                  {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "calc", "arguments": "{}"}}]},
    ...                  {"role": "tool", "tool_call_id": "c", "name": "calc", "content": "4"}])
    'user:\\n2 + 2?\\n\\nassistant:\\ncall calc({})\\n\\ntool:\\ncalc returned: 4'
    """
    blocks = []
    for message in messages:
        lines = []
        if message.get("content"):
            lines.append(message["content"])
        for call in message.get("tool_calls") or ():
            lines.append(f"call {call['function']['name']}({call['function']['arguments']})")
        if message.get("role") == "tool":
            lines = [f"{message.get('name') or 'tool'} returned: {message.get('content') or ''}"]
        blocks.append(f"{message.get('role')}:\n" + "\n".join(lines))
    return "\n\n".join(blocks)
