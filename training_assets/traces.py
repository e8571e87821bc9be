"""Trace schema and batch reading.

A *trace* is one attempt by an agent at a task: the whole conversation in the OpenAI chat
format (system / user / assistant / tool messages, assistant ``tool_calls`` whose
``arguments`` are JSON text, tool results that name their ``tool_call_id``), the final answer,
the outcome and where it came from. Two other shapes are accepted and converted: ShareGPT
(``conversations`` of ``{from, value}``) and plain ``{prompt, completion}``.

``read_batch(path)`` reads a ``.jsonl`` or ``.jsonl.gz`` batch line by line in constant memory
(``iter_batch`` is the streaming form). Every line ends valid or quarantined with its line
number, a bounded copy of its raw bytes and a reason, so ``lines == valid + quarantined``
always holds. A file that cannot be read as a batch at all (missing, empty, truncated gzip)
raises ``BatchError`` naming the file.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

DEFAULT_MAX_LINE_BYTES = 1 << 20  # 1 MiB: a longer line is quarantined, never parsed
RAW_COPY_BYTES = 2048  # how much of a quarantined line is kept for inspection
READ_CHUNK_BYTES = 1 << 16
BATCH_SUFFIXES = (".jsonl.gz", ".jsonl")
UTF8_BOM = b"\xef\xbb\xbf"
NUL = b"\x00"

Role = Literal["system", "user", "assistant", "tool"]


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


# --------------------------------------------------------------------------- batch reading


class BatchError(Exception):
    """A batch file that cannot be read at all (as opposed to a bad line, which is quarantined)."""


@dataclass(frozen=True)
class QuarantinedLine:
    line_no: int
    reason: str  # a short code: malformed_json, invalid_utf8, missing_field, ...
    detail: str  # what exactly is wrong, for a person
    raw: str  # the first RAW_COPY_BYTES bytes of the line, decoded with replacement

    def to_dict(self) -> dict[str, Any]:
        return {"line_no": self.line_no, "reason": self.reason, "detail": self.detail, "raw": self.raw}


@dataclass
class BatchResult:
    path: Path
    lines: int = 0
    valid: list[Trace] = field(default_factory=list)
    valid_line_nos: list[int] = field(default_factory=list)
    quarantined: list[QuarantinedLine] = field(default_factory=list)

    @property
    def reasons(self) -> dict[str, int]:
        return dict(sorted(Counter(q.reason for q in self.quarantined).items()))

    @property
    def quarantine_rate(self) -> float:
        return len(self.quarantined) / self.lines if self.lines else 0.0

    def report(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "lines": self.lines,
            "valid": len(self.valid),
            "quarantined": len(self.quarantined),
            "quarantine_rate": round(self.quarantine_rate, 6),
            "reasons": self.reasons,
            "examples": [q.to_dict() for q in self.quarantined[:10]],
        }


# pydantic's built-in error types, mapped onto the reason codes users see
_TYPE_ERRORS = re.compile(r"(_type|_parsing|_instance)$|^(too_short|too_long|greater_than_equal)$")


# When one line has several problems, the most specific one names it.
REASON_PRIORITY = ("unknown_role", "tool_arguments_not_json", "orphan_tool_result", "not_an_object",
                   "wrong_type", "unknown_field", "missing_field", "invalid_value")


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


def _pydantic_reason(exc: ValidationError) -> tuple[str, str]:
    errors = exc.errors(include_url=False)
    reasons = [_error_reason(err) for err in errors]
    reason = min(reasons, key=REASON_PRIORITY.index)
    details = []
    for err in sorted(errors, key=lambda e: REASON_PRIORITY.index(_error_reason(e)))[:3]:
        loc = ".".join(str(p) for p in err["loc"])
        details.append(f"{loc}: {err['msg']}" if loc else err["msg"])
    more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
    return reason, "; ".join(details) + more


def _open_binary(path: Path):
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


def _raw_lines(handle, max_line_bytes: int) -> Iterator[tuple[bytes, bool]]:
    """Yield (line, oversized) without ever holding more than max_line_bytes of one line."""
    while True:
        line = handle.readline(max_line_bytes + 1)
        if not line:
            return
        if len(line) > max_line_bytes and not line.endswith(b"\n"):
            head = line[:RAW_COPY_BYTES]
            while line and not line.endswith(b"\n"):  # drain the rest of the long line
                line = handle.readline(READ_CHUNK_BYTES)
            yield head, True
            continue
        yield line.rstrip(b"\r\n") if line.endswith(b"\n") else line, False


def _classify(line: bytes, oversized: bool, max_line_bytes: int) -> Trace | tuple[str, str]:
    if oversized or len(line) > max_line_bytes:
        return "line_too_long", f"line is longer than max_line_bytes={max_line_bytes}"
    if line.startswith(UTF8_BOM):
        return "byte_order_mark", "line starts with a UTF-8 byte-order mark; save the file as UTF-8 without BOM"
    if NUL in line:
        return "nul_byte", f"NUL byte at offset {line.index(NUL)}"
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return "invalid_utf8", f"invalid UTF-8 at byte {exc.start}: {exc.reason}"
    if not text.strip():
        return "blank_line", "line is empty"
    try:
        obj = json.loads(text)
    except ValueError as exc:
        return "malformed_json", str(exc)
    try:
        return parse_trace(obj)
    except ValidationError as exc:
        return _pydantic_reason(exc)
    except PydanticCustomError as exc:
        return exc.type, exc.message()


def check_batch_path(path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    if not path.name.endswith(BATCH_SUFFIXES):
        raise BatchError(f"batch {path}: expected a .jsonl or .jsonl.gz file")
    if not path.is_file():
        raise BatchError(f"batch {path}: no such file")
    if not os.access(path, os.R_OK):
        raise BatchError(f"batch {path}: file is not readable (check its permissions)")
    if path.stat().st_size == 0:
        raise BatchError(f"batch {path}: file is empty; remove it from the inbox or fill it")
    return path


def iter_batch(
    path: str | os.PathLike[str], max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> Iterator[tuple[int, Trace | QuarantinedLine]]:
    """Stream ``(line_no, Trace | QuarantinedLine)`` over a batch, 1-based line numbers.

    Duplicate ``trace_id``s within the batch are quarantined after their first occurrence.
    Raises ``BatchError`` for a file that cannot be read as a batch (empty, truncated gzip, ...).
    """
    path = check_batch_path(path)
    seen: set[str] = set()
    line_no = 0
    try:
        with _open_binary(path) as handle:
            for line_no, (line, oversized) in enumerate(_raw_lines(handle, max_line_bytes), start=1):
                verdict = _classify(line, oversized, max_line_bytes)
                if isinstance(verdict, Trace):
                    if verdict.trace_id in seen:
                        verdict = ("duplicate_trace_id", f"trace_id {verdict.trace_id!r} already appeared in this batch")
                    else:
                        seen.add(verdict.trace_id)
                        yield line_no, verdict
                        continue
                reason, detail = verdict
                raw = line[:RAW_COPY_BYTES].decode("utf-8", errors="replace")
                yield line_no, QuarantinedLine(line_no, reason, detail, raw)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise BatchError(
            f"batch {path}: compressed stream is truncated or corrupt after line {line_no} ({exc}); "
            "re-export the batch"
        ) from exc
    except OSError as exc:
        raise BatchError(f"batch {path}: cannot be read: {exc}") from exc
    if line_no == 0:
        raise BatchError(f"batch {path}: holds no lines (empty after decompression)")


def read_batch(path: str | os.PathLike[str], max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> BatchResult:
    """Read a whole batch: every line is in ``.valid`` or ``.quarantined``."""
    result = BatchResult(path=Path(path))
    for line_no, item in iter_batch(path, max_line_bytes=max_line_bytes):
        result.lines += 1
        if isinstance(item, Trace):
            result.valid.append(item)
            result.valid_line_nos.append(line_no)
        else:
            result.quarantined.append(item)
    return result


# --------------------------------------------------------------------------- batch identity

SAFE_BATCH_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


def batch_stem(name: str) -> str:
    for suffix in BATCH_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def unsafe_name_reason(name: str) -> str | None:
    """Why a file name cannot become a partition key, or None when it is safe."""
    if not name.endswith(BATCH_SUFFIXES):
        return "not a .jsonl or .jsonl.gz file"
    stem = batch_stem(name)
    if ".." in name:
        return "name contains '..'"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "name contains control characters"
    if "/" in name or "\\" in name:
        return "name contains a path separator"
    if not SAFE_BATCH_NAME.match(stem):
        return "name must start with a letter or digit and use only letters, digits, '.', '_' and '-' (at most 96)"
    return None


def batch_id_for(path: str | os.PathLike[str], content_sha256: str) -> str:
    """Partition key of a batch: its name plus a content hash, so new content is a new batch."""
    return f"{batch_stem(Path(path).name)}-{content_sha256[:12]}"
