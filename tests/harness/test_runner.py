"""The runner end to end through the real openai client against a scripted chat server on 127.0.0.1:
tool calls parsed or in content, broken call JSON, a model that never stops, a 500, garbage, a server
that is down; every attempt a scored trace that ingest accepts, written whole into the inbox."""

import json
import socket
from collections.abc import Callable

import pytest

from tests.chat_server import ScriptedChat

from training_assets.harness.client import chat_client
from training_assets.harness.errors import HarnessError
from training_assets.harness.runner import run_attempt, run_tasks, write_batch
from training_assets.harness.tasks import Task
from training_assets.traces import read_batch

CALC = Task(task_id="calc-1", family="calculator", prompt="What is 3 * 4?", tools=["calculator"], expected_answer="12")
LISTS = Task(task_id="lists-1", family="lists", prompt="Sort: pear, fig", tools=["sort_list"], expected_answer="fig, pear")


def message(**fields) -> tuple[int, bytes]:
    return 200, json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                            "choices": [{"index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant", **fields}}]}).encode()


def parsed_call(name: str, arguments: dict) -> tuple[int, bytes]:
    return message(content=None, tool_calls=[{"id": "srv_1", "type": "function",
                                              "function": {"name": name, "arguments": json.dumps(arguments)}}])


def scripted(*turns: tuple[int, bytes]) -> Callable[[dict, int], tuple[int, bytes]]:
    """Per task (the user prompt), the turns in order."""
    counters: dict[str, int] = {}

    def reply(body: dict, _index: int) -> tuple[int, bytes]:
        prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
        counters[prompt] = counters.get(prompt, 0) + 1
        return turns[min(counters[prompt], len(turns)) - 1]

    return reply


def _client(server: ScriptedChat):
    return chat_client(server.url, timeout_s=10, max_retries=0)


def test_a_parsed_tool_call_then_an_answer_is_a_success_with_the_tool_result_in_the_trace():
    with ScriptedChat(scripted(parsed_call("calculator", {"expression": "3*4"}), message(content="12."))) as server:
        trace = run_attempt(_client(server), "smol-v1", CALC, generation=3)
    assert trace.outcome.success and trace.outcome.score == 1.0 and trace.final_answer == "12."
    roles = [m.role for m in trace.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert trace.messages[3].content == "12" and trace.messages[3].tool_call_id == trace.messages[2].tool_calls[0].id
    meta = trace.metadata.model_dump()
    assert (meta["model"], meta["family"], meta["task_id"], meta["score"], meta["source"], meta["generation"],
            meta["turns"]) == ("smol-v1", "calculator", "calc-1", 1.0, "harness", 3, 2)
    first, second = server.requests
    assert first["tools"][0]["function"]["name"] == "calculator" and first["max_tokens"] == 96
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": trace.messages[2].tool_calls[0].id,
                                      "name": "calculator", "content": "12"}


def test_a_tool_call_written_in_the_content_is_parsed_and_run():
    call = '<tool_call>{"name": "sort_list", "arguments": {"items": ["pear", "fig"]}}</tool_call>'
    with ScriptedChat(scripted(message(content=call), message(content="fig, pear"))) as server:
        trace = run_attempt(_client(server), "m", LISTS)
    assert trace.outcome.success
    assert trace.messages[2].tool_calls[0].function.name == "sort_list" and trace.messages[3].content == "fig, pear"
    assert server.requests[1]["messages"][2]["tool_calls"][0]["function"]["name"] == "sort_list"


def test_a_wrong_answer_scores_zero():
    with ScriptedChat(scripted(message(content="53 - 41"))) as server:
        trace = run_attempt(_client(server), "m", CALC)
    assert not trace.outcome.success and trace.outcome.score == 0.0 and trace.outcome.error is None
    assert trace.metadata.model_dump()["turns"] == 1


@pytest.mark.parametrize("content, why", [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>', "tool call block is not JSON"),
    ('<tool_call>{"name": "calculator", "arguments": {"expr', "cut off (no </tool_call>)"),
    ('<tool_call>{"arguments": {}}</tool_call>', 'has no "name"'),
])
def test_a_tool_call_whose_json_does_not_parse_is_a_failed_attempt_recorded_in_the_trace(content, why):
    with ScriptedChat(scripted(message(content=content))) as server:
        trace = run_attempt(_client(server), "m", CALC)
    assert not trace.outcome.success and trace.outcome.error.startswith("turn 1: ") and why in trace.outcome.error
    assert trace.messages[-1].role == "assistant" and trace.messages[-1].content == content  # kept as the model wrote it
    assert why in trace.metadata.model_dump()["failed_calls"][0]


def test_a_model_that_never_stops_calling_tools_hits_the_turn_cap():
    with ScriptedChat(scripted(parsed_call("calculator", {"expression": "1+1"}))) as server:
        trace = run_attempt(_client(server), "m", CALC, max_turns=3)
    assert not trace.outcome.success and trace.outcome.error == "turn cap 3 reached" and len(server.requests) == 3
    assert [m.role for m in trace.messages].count("tool") == 3 and trace.final_answer is None


def test_a_bad_tool_call_is_an_error_result_the_model_reads_and_the_attempt_goes_on():
    with ScriptedChat(scripted(parsed_call("calculate", {"expression": "3*4"}),
                                 parsed_call("calculator", {"expression": "3*4"}), message(content="12"))) as server:
        trace = run_attempt(_client(server), "m", CALC)
    assert trace.outcome.success and trace.messages[3].content.startswith("error: unknown tool 'calculate'")


@pytest.mark.parametrize("turn, error", [
    ((500, b'{"error": {"message": "model crashed"}}'), "answered 500"),
    ((200, b"<html>proxy login</html>"), "which is not JSON"),
    ((200, b'{"choices": []}'), "not a chat-completions answer"),
])
def test_an_api_error_or_garbage_mid_attempt_is_a_scored_failed_attempt(turn, error):
    with ScriptedChat(scripted(parsed_call("calculator", {"expression": "3*4"}), turn)) as server:
        trace = run_attempt(_client(server), "m", CALC)
    assert not trace.outcome.success and trace.outcome.error.startswith("turn 2: ") and error in trace.outcome.error
    assert "\n" not in trace.outcome.error and [m.role for m in trace.messages][-1] == "tool"  # the messages so far


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_that_is_down_is_one_harness_error_naming_the_url_not_a_trace_per_task():
    url = f"http://127.0.0.1:{_free_port()}/v1"
    with pytest.raises(HarnessError) as raised:
        run_tasks(chat_client(url, timeout_s=5, max_retries=0), "m", [CALC, LISTS] * 3, concurrency=2)
    message_text = str(raised.value)
    assert f"{url}/chat/completions refused the connection" in message_text and "transformers serve" in message_text
    assert "\n" not in message_text


def test_a_non_http_url_is_refused_in_one_line():
    with pytest.raises(HarnessError, match="is not an http\\(s\\) URL"):
        chat_client("file:///etc/passwd")


def test_run_tasks_reports_per_family_and_writes_a_batch_ingest_accepts(tmp_path):
    tasks = [CALC, LISTS, CALC.model_copy(update={"task_id": "calc-2"})]

    def reply(body, _index):
        prompt = body["messages"][1]["content"]
        if body["messages"][-1]["role"] == "tool":
            return message(content=body["messages"][-1]["content"])
        return (parsed_call("calculator", {"expression": "3*4"}) if "3 * 4" in prompt
                else parsed_call("reverse_list", {"items": ["fig", "pear"]}))

    with ScriptedChat(reply) as server:
        report = run_tasks(_client(server), "smol-v2", tasks, concurrency=2, generation=1)
    assert [t.task_id for t in report.traces] == ["calc-1", "lists-1", "calc-2"]
    assert (report.overall.n, report.overall.successes) == (3, 2)
    assert report.by_family["calculator"].rate == 1.0 and report.by_family["lists"].successes == 0
    assert report.overall.low <= report.overall.rate <= report.overall.high
    assert report.success_by_task() == {"calc-1": 1.0, "calc-2": 1.0, "lists-1": 0.0}

    batch = write_batch(report.traces, tmp_path / "inbox", "harness-g1")
    assert batch.name == "harness-g1.jsonl" and sorted(p.name for p in batch.parent.iterdir()) == ["harness-g1.jsonl"]
    read = read_batch(batch)
    assert len(read.valid) == 3 and not read.quarantined
    with pytest.raises(HarnessError, match="already exists"):
        write_batch(report.traces, tmp_path / "inbox", "harness-g1")
    with pytest.raises(HarnessError, match=r"\.\.|path separator|letter or digit"):
        write_batch(report.traces, tmp_path / "inbox", "../escape")
    assert batch.read_bytes().count(b"\n") == 3


def test_an_interrupted_run_stops_at_the_attempt_in_flight(monkeypatch):
    import signal
    import time

    class Interrupted(Exception):
        pass

    def slow(body, index):
        time.sleep(0.3)
        return message(content="12")

    def interrupt(*_):
        raise Interrupted  # what ^C (KeyboardInterrupt) or the loop's SIGTERM handler (SystemExit) raises

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with ScriptedChat(slow) as server:
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            with pytest.raises(Interrupted):
                run_tasks(_client(server), "m", [CALC] * 20, concurrency=1)
            time.sleep(0.5)  # an attempt already in flight finishes; none after it starts
            assert len(server.requests) <= 3, f"{len(server.requests)} of 20 attempts ran after the interrupt"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
