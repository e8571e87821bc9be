"""Resources shared by every stage. Stage-specific settings are ``dg.Config`` on the assets."""

import os
from pathlib import Path

import dagster as dg

from training_assets import paths


class DataRoot(dg.ConfigurableResource):
    """Where every stage reads and writes: ``$TRAINING_ASSETS_DATA`` (default ``./data``)."""

    path: str = ""

    def root(self) -> Path:
        return paths.data_root(self.path or None)


class MlflowTracking(dg.ConfigurableResource):
    """MLflow tracking URI: a SQLite store under the data root unless ``MLFLOW_TRACKING_URI`` is set."""

    tracking_uri: str = ""

    def uri(self, data_root: Path) -> str:
        if self.tracking_uri:
            return self.tracking_uri
        if os.environ.get("MLFLOW_TRACKING_URI"):
            return os.environ["MLFLOW_TRACKING_URI"]
        store = data_root / "mlflow"
        store.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{store / 'mlflow.db'}"


def default_resources() -> dict[str, dg.ConfigurableResource]:
    return {"data_root": DataRoot(), "mlflow": MlflowTracking()}
