"""`training-assets workflow` and `training-assets agent` from the shell."""

import json
import subprocess

from tests.agent.conftest import BIN, REPO, instance_runs, snapshot


def run_cli(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "training-assets"), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_workflow_run_plans_by_default_and_writes_nothing(agent_env):
    before = snapshot(agent_env["root"])
    done = run_cli("workflow", "run", "train_model", "--set", "sft_checkpoint.max_steps=4", "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["status"] == "PLANNED" and plan["task"]["config"] == {"sft_checkpoint": {"max_steps": 4}}
    assert [s["name"] for s in plan["stages"]][0] == "prepare_corpus"
    assert snapshot(agent_env["root"]) == before and instance_runs(agent_env["home"]) == []


def test_workflow_and_agent_errors_are_one_line_with_exit_code_2(agent_env):
    bad = run_cli("workflow", "run", "train_model", "--task", '{"train": "rlhf"}')
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "task.train" in bad.stderr
    assert run_cli("workflow", "status", "wf-000000000000").returncode == 2
    unreachable = run_cli("agent", "run", "train_model", "--model-url", "http://127.0.0.1:9/v1")
    assert unreachable.returncode == 2 and "unreachable" in unreachable.stderr, unreachable.stderr
    missing_key = run_cli("agent", "run", "train_model", "--model-url", "http://127.0.0.1:9/v1",
                          "--api-key-env", "TA_TEST_NO_SUCH_VARIABLE")
    assert missing_key.returncode == 2 and "TA_TEST_NO_SUCH_VARIABLE" in missing_key.stderr
