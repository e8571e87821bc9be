"""Deeply nested JSON: quarantined (too_deeply_nested) before it is parsed, the same in every reader.

json.loads, pydantic and model_dump recurse once per level: without the limit, 100k brackets
raise RecursionError in the CLI and the asset, and metadata a few hundred levels deep passes
validation but fails the partition write.
"""

import json

import pyarrow.parquet as pq

from training_assets import cli, ingest
from training_assets.trace_schema import MAX_JSON_DEPTH, json_depth
from training_assets.traces import read_batch, summarise_batch


def trace(trace_id, **over):
    return {"trace_id": trace_id, "task_id": "t", "messages": [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "ok"}], "outcome": {"success": True}, **over}


def nested(levels):
    """A JSON value ``levels`` deep: [[...[]...]]."""
    return json.loads("[" * levels + "]" * levels)


def deep_arguments():
    t = trace("deep-args")
    t["messages"][1]["tool_calls"] = [{"id": "c", "function": {"name": "f", "arguments": "[" * 100_000}}]
    return t


# A trace is 1 level, its metadata 2, so metadata.x may add MAX_JSON_DEPTH - 2 levels.
LINES = [
    (b"[" * 100_000, "too_deeply_nested"),  # RecursionError in json.loads without the limit
    (json.dumps(trace("deep-meta", metadata={"x": nested(400)})).encode(), "too_deeply_nested"),  # model_dump fails
    (json.dumps(deep_arguments()).encode(), "too_deeply_nested"),  # json.loads of the arguments text
    (json.dumps(trace("one-too-deep", metadata={"x": nested(MAX_JSON_DEPTH - 1)})).encode(), "too_deeply_nested"),
    (json.dumps(trace("at-the-limit", metadata={"x": nested(MAX_JSON_DEPTH - 2)})).encode(), None),
    (json.dumps(trace("brackets-in-text", final_answer="[{" * 50_000)).encode(), None),  # strings are not counted
]


def write_batch(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_bytes(b"\n".join(line for line, _ in LINES) + b"\n")
    return path


def expected_quarantine():
    return [(no, reason) for no, (_, reason) in enumerate(LINES, start=1) if reason]


def test_json_depth_counts_brackets_outside_strings_only():
    assert json_depth(b'{"a": [1, {"b": "[[[[\\"{{"}]}') == 3
    assert json_depth(b"[]" * 1000) == 1 and json_depth(b"[" * 100_000) == 100_000
    assert json_depth(b'"unterminated [[[[') == 0


def test_read_batch_and_the_summary_quarantine_deep_lines_and_keep_the_rest(tmp_path):
    path = write_batch(tmp_path)
    result = read_batch(path)
    assert [(q.line_no, q.reason) for q in result.quarantined] == expected_quarantine()
    assert [t.trace_id for t in result.valid] == ["at-the-limit", "brackets-in-text"]
    assert f"MAX_JSON_DEPTH={MAX_JSON_DEPTH}" in result.quarantined[0].detail
    assert "arguments of tool call 'f'" in result.quarantined[2].detail
    summary = summarise_batch(path)
    assert (summary.lines, summary.valid, dict(summary.reasons)) == (6, 2, {"too_deeply_nested": 4})


def test_the_cli_reports_deep_lines_instead_of_a_traceback(tmp_path, capsys):
    assert cli.main(["ingest", str(write_batch(tmp_path)), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["reasons"] == {"too_deeply_nested": 4} and report["valid"] == 2


def test_the_partition_is_written_with_deep_lines_in_its_quarantine(data_root, tmp_path):
    out = ingest.raw_traces_dir("deep-1", data_root)
    report = ingest.write_raw_traces("deep-1", write_batch(tmp_path), out)  # what the raw_traces asset runs
    assert (report.valid, report.reasons) == (2, {"too_deeply_nested": 4})
    quarantine = [json.loads(line) for line in (out / ingest.QUARANTINE_FILE).read_text().splitlines()]
    assert [(q["line_no"], q["reason"]) for q in quarantine] == expected_quarantine()
    assert pq.read_table(out / ingest.TRACES_FILE).column("trace_id").to_pylist() == ["at-the-limit",
                                                                                     "brackets-in-text"]
