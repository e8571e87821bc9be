"""An eval report's cases file comes from run config: outside the data root (and the allowed source
folders) it is refused before the checkpoint is even read."""

import dagster as dg

from training_assets.defs.evaluation.assets import kind_eval_reports
from training_assets.defs.resources import DataRoot, MlflowTracking

[sft_eval_report] = [a for a in kind_eval_reports if a.key.to_user_string() == "sft_eval_report"]


def test_a_cases_file_outside_the_data_root_is_refused(data_root, monkeypatch):
    monkeypatch.delenv("TRAINING_ASSETS_SOURCE_DIRS", raising=False)
    result = dg.materialize(
        [sft_eval_report], resources={"data_root": DataRoot(path=str(data_root)), "mlflow": MlflowTracking()},
        run_config={"ops": {"sft_eval_report": {"config": {"cases_path": "/etc/passwd"}}}},
        instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    message = failure.step_failure_data.error.cause.message  # the asset's own error, under Dagster's wrapper
    assert "sft_eval_report config cases_path: /etc/passwd is outside the data root" in message
    assert "TRAINING_ASSETS_SOURCE_DIRS" in message and "manifest" not in message
