"""The workflow driver's decisions against a scripted run backend: reuse, gates, failures, cancellation."""

import pytest

from training_assets.agent import workflow
from training_assets.agent.models import WorkflowReport
from training_assets.agent import workflow_driver
from training_assets.agent.workflow_driver import Driver


class ScriptedBackend:
    """Every asset fresh unless listed in ``missing``; a run succeeds, except ``failing`` assets, and
    evaluates each gate it materialises as ``gates`` says (default: passed)."""

    def __init__(self, missing=(), gates=None, failing=(), gate_state=None, judged_at=None):
        from training_assets.orchestration.catalog import describe_graph

        self._graph = describe_graph()
        self.missing, self.gates, self.failing = set(missing), gates or {}, set(failing)
        self.gate_state = gate_state or {}  # asset -> latest evaluation for a reused report
        self.judged_at = judged_at or {}  # asset -> the thresholds its latest evaluation was judged against
        self.launched: list[tuple[list[str], str | None]] = []
        self.runs: dict[str, dict] = {}

    def graph(self):
        return self._graph

    def asset_states(self, keys=None):
        out = {}
        for key in keys if keys is not None else self._graph:
            node, missing = self._graph[key], key in self.missing
            checks = [{"name": c["name"], "passed": self.gate_state.get(key, True), "description": "latest", "run_id": "old",
                       "metadata": {"thresholds": self.judged_at[key]} if key in self.judged_at else {}}
                      for c in node["checks"]]
            out[key] = {"asset": key, "materialized": not missing, "data_version": None if missing else "v1",
                        "stale_status": "MISSING" if missing else "FRESH", "stale_causes": [], "checks": checks,
                        "metadata": {"version": 1} if key == "registry_entry" else
                                    {"pass_rate": 0.25} if key.endswith("_eval_report") else {},
                        "partitions": {"missing": [], "known": ["b1"], "total": 1} if node["partitioned"] else None}
        return out

    def register_new_batches(self):
        return []

    def launch(self, assets, run_config, tags, partition=None, wait=False):
        run_id = f"run{len(self.launched)}"
        self.launched.append((list(assets), tags.get("training_assets/stage")))
        failed = self.failing & set(assets)
        checks = [{"asset": a, "check": "eval_gate", "passed": self.gates.get(a, True),
                   "description": "pass_rate 0.094 < min 0.900" if self.gates.get(a, True) is False else "all hold",
                   "metadata": {"thresholds": {"min_pass_rate": 0.9}}} for a in assets if a.endswith("_eval_report")]
        gate_failed = any(c["passed"] is False for c in checks)
        self.runs[run_id] = {"run": {"run_id": run_id, "status": "FAILURE" if failed or gate_failed else "SUCCESS",
                                     "tags": dict(tags), "assets": sorted(assets)},
                             "events": {"log_lines": [], "messages": [], "checks": checks,
                                        "materializations": [{"asset": a, "metadata": {"steps": 3}} for a in assets],
                                        "failures": [{"step": a, "message": "boom", "error": "ValueError: boom"}
                                                     for a in sorted(failed)]}}
        return run_id

    def get_run(self, run_id):
        return self.runs[run_id]["run"]

    def run_events(self, run_id, max_lines=20):
        return self.runs[run_id]["events"]


def drive(tmp_path, backend, task=None, cancel=False):
    spec = workflow.load_workflow()
    parsed = workflow.parse_task(spec, task, backend.graph())
    stages = [workflow_driver.StageReport(name=s.name, owner=s.owner) for s in workflow.resolve_stages(spec, parsed)]
    report = WorkflowReport(name="train_model", workflow_id="wf-test", executed=True, status="RUNNING", task=parsed,
                            stages=stages, launched_by="mcp:test")
    workflow_driver.workflow_dir(tmp_path, "wf-test").mkdir(parents=True)
    if cancel:
        workflow_driver.request_cancel(tmp_path, "wf-test")
    return Driver(tmp_path, report, backend).run()


def statuses(report):
    return {s.name: s.status for s in report.stages}


def test_fresh_stages_are_reused_without_runs_and_given_config_forces_a_run(tmp_path):
    backend = ScriptedBackend()
    report = drive(tmp_path, backend, {"config": {"sft_checkpoint": {"max_steps": 2}}})
    assert report.status == "SUCCESS" and report.registry_version == 1
    assert [a for a, _ in backend.launched] == [["sft_checkpoint"]]
    assert statuses(report)["train"] == "SUCCESS" and statuses(report)["curate"] == "REUSED"
    assert workflow_driver.read_report(tmp_path, "wf-test").status == "SUCCESS", "the report file is written"


def test_a_failed_gate_stops_the_workflow_and_nothing_downstream_runs(tmp_path):
    backend = ScriptedBackend(missing={"sft_eval_report", "dpo_checkpoint", "merged_adapter", "registry_entry"},
                              gates={"sft_eval_report": False})
    report = drive(tmp_path, backend)
    assert report.status == "STOPPED_AT_GATE" and report.stopped_at == "eval (sft_eval_report.eval_gate)"
    assert "pass_rate 0.094 < min 0.900" in report.reason
    assert [stage for _, stage in backend.launched] == ["eval"], "align, merge and register never launched"
    after = [s.status for s in report.stages][report.stages.index(next(s for s in report.stages if s.name == "eval")) + 1:]
    assert set(after) == {"SKIPPED"} and report.registry_version is None


def test_a_reused_eval_report_whose_latest_gate_failed_still_stops_the_workflow(tmp_path):
    report = drive(tmp_path, ScriptedBackend(gate_state={"sft_eval_report": False}))
    assert report.status == "STOPPED_AT_GATE" and statuses(report)["eval"] == "GATE_FAILED"
    assert statuses(report)["register_model"] == "SKIPPED"


def test_a_failing_run_stops_the_workflow_with_the_user_error(tmp_path):
    backend = ScriptedBackend(missing={"tokenizer"}, failing={"tokenizer"})
    report = drive(tmp_path, backend)
    assert report.status == "FAILURE" and report.stopped_at == "train_tokenizer"
    assert "ValueError: boom" in report.reason and statuses(report)["build_datasets"] == "SKIPPED"


def test_a_cancel_request_stops_before_the_next_stage(tmp_path):
    backend = ScriptedBackend(missing={"tokenizer"})
    report = drive(tmp_path, backend, cancel=True)
    assert report.status == "CANCELED" and backend.launched == []
    assert statuses(report)["prepare_corpus"] == "CANCELED" and statuses(report)["register_model"] == "SKIPPED"


def test_a_task_that_cannot_merge_fails_before_any_stage(tmp_path):
    backend = ScriptedBackend(missing={"grpo_checkpoint"})
    report = drive(tmp_path, backend, {"align": ["dpo"]})
    assert report.status == "FAILURE" and "add 'grpo' to task.align" in report.reason and backend.launched == []


@pytest.mark.parametrize("train,forced", [("pretrain", "base_checkpoint"), ("sft", None)])
def test_train_pretrain_retrains_the_base_checkpoint(tmp_path, train, forced):
    backend = ScriptedBackend()
    drive(tmp_path, backend, {"train": train})
    ran = [a for assets, _ in backend.launched for a in assets]
    assert ran == (["base_checkpoint", "sft_checkpoint"] if forced else [])


STORED_AT_HALF = {"sft_eval_report": {"min_pass_rate": 0.5, "max_bpb_vs_uniform": 0.97}}
REEVALUATE = "failed at min_pass_rate 0.500 (pass rate 0.250); now min_pass_rate 0.000 -> will re-evaluate"


def test_a_gate_failed_at_another_threshold_is_re_evaluated_not_sticky(tmp_path):
    # the last run set sft_eval_report.min_pass_rate=0.5 and failed; this one leaves it at the default 0.0
    backend = ScriptedBackend(gate_state={"sft_eval_report": False}, judged_at=STORED_AT_HALF)
    report = drive(tmp_path, backend)
    assert report.status == "SUCCESS", report.reason
    assert ["sft_eval_report"] in [assets for assets, _ in backend.launched]
    eval_stage = next(s for s in report.stages if s.name == "eval")
    assert eval_stage.materialize[0].reason == REEVALUATE and eval_stage.gates[0].passed is True


def test_the_plan_shows_the_stored_verdict_and_a_threshold_change_re_evaluates(tmp_path):
    from training_assets.commands.workflow import _lines

    spec = workflow.load_workflow()
    backend = ScriptedBackend(gate_state={"sft_eval_report": False}, judged_at=STORED_AT_HALF)
    plan = workflow.plan_workflow(spec, workflow.parse_task(spec, None, backend.graph()), backend, tmp_path)
    eval_stage = next(s for s in plan.stages if s.name == "eval")
    assert [s.asset for s in eval_stage.materialize] == ["sft_eval_report"]
    assert f"gate sft_eval_report.eval_gate: pending - {REEVALUATE}" in "\n".join(_lines(plan))

    backend.judged_at = {"sft_eval_report": {"min_pass_rate": 0.0, "max_bpb_vs_uniform": 0.97}}  # as in force now
    plan = workflow.plan_workflow(spec, workflow.parse_task(spec, None, backend.graph()), backend, tmp_path)
    kept = next(s for s in plan.stages if s.name == "eval")
    assert kept.materialize == [] and kept.gates[0].passed is False, "the stored verdict, which will stop the workflow"
    assert kept.gates[0].thresholds["min_pass_rate"] == 0.0 and "gate sft_eval_report.eval_gate: FAILED" in "\n".join(_lines(plan))


def test_the_estimate_is_unknown_when_a_trainer_runs_epochs_over_a_dataset_not_built(tmp_path):
    from training_assets.commands.workflow import _lines

    spec, backend = workflow.load_workflow(), ScriptedBackend()
    epochs = workflow.parse_task(spec, {"config": {"sft_checkpoint": {"max_steps": -1}}}, backend.graph())
    plan = workflow.plan_workflow(spec, epochs, backend, tmp_path)
    assert plan.estimated_steps is None and "(estimated training steps: unknown)" in _lines(plan)[0]
    steps = workflow.parse_task(spec, {"config": {"sft_checkpoint": {"max_steps": 5}}}, backend.graph())
    adapters = sum(backend.graph()[a]["config"]["max_steps"]["default"] for a in ("dpo_checkpoint", "grpo_checkpoint"))
    assert workflow.plan_workflow(spec, steps, backend, tmp_path).estimated_steps == 5 + adapters, "sft, then both adapters"


def test_the_executed_workflows_report_keeps_the_plans_estimate(tmp_path, monkeypatch):
    class Started:  # the detached driver is not started: only what start() records is under test
        pid = 4242

    monkeypatch.setattr(workflow_driver.subprocess, "Popen", lambda *a, **k: Started())
    spec = workflow.load_workflow()
    task = workflow.parse_task(spec, None, ScriptedBackend().graph())
    started = workflow_driver.start(spec, task, None, "cli:workflow", tmp_path, estimated_steps=7)
    assert workflow_driver.read_report(tmp_path, started.workflow_id).estimated_steps == 7
