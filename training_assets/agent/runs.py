"""How the agent surface reads a Dagster run: the backend for a URL, and a run as a ``RunReport``.

    backend = make_backend()                              # LocalRuns: $DAGSTER_HOME, a detached worker per launch
    backend = make_backend("http://127.0.0.1:3000")       # GraphQLRuns: a running dagster-webserver (production)
    report = run_report(backend, run_id)                  # status in Dagster's words, logs, metrics, outputs

The backends themselves live in ``training_assets.orchestration`` (``backends.py``, ``graphql.py``),
the one package that talks to a Dagster instance from outside; this module turns their plain
dicts into the agent's models and parses the training loop's step lines into progress.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping

from training_assets.agent.models import AssetOutput, CheckResult, LogLine, RunReport, StepMetrics
from training_assets.orchestration.backends import LocalRuns, RunBackend
from training_assets.orchestration.graphql import GraphQLRuns
from training_assets.orchestration.vocabulary import PLANNED_STEPS_TAG, TERMINAL

# `step 3 loss 5.1234 lr 3.00e-03 1234 tok/s eta 12s` (trainers.accelerate_launch, through Pipes);
# the loop's own log writes `step 3/8 loss ...`
STEP_LINE = re.compile(r"step (\d+)(?:/(\d+))? loss ([-+]?(?:[\d.]+(?:e[-+]?\d+)?|nan|inf))"
                       r"(?:.*?([\d.]+) tok/s)?(?:.*?eta ([\d.]+)s)?", re.IGNORECASE)


def make_backend(dagster_url: str | None = None) -> RunBackend:
    return GraphQLRuns(dagster_url) if dagster_url else LocalRuns()


def step_metrics(messages: Iterable[tuple[str | None, str]], planned: Mapping[str, int] | None = None) -> list[StepMetrics]:
    """The latest training-step line per asset from ``(step_key, message)`` log messages."""
    latest: dict[str | None, StepMetrics] = {}
    for step_key, message in messages:
        match = STEP_LINE.search(message or "")
        if not match:
            continue
        step, total, loss, tok_s, eta = match.groups()
        latest[step_key] = StepMetrics(
            asset=step_key, step=int(step), loss=float(loss),
            total_steps=int(total) if total else (planned or {}).get(step_key or ""),
            tokens_per_s=float(tok_s) if tok_s else None, eta_s=float(eta) if eta else None)
    return list(latest.values())


def _output(m: Mapping[str, Any]) -> AssetOutput:
    meta = dict(m.get("metadata") or {})
    uri = meta.get("checkpoint_uri") or meta.get("uri")
    return AssetOutput(asset=m["asset"], partition=m.get("partition"), data_version=m.get("data_version"),
                       uri=str(uri) if uri is not None else None, metadata=meta)


def run_report(backend: RunBackend, run_id: str, max_lines: int = 20) -> RunReport | None:
    """Everything ``get_run`` answers about a Dagster run, or None when the backend has no such run."""
    run = backend.get_run(run_id)
    if run is None:
        return None
    events = backend.run_events(run_id, max_lines)
    try:
        planned = json.loads(run["tags"].get(PLANNED_STEPS_TAG, "{}"))
    except ValueError:
        planned = {}
    outputs = [_output(m) for m in events["materializations"]]
    registry = next((o.metadata.get("version") for o in outputs if o.asset == "registry_entry"), None)
    failures = [f"{f['step'] or 'run'}: {f['error'] or f['message']}" for f in events["failures"]]
    return RunReport(
        run_id=run_id, status=run["status"], assets=run["assets"], partition=run.get("partition"), tags=run["tags"],
        created_at=run.get("created_at"), started_at=run.get("started_at"), ended_at=run.get("ended_at"),
        log_lines=[LogLine(**line) for line in events["log_lines"]],
        metrics=step_metrics(events["messages"], planned),
        outputs=outputs if run["status"] in TERMINAL else [],
        checks=[CheckResult(**c) for c in events["checks"]], failures=list(dict.fromkeys(failures)),
        registry_version=int(registry) if registry is not None else None)
