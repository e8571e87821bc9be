"""Experiment tracking for training runs: MLflow or Weights & Biases (``TrainConfig.tracker``).

MLflow: embedded default a SQLite store under the data root (``<root>/mlflow/mlflow.db``, the same
URI the Dagster ``mlflow`` resource gives); in production set ``TrainConfig.tracking_uri`` or
``$MLFLOW_TRACKING_URI`` to a server. A run logs the config and the plan as params, per-step
metrics (loss, lr, tokens/s), the loss curve as a PNG artifact, the checkpoint path and the
summary, tagged with ``dagster_run_id`` when the caller passes it in ``tracker_tags``.

wandb: the same metrics, config, tags, summary and loss-curve image in a ``wandb`` run under
``<output_dir>/wandb/``. Without ``WANDB_API_KEY`` (or an explicit ``WANDB_MODE``) the run is
offline: a real run directory, nothing sent anywhere; ``wandb sync <run dir>`` uploads it later.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from training_assets import paths

EXPERIMENT = "training_assets"


def default_tracking_uri(root: str | os.PathLike[str] | None = None) -> str:
    """``$MLFLOW_TRACKING_URI``, else ``sqlite:///<data root>/mlflow/mlflow.db``."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    store = paths.data_root(root) / "mlflow"
    store.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{store / 'mlflow.db'}"


def local_artifact_location(tracking_uri: str) -> str | None:
    """Artifacts of a SQLite store live next to its database, never in MLflow's default ``./mlruns``
    under whatever the working directory is; other stores keep their server's default."""
    if tracking_uri.startswith("sqlite:///"):
        return str(Path(tracking_uri.removeprefix("sqlite:///")).parent / "artifacts")
    return None


def store_template() -> Path:
    """An empty, migrated MLflow SQLite store for this MLflow version, made once per host.

    MLflow creates a SQLite store by running its Alembic migrations one commit (and fsync) at a
    time: ~5 s of CPU, and up to 46 s wall measured on this 2-core machine under load, paid by
    every fresh data root (each test's, each demo's). The result depends only on the MLflow
    version, so it is built once under ``$XDG_CACHE_HOME/training_assets/`` and copied.
    """
    import mlflow  # seconds to import: only when a run is tracked
    from mlflow import MlflowClient  # mlflow

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "training_assets"
    path = cache / f"mlflow-{mlflow.__version__}-empty.db"
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f".{path.name}.{os.getpid()}.tmp"
        tmp.unlink(missing_ok=True)
        uri = f"sqlite:///{tmp}"
        MlflowClient(tracking_uri=uri, registry_uri=uri).search_experiments()  # runs the migrations
        os.replace(tmp, path)  # atomic: a concurrent builder's copy is as good as ours
    return path


def prepare_store(tracking_uri: str) -> None:
    """A SQLite store that does not exist yet starts as a copy of ``store_template()``; others are left alone.

    The copy's Default experiment points at this store's artifact folder (MLflow would have
    pointed it at ``./mlruns`` of the working directory). ``os.link`` publishes it without
    replacing a store another process created meanwhile.
    """
    if not tracking_uri.startswith("sqlite:///"):
        return
    db = Path(tracking_uri.removeprefix("sqlite:///"))
    if db.exists():
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    tmp = db.with_name(f".{db.name}.{os.getpid()}.tmp")
    shutil.copyfile(store_template(), tmp)
    try:
        with contextlib.closing(sqlite3.connect(tmp)) as con, con:
            con.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                        (str(Path(local_artifact_location(tracking_uri) or db.parent) / "0"),))
        os.link(tmp, db)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def mlflow_client(tracking_uri: str) -> Any:
    """``MlflowClient`` for tracking and the registry on ``tracking_uri`` (a new SQLite store seeded first)."""
    from mlflow import MlflowClient  # mlflow: seconds, only when a client is asked for

    prepare_store(tracking_uri)
    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def loss_curve_png(losses: list[float], title: str = "training loss") -> bytes:
    """A small PNG of loss against optimizer step."""
    import matplotlib  # ~0.5 s, only when a curve is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # matplotlib: after use("Agg"), only when a curve is drawn

    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot(range(1, len(losses) + 1), losses, marker="." if len(losses) < 60 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


class _NoRun:
    """Tracking disabled (tracker='none' or a non-main process)."""

    run_id: str | None = None
    uri: str | None = None

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        return None

    def finish(self, result: Any, checkpoint_dir: str) -> None:
        return None


class MlflowRun:
    """One MLflow run; ``log_step`` is the loop callback, ``finish`` logs the curve and the checkpoint."""

    def __init__(self, client: Any, run_id: str, uri: str) -> None:
        self.client, self.run_id, self.uri = client, run_id, uri
        self._buffer: list[Any] = []

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric  # mlflow: seconds, only when a run is tracked

        now = int(time.time() * 1000)
        self._buffer += [Metric(k, float(v), now, step) for k, v in metrics.items()]
        if len(self._buffer) >= 200:
            self.flush()

    def flush(self) -> None:
        if self._buffer:
            self.client.log_batch(self.run_id, metrics=self._buffer)
            self._buffer = []

    def finish(self, result: Any, checkpoint_dir: str) -> None:
        self.flush()
        summary = {"final_loss": result.final_loss, "tokens_per_s": result.tokens_per_s,
                   "peak_rss_mb": result.peak_rss_mb, "wall_s": result.wall_s, "steps": result.steps}
        for k, v in summary.items():
            self.client.log_metric(self.run_id, f"summary/{k}", float(v))
        self.client.set_tag(self.run_id, "checkpoint_dir", checkpoint_dir)
        if result.resumed_from:
            self.client.set_tag(self.run_id, "resumed_from", result.resumed_from)
        self.client.log_image(self.run_id, _png_to_array(loss_curve_png(result.losses)), artifact_file="loss_curve.png")


class WandbRun:
    """One wandb run; the same callbacks as ``MlflowRun``."""

    def __init__(self, run: Any) -> None:
        self.run, self.run_id, self.uri = run, run.id, str(Path(run.dir).parent)  # .../wandb/<offline-run-...>

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log({k: float(v) for k, v in metrics.items()}, step=step)

    def finish(self, result: Any, checkpoint_dir: str) -> None:
        import wandb  # optional, seconds: only when W&B logging is on

        self.run.summary.update({"final_loss": result.final_loss, "tokens_per_s": result.tokens_per_s,
                                 "peak_rss_mb": result.peak_rss_mb, "wall_s": result.wall_s, "steps": result.steps,
                                 "checkpoint_dir": checkpoint_dir, "resumed_from": result.resumed_from or ""})
        curve = Path(self.uri) / "loss_curve.png"
        curve.write_bytes(loss_curve_png(result.losses))
        self.run.log({"loss_curve": wandb.Image(str(curve))}, step=max(result.steps, 0))


def wandb_mode() -> str:
    """``$WANDB_MODE`` when set, else online only with an API key: a host without one never tries the network."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


@contextlib.contextmanager
def _wandb_run(config: Any, plan: Any) -> Iterator[WandbRun]:
    try:
        import wandb  # optional, seconds: only when W&B logging is on
    except ImportError as exc:
        raise RuntimeError("tracker='wandb' needs wandb: pip install 'training-assets[wandb]'") from exc
    folder = Path(config.output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    run = wandb.init(project=os.environ.get("WANDB_PROJECT", EXPERIMENT), name=config.run_name or plan.kind,
                     dir=str(folder), mode=wandb_mode(), tags=[f"{k}:{v}" for k, v in sorted((config.tracker_tags or {}).items())],
                     config={**config.to_dict(), "plan": plan.to_dict()}, settings=wandb.Settings(silent=True))
    try:
        yield WandbRun(run)
    except BaseException:
        run.finish(exit_code=1)
        raise
    run.finish()


def _png_to_array(png: bytes) -> Any:
    import matplotlib.image as mpimg  # matplotlib: ~0.5 s, only for a W&B image

    return mpimg.imread(io.BytesIO(png), format="png")


@contextlib.contextmanager
def start_run(config: Any, plan: Any, enabled: bool = True) -> Iterator[Any]:
    """Context: an ``MlflowRun`` / ``WandbRun`` for ``config.tracker`` (when ``enabled``), else a no-op run.

    A failed training marks the run FAILED rather than leaving it RUNNING.
    """
    if config.tracker == "none" or not enabled:
        yield _NoRun()
        return
    if config.tracker == "wandb":
        with _wandb_run(config, plan) as run:
            yield run
        return
    uri = config.tracking_uri or default_tracking_uri()
    client = mlflow_client(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    experiment_id = (experiment.experiment_id if experiment
                     else client.create_experiment(EXPERIMENT, artifact_location=local_artifact_location(uri)))
    tags = {"kind": plan.kind, **(config.tracker_tags or {})}
    run = client.create_run(experiment_id, run_name=config.run_name or f"{plan.kind}", tags=tags)
    run_id = run.info.run_id
    params = {k: str(v)[:500] for k, v in config.to_dict().items() if k != "tracker_tags"}
    params.update({f"plan.{k}": str(v)[:500] for k, v in plan.to_dict().items() if k != "notes"})
    from mlflow.entities import Param  # mlflow: seconds, only when a run is tracked

    client.log_batch(run_id, params=[Param(k, v) for k, v in sorted(params.items())])
    tracked = MlflowRun(client, run_id, uri)
    try:
        yield tracked
    except BaseException:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id, status="FINISHED")
