"""read_batch: every line ends valid or quarantined with a reason; unreadable files are errors."""

import gzip
import json

import pytest

from training_assets.traces import RAW_COPY_BYTES, BatchError, parse_trace, read_batch


def good(trace_id="t-1", task_id="task-1", **over):
    trace = {
        "trace_id": trace_id,
        "task_id": task_id,
        "messages": [
            {"role": "system", "content": "be careful"},
            {"role": "user", "content": "What is 2 + 3?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{\"expression\": \"2+3\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "5"},
            {"role": "assistant", "content": "5"},
        ],
        "final_answer": "5",
        "outcome": {"success": True, "score": 1.0},
        "metadata": {"agent": "a", "model": "m", "created_at": "2026-11-01T00:00:00Z", "source": "test"},
    }
    trace.update(over)
    return trace


def line(obj) -> bytes:
    return json.dumps(obj).encode()


def write(tmp_path, lines, name="batch.jsonl"):
    path = tmp_path / name
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def bad_tool_args():
    t = good("t-args")
    t["messages"][2]["tool_calls"][0]["function"]["arguments"] = "{expression: 2+3"
    return t


def orphan_result():
    t = good("t-orphan")
    t["messages"][3]["tool_call_id"] = "c-unknown"
    return t


def unknown_role():
    t = good("t-role")
    t["messages"][1]["role"] = "narrator"
    return t


def wrong_type():
    t = good("t-type")
    t["outcome"]["success"] = "perhaps"
    return t


def missing_field():
    t = good("t-missing")
    del t["outcome"]
    return t


BAD_LINES = {
    "malformed_json": b'{"trace_id": "x", ',
    "invalid_utf8": b'{"trace_id": "\xff\xfe"}',
    "nul_byte": b'{"trace_id": "a\x00b"}',
    "byte_order_mark": b"\xef\xbb\xbf" + line(good("t-bom")),
    "not_an_object": b"[1, 2, 3]",
    "blank_line": b"   ",
    "tool_arguments_not_json": line(bad_tool_args()),
    "orphan_tool_result": line(orphan_result()),
    "unknown_role": line(unknown_role()),
    "wrong_type": line(wrong_type()),
    "missing_field": line(missing_field()),
    "unknown_field": line(good("t-extra", surprise=1)),
}


@pytest.mark.parametrize("reason", sorted(BAD_LINES))
def test_each_bad_line_kind_is_quarantined_with_its_reason(tmp_path, reason):
    path = write(tmp_path, [line(good("ok-1")), BAD_LINES[reason], line(good("ok-2"))])
    result = read_batch(path)
    assert result.lines == 3
    assert [t.trace_id for t in result.valid] == ["ok-1", "ok-2"]
    assert [(q.line_no, q.reason) for q in result.quarantined] == [(2, reason)]
    assert result.quarantined[0].detail


def test_oversized_line_is_quarantined_and_its_copy_bounded(tmp_path):
    huge = good("t-huge", final_answer="x" * 5000)
    path = write(tmp_path, [line(huge), line(good("ok"))])
    result = read_batch(path, max_line_bytes=1000)
    assert [(q.line_no, q.reason) for q in result.quarantined] == [(1, "line_too_long")]
    assert len(result.quarantined[0].raw.encode()) <= RAW_COPY_BYTES
    assert [t.trace_id for t in result.valid] == ["ok"]


def test_duplicate_trace_id_keeps_the_first(tmp_path):
    path = write(tmp_path, [line(good("same", task_id="a")), line(good("same", task_id="b"))])
    result = read_batch(path)
    assert [t.task_id for t in result.valid] == ["a"]
    assert [(q.line_no, q.reason) for q in result.quarantined] == [(2, "duplicate_trace_id")]


def test_every_line_is_accounted_for_on_a_mixed_batch(tmp_path):
    lines = [line(good(f"ok-{i}")) for i in range(5)] + list(BAD_LINES.values())
    result = read_batch(write(tmp_path, lines))
    assert result.lines == len(lines) == len(result.valid) + len(result.quarantined)
    assert sorted(q.line_no for q in result.quarantined) == list(range(6, len(lines) + 1))
    assert result.reasons == {reason: 1 for reason in BAD_LINES}


def test_gzip_batches_read_like_plain_ones(tmp_path):
    lines = [line(good("g-1")), b"not json", line(good("g-2"))]
    path = tmp_path / "batch.jsonl.gz"
    path.write_bytes(gzip.compress(b"\n".join(lines)))  # no trailing newline on the last line
    result = read_batch(path)
    assert [t.trace_id for t in result.valid] == ["g-1", "g-2"]
    assert [(q.line_no, q.reason) for q in result.quarantined] == [(2, "malformed_json")]


def test_truncated_gzip_is_a_clear_error_naming_the_file(tmp_path):
    payload = gzip.compress(b"\n".join(line(good(f"t{i}")) for i in range(200)))
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(payload[: len(payload) // 2])
    with pytest.raises(BatchError, match=r"cut\.jsonl\.gz.*truncated or corrupt"):
        read_batch(path)


def test_empty_missing_and_misnamed_files_are_errors(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(BatchError, match="empty.jsonl: file is empty"):
        read_batch(empty)
    with pytest.raises(BatchError, match="nope.jsonl: no such file"):
        read_batch(tmp_path / "nope.jsonl")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(BatchError, match="expected a .jsonl or .jsonl.gz"):
        read_batch(tmp_path / "notes.txt")
    empty_gz = tmp_path / "empty.jsonl.gz"
    empty_gz.write_bytes(gzip.compress(b""))
    with pytest.raises(BatchError, match="holds no lines"):
        read_batch(empty_gz)


def test_sharegpt_and_prompt_completion_are_converted():
    sg = parse_trace({"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "hi"},
                                         {"from": "gpt", "value": "hello"}]})
    assert [m.role for m in sg.messages] == ["system", "user", "assistant"]
    assert (sg.prompt, sg.system, sg.final_answer, sg.outcome.success) == ("hi", "s", "hello", True)
    assert sg.metadata.source == "sharegpt"
    assert sg.trace_id == parse_trace({"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "hi"},
                                                         {"from": "gpt", "value": "hello"}]}).trace_id
    pc = parse_trace({"prompt": "2+2?", "completion": "4"})
    assert [(m.role, m.content) for m in pc.messages] == [("user", "2+2?"), ("assistant", "4")]
    assert pc.metadata.source == "prompt_completion"


def test_unknown_sharegpt_role_is_quarantined(tmp_path):
    path = write(tmp_path, [line({"conversations": [{"from": "oracle", "value": "x"}]})])
    assert [q.reason for q in read_batch(path).quarantined] == ["unknown_role"]


def test_arguments_given_as_an_object_become_json_text():
    t = good("obj-args")
    t["messages"][2]["tool_calls"][0]["function"]["arguments"] = {"expression": "2+3"}
    trace = parse_trace(t)
    assert json.loads(trace.messages[2].tool_calls[0].function.arguments) == {"expression": "2+3"}
    assert trace.prompt == "What is 2 + 3?" and trace.system == "be careful"


def test_failure_point_past_the_end_is_invalid(tmp_path):
    t = good("fp")
    t["outcome"] = {"success": False, "failure_point": 99}
    assert [q.reason for q in read_batch(write(tmp_path, [line(t)])).quarantined] == ["invalid_value"]


def test_schema_module_doctests():
    import doctest

    from training_assets import trace_schema
    from training_assets.defs import metadata

    for module in (trace_schema, metadata):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__
