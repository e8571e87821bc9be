"""`agent run` reports what happened: a stage whose assets were not materialised (nor fresh) fails the
run, so does one that ran out of turns; a model endpoint's bad answer is one line naming it; the
in-process servers' INFO logs stay out of the output; `--max-turns` below 1 is refused."""

import json
import subprocess
from collections.abc import Callable

import anyio
import pytest

from tests.agent.conftest import BIN, REPO
from tests.chat_server import ScriptedChat


def ChatServer(reply: Callable[[dict], tuple[int, bytes]]) -> ScriptedChat:  # noqa: N802 (was a class)
    """A chat-completions endpoint on 127.0.0.1: ``reply(request body) -> (status, body bytes)``."""
    return ScriptedChat(lambda body, _index: reply(body), content_type=None)


def message(**fields) -> tuple[int, bytes]:
    return 200, json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", **fields}}]}).encode()


def test_a_non_json_answer_from_the_model_endpoint_is_one_line_naming_the_url():
    from training_assets.agent.driver import ChatEndpoint
    from training_assets.agent.errors import AgentError

    with ChatServer(lambda body: (200, b"<html>\n<body>Sign in to the proxy</body></html>")) as chat:
        with pytest.raises(AgentError) as raised:
            ChatEndpoint(chat.url, "m").complete([{"role": "user", "content": "hi"}], [])
    text = str(raised.value)
    assert f"{chat.url}/chat/completions answered 200" in text and "not JSON" in text and "Sign in" in text
    assert "\n" not in text and "Expecting value" not in text


def test_a_stage_is_done_when_its_assets_were_made_in_it_or_are_fresh():
    from training_assets.agent.driver import stale_targets

    states = {"registry_entry": {"stale_status": "STALE", "run_id": "r-old", "stale_causes": ["merged_adapter changed"]},
              "merged_adapter": {"stale_status": "FRESH", "run_id": "r-old"},
              "sft_checkpoint": {"stale_status": "STALE", "run_id": "r-here"},
              "raw_traces": {"stale_status": "MISSING", "run_id": "r-here", "partitions": {"missing": ["b2"]},
                             "stale_causes": ["1 partition(s) not materialised"]}}
    assert stale_targets(list(states) + ["tokenizer"], states, {"r-here"}, {}) == {
        "registry_entry": "stale (merged_adapter changed)",  # register made no call: still stale
        "raw_traces": "missing (1 partition(s) not materialised)",  # one batch of two done is not done
        "tokenizer": "missing"}
    forced = {"merged_adapter": "config given", "sft_checkpoint": "config given"}
    assert stale_targets(["merged_adapter", "sft_checkpoint"], states, {"r-here"}, forced) == {
        "merged_adapter": "config given, but no run of this stage materialised it"}


def test_a_stage_out_of_turns_with_its_assets_not_made_fails_the_run_and_server_logs_stay_out(agent_env):
    """The model keeps calling a read-only tool: after --max-turns the stage fails, saying so and naming
    the assets it left missing; exit 1. The in-process MCP servers' INFO logs are not printed."""
    turns = iter(range(100))

    def always_a_tool_call(body):
        return message(tool_calls=[{"id": f"call_{next(turns)}", "type": "function",
                                    "function": {"name": "list_assets", "arguments": '{"keys": ["tokenizer"]}'}}])

    with ChatServer(always_a_tool_call) as chat:
        done = subprocess.run([str(BIN / "training-assets"), "agent", "run", "train_model", "--model-url", chat.url,
                               "--max-turns", "2", "--json"], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 1, (done.stdout, done.stderr)
    report = json.loads(done.stdout)
    assert (report["status"], report["stopped_at"]) == ("FAILURE", "prepare_corpus") and len(chat.requests) == 2
    [stage] = report["stages"]
    assert stage["status"] == "OUT_OF_TURNS" and stage["out_of_turns"] and stage["turns"] == 2
    assert set(stage["stale_assets"]) == {"held_out_sets", "raw_traces", "minhash_signatures"}
    assert report["reason"].startswith("stage prepare_corpus: the model was still calling tools after 2 turn(s)")
    assert "not materialised in this stage and not fresh: held_out_sets (missing" in report["reason"]
    assert done.stderr == "", done.stderr[-2000:]


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_max_turns_below_one_is_a_one_line_argparse_error(value, capsys):
    from training_assets.cli import build_parser

    with pytest.raises(SystemExit) as raised:
        build_parser(["agent"]).parse_args(["agent", "run", "train_model", "--model-url", "http://127.0.0.1:9/v1",
                                            "--max-turns", value])
    assert raised.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("training-assets agent run: error: argument --max-turns: ") and value in error
