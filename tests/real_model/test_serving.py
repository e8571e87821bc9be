"""The real base served by `transformers serve` on 127.0.0.1 with the tool template; started and stopped."""

import os

import pytest

from training_assets.base_model.selection import select_base_model
from training_assets.harness.client import chat_client, chat_message
from training_assets.harness.runner import run_attempt
from training_assets.harness.tasks import Task
from training_assets.harness.tools import tool_schemas
from training_assets.serving.server import ModelServer, ServeError, ServeSpec


def test_the_base_is_served_answers_and_stops_with_its_whole_process_group(smol, tmp_path):
    record = select_base_model(tmp_path, "smollm2-135m-instruct")
    task = Task(task_id="calc-1", family="calculator", prompt="How much is 12 * 7?", tools=["calculator"],
                expected_answer="84")
    with ModelServer(ServeSpec(model_dir=record.folder, engine="transformers", dtype="float32")) as server:
        assert server.base_url.startswith("http://127.0.0.1:")
        client = chat_client(server.base_url, timeout_s=120)
        reply = chat_message(client, model=server.model, max_tokens=12, temperature=0.0,
                             messages=[{"role": "user", "content": "What is the capital of France?"}],
                             tools=tool_schemas(["calculator"]))
        assert "Paris" in (reply.get("content") or "")
        trace = run_attempt(client, server.model, task, max_tokens=24, max_turns=2)
        assert trace.metadata.model_dump()["tools"] == tool_schemas(["calculator"])  # ingest folds them back
        assert trace.outcome.success in (True, False) and trace.messages[1].content == task.prompt
        pid = server.process.pid
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # no process of the group is left


def test_a_folder_that_is_no_model_or_a_server_that_dies_is_one_line(tmp_path):
    with pytest.raises(ServeError, match="not a model folder"):
        ModelServer(ServeSpec(model_dir=str(tmp_path)))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ServeError, match="exited with"):
        ModelServer(ServeSpec(model_dir=str(tmp_path), engine="transformers", startup_timeout_s=120)).start()


def test_a_sequential_server_gets_one_request_at_a_time(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    sequential = ModelServer(ServeSpec(model_dir=str(tmp_path), engine="transformers"))
    batching = ModelServer(ServeSpec(model_dir=str(tmp_path), engine="transformers", continuous_batching=True))
    assert sequential.in_flight(8) == 1  # more would queue behind it, each timeout running while it waits
    assert batching.in_flight(8) == 8 and batching.in_flight(1) == 1
