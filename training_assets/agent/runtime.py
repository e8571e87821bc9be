"""What every tool call shares: the run backend, the persona the server serves, the data root."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from training_assets import paths
from training_assets.agent.runs import make_backend
from training_assets.orchestration.backends import RunBackend


@dataclass
class Runtime:
    backend: RunBackend = field(default_factory=make_backend)
    persona: str | None = None
    dagster_url: str | None = None

    @property
    def root(self) -> Path:
        """``$TRAINING_ASSETS_DATA`` (default ``./data``), read at each call."""
        return paths.data_root()

    @property
    def launched_by(self) -> str:
        """The ``training_assets/launched_by`` tag of every run this server launches."""
        return f"mcp:{self.persona or 'any'}"

    def where(self) -> str:
        """Where runs go, for messages."""
        if self.dagster_url:
            return f"the Dagster webserver at {self.dagster_url}"
        return f"the local Dagster instance at {os.environ.get('DAGSTER_HOME', '(DAGSTER_HOME unset)')}"


def tracking_uri(root: Path) -> str | None:
    """The registry's MLflow URI without creating anything: ``$MLFLOW_TRACKING_URI``, else the data
    root's SQLite store if it exists (None: nothing was ever registered there)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    db = root / "mlflow" / "mlflow.db"
    return f"sqlite:///{db}" if db.is_file() else None
