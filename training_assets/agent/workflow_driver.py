"""Executes a ``train_model`` workflow, stage by stage, as Dagster runs; stops at a failed gate.

    report = start(spec, task, backend_url=None, launched_by="mcp:ml_orchestrator", root=root)  # returns at once
    python -m training_assets.agent.workflow_driver ROOT WORKFLOW_ID   # the detached driver it starts

The driver decides each stage when it reaches it (from the instance's asset states then, so a
stage whose inputs did not change is reused without a run), launches the stage's run and waits
for it: locally the run executes inside the driver, with ``--dagster-url`` it goes through the
webserver. After a stage with a gate it reads the gate's blocking check from that run (or, for a
reused eval report, its latest evaluation); a failed or missing verdict stops the workflow, so
nothing downstream runs and nothing is registered. The report (``<root>/workflows/<id>/report.json``)
is rewritten atomically at every transition; every run carries the workflow and stage tags.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from training_assets.agent import graph_map
from training_assets.agent.models import GateVerdict, RunReport, StageReport, Task, WorkflowReport
from training_assets.agent.planning import decide
from training_assets.agent.runs import make_backend, run_report
from training_assets.agent.workflow import (ResolvedStage, WorkflowSpec, check_merge_inputs, forced_assets,
                                            gate_reevaluations, load_workflow, resolve_stages, stored_verdict)
from training_assets.orchestration.backends import RunBackend
from training_assets.orchestration.vocabulary import LAUNCHED_BY_TAG, STAGE_TAG, WORKFLOW_TAG

MODULE = "training_assets.agent.workflow_driver"
STAGE_OWNER_TAG = "training_assets/stage_owner"
DRIVER_START_S = 120  # a report without a driver pid younger than this is a driver still starting
METRIC_KEYS = ("steps", "final_loss", "tokens_per_s", "peak_rss_mb", "pass_rate", "records", "rows", "vocab_size",
               "version", "examples", "quarantined", "valid")


def workflow_dir(root: Path, workflow_id: str) -> Path:
    return Path(root) / "workflows" / workflow_id


def _save(root: Path, report: WorkflowReport) -> None:
    from training_assets.storage import write_json_atomic  # pyarrow: ~0.3 s, the MCP server imports this module at start

    write_json_atomic(workflow_dir(root, report.workflow_id or "") / "report.json",
                      report.model_dump(mode="json", exclude={"current_run"}))


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except (ProcessLookupError, FileNotFoundError):
        return False
    except (PermissionError, OSError):
        return True
    return state != "Z"


def read_report(root: Path, workflow_id: str) -> WorkflowReport | None:
    path = workflow_dir(root, workflow_id) / "report.json"
    if not path.is_file():
        return None
    report = WorkflowReport.model_validate_json(path.read_text(encoding="utf-8"))
    starting = report.driver_pid is None and time.time() - path.stat().st_mtime < DRIVER_START_S
    if report.status == "RUNNING" and not starting and not _pid_alive(report.driver_pid):
        report.status, report.reason = "FAILURE", f"the workflow driver (pid {report.driver_pid}) exited mid-run"
    return report


def running_workflows(root: Path) -> list[WorkflowReport]:
    folder = Path(root) / "workflows"
    found = [read_report(root, p.name) for p in sorted(folder.iterdir())] if folder.is_dir() else []
    return [r for r in found if r is not None and r.status == "RUNNING"]


def request_cancel(root: Path, workflow_id: str) -> None:
    (workflow_dir(root, workflow_id) / "cancel").write_text("requested\n", encoding="utf-8")


def start(spec: WorkflowSpec, task: Task, backend_url: str | None, launched_by: str, root: Path,
          estimated_steps: int | None = None) -> WorkflowReport:
    """Record the workflow (RUNNING, every stage PENDING, the plan's ``estimated_steps``, None:
    unknown) and start its detached driver."""
    workflow_id = f"wf-{uuid.uuid4().hex[:12]}"
    stages = [StageReport(name=s.name, owner=s.owner, tools=s.tools) for s in resolve_stages(spec, task)]
    report = WorkflowReport(name=spec.name, workflow_id=workflow_id, executed=True, status="RUNNING", task=task,
                            stages=stages, launched_by=launched_by, estimated_steps=estimated_steps)
    folder = workflow_dir(root, workflow_id)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "backend").write_text(backend_url or "", encoding="utf-8")
    _save(root, report)  # before the driver starts: from then on only the driver writes the report
    with (folder / "driver.log").open("ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", MODULE, str(root), workflow_id],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=dict(os.environ))
    return report.model_copy(update={"driver_pid": proc.pid})


def _metrics(run: RunReport) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for output in run.outputs:
        picked = {k: output.metadata[k] for k in METRIC_KEYS if k in output.metadata}
        if picked:
            out[output.asset if not output.partition else f"{output.asset}[{output.partition}]"] = picked
    return out


def _verdict_from_run(gate: Any, run: RunReport | None) -> GateVerdict | None:
    for check in (run.checks if run else []):
        if check.asset == gate.asset and check.check == gate.check:
            reasons = [r.strip() for r in check.description.split(";") if r.strip()]
            return GateVerdict(report=gate.asset, check=gate.check, passed=check.passed, reasons=reasons,
                               run_id=run.run_id, thresholds=check.metadata.get("thresholds") or {})
    return None


class Driver:
    def __init__(self, root: Path, report: WorkflowReport, backend: RunBackend) -> None:
        self.root, self.report, self.backend = root, report, backend
        self.spec = load_workflow(report.name)
        self.graph = backend.graph()

    def _tags(self, stage: ResolvedStage) -> dict[str, str]:
        return {LAUNCHED_BY_TAG: self.report.launched_by, WORKFLOW_TAG: self.report.workflow_id or "",
                STAGE_TAG: stage.name, STAGE_OWNER_TAG: stage.owner}

    def _run(self, stage: ResolvedStage, rep: StageReport, assets: list[str], partition: str | None = None) -> RunReport:
        per_asset = {a: self.report.task.config.get(a, {}) for a in assets}
        run_id = self.backend.launch(assets, graph_map.dagster_run_config(per_asset), self._tags(stage),
                                     partition=partition, wait=True)
        rep.run_ids.append(run_id)
        _save(self.root, self.report)
        run = run_report(self.backend, run_id)
        rep.metrics.update(_metrics(run))
        return run

    def _stop(self, status: str, stage: str, reason: str) -> None:
        self.report.status, self.report.stopped_at, self.report.reason = status, stage, reason

    def run_stage(self, stage: ResolvedStage, rep: StageReport) -> None:
        partitioned = [a for a in stage.assets if self.graph[a]["partitioned"]]
        if partitioned:
            self.backend.register_new_batches()
        states = self.backend.asset_states(stage.assets + [g.asset for g in stage.gates])
        # a report judged against other thresholds than the task's runs again (its verdict is not sticky)
        forced = forced_assets(stage, self.report.task) | gate_reevaluations(stage, self.report.task, states, self.graph)
        decision = decide(self.graph, states, stage.assets, forced)
        rep.materialize, rep.reused = decision.materialize, decision.reused
        runs: list[RunReport] = []
        missing = sorted({m for a in partitioned for m in (states[a].get("partitions") or {}).get("missing", [])})
        rep.partitions = missing
        for batch in missing:  # one run per trace batch, every partitioned asset of the stage
            runs.append(self._run(stage, rep, partitioned, partition=batch))
            if runs[-1].status != "SUCCESS":
                break
        if decision.assets and all(r.status == "SUCCESS" for r in runs):
            runs.append(self._run(stage, rep, decision.assets))
        bad = next((r for r in runs if r.status != "SUCCESS"), None)
        last = runs[-1] if runs else None
        for gate in stage.gates:
            ran = last is not None and gate.asset in last.assets
            verdict = _verdict_from_run(gate, last) if ran else stored_verdict(gate, states.get(gate.asset, {}))
            if verdict is None:
                verdict = GateVerdict(report=gate.asset, check=gate.check, passed=None,
                                      reasons=[f"run {last.run_id} ended {last.status} before the gate was evaluated"])
            rep.gates.append(verdict)
        failed_gate = next((g for g in rep.gates if g.passed is not True), None)
        if bad is not None and bad.status == "CANCELED":
            rep.status = "CANCELED"
            self._stop("CANCELED", stage.name, f"run {bad.run_id} was canceled")
        elif failed_gate is not None and failed_gate.passed is False:
            rep.status = "GATE_FAILED"
            self._stop("STOPPED_AT_GATE", f"{stage.name} ({failed_gate.report}.{failed_gate.check})",
                       f"{failed_gate.report} gate failed: {'; '.join(failed_gate.reasons)}")
        elif bad is not None:
            rep.status = "FAILURE"
            self._stop("FAILURE", stage.name, f"run {bad.run_id} ended {bad.status}: {'; '.join(bad.failures[:3])}")
        elif failed_gate is not None:
            rep.status = "GATE_FAILED"
            self._stop("STOPPED_AT_GATE", stage.name, f"{failed_gate.report} gate has no verdict: "
                                                      f"{'; '.join(failed_gate.reasons)}")
        else:
            rep.status = "SUCCESS" if runs else "REUSED"

    def run(self) -> WorkflowReport:
        stages = resolve_stages(self.spec, self.report.task)
        try:
            check_merge_inputs(self.report.task, self.backend.asset_states(["dpo_checkpoint", "grpo_checkpoint"]))
        except Exception as exc:  # an impossible task: no stage runs
            self._stop("FAILURE", stages[0].name, str(exc))
        for stage, rep in zip(stages, self.report.stages):
            if self.report.status != "RUNNING":
                rep.status = "SKIPPED"
                continue
            if (workflow_dir(self.root, self.report.workflow_id or "") / "cancel").exists():
                rep.status = "CANCELED"
                self._stop("CANCELED", stage.name, "cancel requested (cancel_run) before this stage")
                continue
            rep.status = "RUNNING"
            _save(self.root, self.report)
            try:
                self.run_stage(stage, rep)
            except Exception as exc:  # recorded in the report the caller reads; the traceback goes to driver.log
                traceback.print_exc()
                rep.status = "FAILURE"
                self._stop("FAILURE", stage.name, f"{type(exc).__name__}: {exc}")
            finally:
                _save(self.root, self.report)
        if self.report.status == "RUNNING":
            self.report.status = "SUCCESS"
            entry = self.backend.asset_states(["registry_entry"]).get("registry_entry", {})
            version = (entry.get("metadata") or {}).get("version")
            self.report.registry_version = int(version) if version is not None else None
        _save(self.root, self.report)
        return self.report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m training_assets.agent.workflow_driver ROOT WORKFLOW_ID", file=sys.stderr)
        return 2
    root, workflow_id = Path(argv[0]), argv[1]
    report = read_report(root, workflow_id)
    if report is None:
        print(f"no workflow {workflow_id} under {root}", file=sys.stderr)
        return 2
    report.status, report.driver_pid = "RUNNING", os.getpid()
    _save(root, report)
    url = (workflow_dir(root, workflow_id) / "backend").read_text(encoding="utf-8").strip() or None
    final = Driver(root, report, make_backend(url)).run()
    print(f"workflow {workflow_id}: {final.status} {final.reason}", flush=True)
    return 0 if final.status == "SUCCESS" else 1


if __name__ == "__main__":
    sys.exit(main())
