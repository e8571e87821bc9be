"""The model registry: which checkpoint serves each role, what trained it, and how to roll back.

    registry = ModelRegistry("http://127.0.0.1:5000")            # or sqlite:///data/mlflow/mlflow.db
    entry = registry.register("data/merged_adapter", DeploymentTarget("generator", "agent"),
                              checkpoint_id="merged-3f2a", lineage=collect_lineage(root, "merged_adapter"))
    registry.pick_for_role("generator").lineage.trace_partitions   # which traces trained it
    registry.rollback("generator")                                 # the alias goes back one step
    load_hf_model("models:/agent-model@generator", registry.tracking_uri)   # transformers / PEFT model

Backed by the MLflow Model Registry: one registered model (``model_name``), one model version per
checkpoint, one alias per role (the alias *is* the promotion). Each version is a real MLflow model
logged by a registration run (layout and loading: ``registry_artifacts``), through whatever
artifact store the server has: a local folder, or proxied ``mlflow-artifacts:/`` (``mlflow server
--serve-artifacts``). An adapter stores only the adapter and names its base, a version of
``<model_name>-base`` registered once per base content hash. The run also holds
``model_definition.json`` (the full :class:`ModelDefinition`: lineage outgrows MLflow's tag
limit), the eval metrics as metrics and the gate verdict as tags; searchable fields and the eval
results are copied into version tags.

Registration is idempotent on ``checkpoint_id`` and all-or-nothing: upload, materialise for
serving (``serve_dir``, the folder vLLM reads), deploy, then create the version, move the alias
and tag it ``registration=complete`` last. Any failure removes what this call created (versions,
runs *and their artifacts*, the served folder) and unloads a loaded adapter, and says so. The
alias history per role is a stack in the registered model's tag ``role_history.<role>``.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from training_assets import paths
from training_assets import registry_artifacts as store
from training_assets.deploy import Deployment, DeploymentError, DeploymentTarget, deploy, undo_deploy
from training_assets.lineage import Lineage
from training_assets.storage import fingerprint
from training_assets.tracking import local_artifact_location, mlflow_client
from training_assets.checkpoint_loading import CheckpointDirs, resolve_checkpoint
from training_assets.checkpoint_manifest import MANIFEST_FILE, CheckpointManifest

DEFAULT_MODEL_NAME = "agent-model"
BASE_SUFFIX = "-base"
REGISTRY_EXPERIMENT = "model_registry"
DEFINITION_ARTIFACT = "model_definition.json"
SERVE_DIR_ENV = "TRAINING_ASSETS_SERVE_DIR"
UI_URL_ENV = "TRAINING_ASSETS_MLFLOW_UI_URL"
_ROLE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_CHECKPOINT_ID = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")


@dataclass(frozen=True)
class ModelDefinition:
    name: str
    role: str
    served_model_name: str
    base_url: str | None
    checkpoint_id: str
    checkpoint_uri: str  # the materialised folder (manifest.json, absolute paths) vLLM and eval read
    adapter_uri: str | None
    base_model: str  # local folder of the base an adapter applies to (the model itself when full)
    source_uri: str  # the checkpoint asset it was registered from (replaced on re-training; provenance only)
    lineage: Lineage
    deployment: Mapping[str, Any] = field(default_factory=dict)  # Deployment.to_dict()
    run_id: str = ""  # the registration run: artifacts, eval metrics, gate tags
    artifact_uri: str = ""  # runs:/<run_id>/model
    base: Mapping[str, Any] = field(default_factory=dict)  # adapter: {model_uri, registered_model, version, content_hash, source}
    run_url: str | None = None  # the run in the MLflow UI (when the UI's address is known)
    version: int | None = None
    model_uri: str | None = None  # models:/<name>/<version>; not stored
    note: str = ""  # not stored: what this call did ("registered", "already registered ...")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelDefinition:
        lineage = dict(data["lineage"])
        lineage["trace_partitions"] = tuple(lineage.get("trace_partitions", ()))
        known = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in data.items() if k in known}, "lineage": Lineage(**lineage)})


class RegistryError(RuntimeError):
    """A registry operation could not be done (unknown role or version, nothing to roll back to)."""


def _uri(path: str | Path) -> str:
    return Path(path).resolve().as_uri()


def uri_path(uri: str) -> Path:
    """A local path from a ``file://`` URI (or a plain path)."""
    parsed = urllib.parse.urlparse(uri)
    return Path(urllib.request.url2pathname(parsed.path)) if parsed.scheme == "file" else Path(uri)


def default_serve_dir(tracking_uri: str) -> Path:
    """``$TRAINING_ASSETS_SERVE_DIR``; else beside a SQLite store; else ``<data root>/registry/served``."""
    if os.environ.get(SERVE_DIR_ENV):
        return Path(os.environ[SERVE_DIR_ENV])
    if tracking_uri.startswith("sqlite:///"):
        return Path(tracking_uri.removeprefix("sqlite:///")).parent / "served"
    return paths.data_root() / "registry" / "served"


def promotion_verdict(eval_report: Mapping[str, Any], manifest: CheckpointManifest) -> tuple[bool, str]:
    """May this checkpoint be registered? Only when its stored eval report is about this very
    checkpoint (same data version) and its gate passed."""
    evaluated, current = eval_report.get("checkpoint_data_version"), manifest.data_version
    if evaluated != current:
        return False, (f"the eval report is for {eval_report.get('checkpoint_asset')} {evaluated} but the checkpoint is "
                       f"now {current}: re-materialise the eval report")
    gate = eval_report.get("gate") or {}
    if not gate.get("passed"):
        return False, "the eval gate failed: " + "; ".join(gate.get("reasons", ["no gate decision in the report"]))
    return True, f"gate passed for {manifest.asset} {current}"


class ModelRegistry:
    """Role-bound registry over MLflow; see the module docstring."""

    def __init__(self, tracking_uri: str, model_name: str = DEFAULT_MODEL_NAME, artifact_location: str | None = None,
                 serve_dir: str | os.PathLike[str] | None = None):
        self.tracking_uri = tracking_uri
        self.model_name = model_name
        self.base_model_name = model_name + BASE_SUFFIX
        self.artifact_location = artifact_location or local_artifact_location(tracking_uri)
        self.serve_dir = Path(serve_dir) if serve_dir else default_serve_dir(tracking_uri)
        self._client = None

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = mlflow_client(self.tracking_uri)
        return self._client

    # ------------------------------------------------------------------ reading
    def _registered(self, name: str | None = None) -> Any | None:
        from mlflow.exceptions import MlflowException  # mlflow: seconds, only when the registry is read

        try:
            return self.client.get_registered_model(name or self.model_name)
        except MlflowException:
            return None

    def _versions(self, name: str | None = None, **tags: str) -> list[Any]:
        query = f"name='{name or self.model_name}'" + "".join(f" and tags.{k}='{v}'" for k, v in tags.items())
        return sorted(self.client.search_model_versions(query), key=lambda v: int(v.version))

    def _definition(self, version: Any) -> ModelDefinition:
        with tempfile.TemporaryDirectory() as tmp:
            path = self.client.download_artifacts(version.run_id, DEFINITION_ARTIFACT, tmp)
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        return replace(ModelDefinition.from_dict(data), version=int(version.version),
                       model_uri=f"models:/{self.model_name}/{version.version}")

    def find(self, checkpoint_id: str) -> ModelDefinition | None:
        """The completely registered version of ``checkpoint_id``, if any."""
        done = [v for v in self._versions(checkpoint_id=checkpoint_id) if v.tags.get("registration") == "complete"]
        return self._definition(done[0]) if done else None

    def get(self, version: int) -> ModelDefinition:
        from mlflow.exceptions import MlflowException  # mlflow: seconds, only when the registry is read

        try:
            return self._definition(self.client.get_model_version(self.model_name, str(version)))
        except MlflowException:
            raise RegistryError(f"{self.model_name} has no version {version}; see `training-assets registry list`") from None

    def serving(self, role: str) -> ModelDefinition | None:
        """The model currently serving ``role`` (the version its alias points at), or None when no
        version has been promoted to it yet (the first registration for a role)."""
        model = self._registered()
        if model is None or role not in model.aliases:
            return None
        return self.get(int(model.aliases[role]))

    def pick_for_role(self, role: str) -> ModelDefinition:
        """The model currently serving ``role``; a RegistryError naming the roles there are when none does."""
        current = self.serving(role)
        if current is None:
            model = self._registered()
            roles = sorted(model.aliases) if model else []
            raise RegistryError(f"no model registered for role {role!r} in {self.model_name} (roles: {roles})")
        return current

    def history(self, role: str) -> list[int]:
        """Versions promoted for ``role``, oldest first; the last one is live."""
        model = self._registered()
        return json.loads(model.tags.get(f"role_history.{role}", "[]")) if model else []

    def list(self) -> list[dict[str, Any]]:
        """Every completely registered version: version, checkpoint id, roles it serves, URIs."""
        model = self._registered()
        aliases = model.aliases if model else {}
        rows = []
        for v in self._versions():
            if v.tags.get("registration") != "complete":
                continue
            rows.append({"version": int(v.version), "checkpoint_id": v.tags.get("checkpoint_id"),
                         "roles": sorted(r for r, n in aliases.items() if int(n) == int(v.version)),
                         "role": v.tags.get("role"), "served_model_name": v.tags.get("served_model_name"),
                         "checkpoint_uri": v.tags.get("checkpoint_uri"), "trace_partitions": v.tags.get("trace_partitions"),
                         "base_model_uri": v.tags.get("base_model_uri"), "gate_passed": v.tags.get("gate.passed")})
        return rows

    def local_dir(self, definition: ModelDefinition) -> Path:
        """The version's materialised folder on this machine (downloaded again when it is gone)."""
        path = uri_path(definition.checkpoint_uri)
        if (path / MANIFEST_FILE).is_file():
            return path
        if not definition.run_id:
            raise RegistryError(f"version {definition.version}: {path} is gone and the version predates stored run ids; "
                                "register the checkpoint again")
        base_dir = None
        if definition.base:
            base_run = self.client.get_model_version(definition.base["registered_model"], str(definition.base["version"])).run_id
            base_dir = self._materialise(definition.base["registered_model"], base_run).checkpoint_dir
        return store.materialise(self.client, definition.run_id, self.serve_dir / self.model_name / definition.run_id, base_dir)

    # ------------------------------------------------------------------ writing
    def _experiment_id(self) -> str:
        experiment = self.client.get_experiment_by_name(REGISTRY_EXPERIMENT)
        if experiment is not None:
            return experiment.experiment_id
        return self.client.create_experiment(REGISTRY_EXPERIMENT, artifact_location=self.artifact_location)

    def _run_url(self, run_id: str) -> str | None:
        ui = os.environ.get(UI_URL_ENV) or (self.tracking_uri if self.tracking_uri.startswith(("http://", "https://")) else "")
        return f"{ui.rstrip('/')}/#/experiments/{self._experiment_id()}/runs/{run_id}" if ui else None

    def _ensure_model(self, name: str, description: str) -> None:
        if self._registered(name) is None:
            self.client.create_registered_model(name, description=description)

    def _set_alias(self, role: str, version: int, history: list[int]) -> None:
        self.client.set_registered_model_tag(self.model_name, f"role_history.{role}", json.dumps(history))
        self.client.set_registered_model_alias(self.model_name, role, str(version))

    def _log_model(self, run_id: str, checkpoint_dir: Path, tokenizer_dir: Path, manifest: CheckpointManifest,
                   base_ref: dict[str, Any] | None) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            folder = store.stage_version(Path(tmp), checkpoint_dir, tokenizer_dir, manifest, run_id, base_ref)
            self.client.log_artifacts(run_id, str(folder), store.MODEL_DIR)

    def _materialise(self, name: str, run_id: str, base_dir: Path | None = None) -> CheckpointDirs:
        return resolve_checkpoint(store.materialise(self.client, run_id, self.serve_dir / name / run_id, base_dir))

    def _ensure_base(self, dirs: CheckpointDirs, created: list[tuple[str, Any]]) -> tuple[dict[str, Any], Path]:
        """The registered version of the adapter's base (registered now when its content is new)."""
        digest = store.content_hash(dirs.base_model_dir)
        name = self.base_model_name
        found = [v for v in self._versions(name, content_hash=digest) if v.tags.get("registration") == "complete"]
        if found:
            version = found[0]
        else:
            self._ensure_model(name, "training_assets: the bases adapters apply to, one version per content hash")
            run_id = self.client.create_run(self._experiment_id(), run_name=f"base-{digest[7:19]}",
                                            tags={"content_hash": digest}).info.run_id
            created.append(("run", run_id))
            manifest = CheckpointManifest(asset="base_model", kind="full", checkpoint_dir=str(dirs.base_model_dir),
                                          base_model_dir=None, tokenizer_dir=str(store.base_tokenizer_dir(dirs)),
                                          data_version=digest[7:23])
            self._log_model(run_id, Path(dirs.base_model_dir), store.base_tokenizer_dir(dirs), manifest, None)
            version = self.client.create_model_version(name, f"runs:/{run_id}/{store.MODEL_DIR}", run_id=run_id,
                                                       tags={"content_hash": digest, "registration": "pending",
                                                             "source": str(dirs.base_model_dir)})
            created.append(("version", (name, version.version)))
            self.client.set_model_version_tag(name, version.version, "registration", "complete")
            self.client.set_terminated(run_id, "FINISHED")
        served = self._materialise(name, version.run_id)
        if not found:
            created.append(("served", self.serve_dir / name / version.run_id))
        store.link_version(self.serve_dir / name / version.run_id, int(version.version))
        ref = {"model_uri": f"models:/{name}/{version.version}", "registered_model": name, "version": int(version.version),
               "content_hash": digest, "source": str(dirs.base_model_dir)}
        return ref, served.checkpoint_dir

    def _eval_tags(self, run_id: str, eval_summary: Mapping[str, Any]) -> dict[str, str]:
        """Log the eval metrics to the run; return them and the gate verdict as tags (set on run and version)."""
        metrics = store.flat_numbers(eval_summary.get("metrics") or {})
        for key, value in sorted(metrics.items()):
            self.client.log_metric(run_id, key, value)
        tags = {f"metric.{k}": repr(v) for k, v in metrics.items()}
        gate = eval_summary.get("gate")
        if isinstance(gate, Mapping):
            tags["gate.passed"] = str(bool(gate.get("passed"))).lower()
            tags["gate.reasons"] = "; ".join(str(r) for r in gate.get("reasons", []))[:4000]
        for key, value in tags.items():
            self.client.set_tag(run_id, key, value)
        return tags

    def _create_version(self, run_id: str, definition: ModelDefinition, extra_tags: Mapping[str, str]) -> int:
        """Log the definition, create the version, move the alias, mark it complete (in that order)."""
        client = self.client
        self._ensure_model(self.model_name, "training_assets: one alias per role")
        for stale in self._versions(checkpoint_id=definition.checkpoint_id):  # a crash left a pending version
            client.delete_model_version(self.model_name, stale.version)
        stored = {k: v for k, v in definition.to_dict().items() if k not in ("version", "note", "model_uri")}
        client.log_text(run_id, json.dumps(stored, indent=2, sort_keys=True), DEFINITION_ARTIFACT)
        lineage = definition.lineage
        tags = {**extra_tags, "checkpoint_id": definition.checkpoint_id, "role": definition.role, "registration": "pending",
                "served_model_name": definition.served_model_name, "checkpoint_uri": definition.checkpoint_uri,
                "kind": "adapter" if definition.adapter_uri else "full",
                "corpus_version": str(lineage.corpus_version), "tokenizer_hash": str(lineage.tokenizer_hash),
                "trace_partitions": f"{len(lineage.trace_partitions)} batches, "
                                    f"fingerprint {fingerprint(sorted(lineage.trace_partitions))}"}
        if definition.base:
            tags |= {"base_model_uri": definition.base["model_uri"], "base_content_hash": definition.base["content_hash"]}
        version = client.create_model_version(self.model_name, definition.artifact_uri, run_id=run_id, tags=tags,
                                              description=f"{definition.role}: {definition.source_uri}")
        number, before = int(version.version), self.history(definition.role)
        try:
            self._set_alias(definition.role, number, before + [number])
            client.set_model_version_tag(self.model_name, version.version, "registration", "complete")
        except BaseException:
            client.delete_model_version(self.model_name, version.version)
            if before:  # give the role back to the model that served it
                self._set_alias(definition.role, before[-1], before)
            else:
                client.delete_registered_model_tag(self.model_name, f"role_history.{definition.role}")
            raise
        client.set_terminated(run_id, "FINISHED")
        return number

    def register(self, checkpoint_path: str | os.PathLike[str], target: DeploymentTarget, checkpoint_id: str,
                 lineage: Lineage | None = None) -> ModelDefinition:
        """Register ``checkpoint_path`` for ``target.role``, deploy it, and return its definition.

        Idempotent: a ``checkpoint_id`` already registered returns that version unchanged (its alias
        is not moved: after a rollback, re-running registration does not silently re-promote; use
        ``rollback(role, to_version=...)`` to promote an old version). Otherwise, in this order:
        register the adapter's base if it is new, log the model to a registration run, materialise
        it for serving, deploy (an unreachable server raises here), create the version and move the
        alias. A failure at any step removes what this call created and undoes a runtime adapter
        load: nothing is registered half-way.
        """
        if not _ROLE.match(target.role):
            raise ValueError(f"role {target.role!r}: use lowercase letters, digits, '-' or '_' (it becomes an MLflow alias)")
        if not _CHECKPOINT_ID.match(checkpoint_id):
            raise ValueError(f"checkpoint_id {checkpoint_id!r}: use letters, digits and . _ : - (it is searched as a tag)")
        existing = self.find(checkpoint_id)
        if existing is not None:
            return replace(existing, note=f"already registered: checkpoint {checkpoint_id} is version {existing.version}")
        dirs, manifest = store.source_dirs(checkpoint_path)  # fails early on a path that is not a checkpoint
        lineage = lineage or Lineage()
        created: list[tuple[str, Any]] = []
        deployment: Deployment | None = None
        try:
            base_ref, base_dir = self._ensure_base(dirs, created) if dirs.is_adapter else ({}, None)
            run_id = self.client.create_run(self._experiment_id(), run_name=f"register-{checkpoint_id}",
                                            tags={"checkpoint_id": checkpoint_id, "role": target.role}).info.run_id
            created.append(("run", run_id))
            eval_tags = self._eval_tags(run_id, lineage.eval_summary)
            self._log_model(run_id, dirs.checkpoint_dir, dirs.tokenizer_dir, manifest, base_ref or None)
            created.append(("served", self.serve_dir / self.model_name / run_id))
            served = self._materialise(self.model_name, run_id, base_dir)
            deployment = deploy(target, served.checkpoint_dir, served.base_model_dir)
            definition = ModelDefinition(
                name=self.model_name, role=target.role, served_model_name=target.served_model_name,
                base_url=target.base_url, checkpoint_id=checkpoint_id,
                checkpoint_uri=_uri(self.serve_dir / self.model_name / run_id),
                adapter_uri=_uri(served.checkpoint_dir) if served.is_adapter else None,
                base_model=str(served.base_model_dir or served.checkpoint_dir), source_uri=_uri(checkpoint_path),
                lineage=lineage, deployment=deployment.to_dict(), run_id=run_id,
                artifact_uri=f"runs:/{run_id}/{store.MODEL_DIR}", base=base_ref, run_url=self._run_url(run_id))
            version = self._create_version(run_id, definition, eval_tags)
        except BaseException as exc:
            cleaned = store.remove_created(self.client, self.tracking_uri, created)
            try:
                undone = undo_deploy(deployment) if deployment is not None else "nothing deployed"
            except DeploymentError as undo_exc:
                undone = f"COULD NOT UNDO: {undo_exc}"
            if isinstance(exc, DeploymentError):
                raise DeploymentError(f"{exc}; nothing registered ({cleaned})") from exc
            raise RegistryError(f"registering {checkpoint_id} failed ({exc}); nothing registered ({cleaned}); "
                                f"deployment: {undone}") from exc
        store.link_version(self.serve_dir / self.model_name / run_id, version)
        return replace(definition, version=version, model_uri=f"models:/{self.model_name}/{version}",
                       note=f"registered {checkpoint_id} as version {version} for {target.role}")

    def rollback(self, role: str, to_version: int | None = None, target: DeploymentTarget | None = None) -> tuple[ModelDefinition, str]:
        """Move ``role``'s alias back: to the previously promoted version, or to ``to_version``.

        With a ``target`` whose ``base_url`` is set, the rolled-back adapter is loaded into the
        server first (so the alias never points at a model the server does not have). Returns the
        definition now live and the reason.
        """
        history = self.history(role)
        current = self.pick_for_role(role)  # raises when nothing is registered for the role
        if to_version is None:
            if len(history) < 2:
                raise RegistryError(f"role {role!r} has only version {current.version} in its history: nothing to roll back to")
            new_history, to_version = history[:-1], history[-2]
        else:
            new_history = history + [to_version]
        chosen = self.get(to_version)
        if target is not None:
            dirs = resolve_checkpoint(self.local_dir(chosen))
            deploy(target, dirs.checkpoint_dir, dirs.base_model_dir)
        self._set_alias(role, to_version, new_history)
        return chosen, f"role {role!r}: version {current.version} -> {to_version}"


def register_checkpoint(registry: ModelRegistry, checkpoint_path: str | os.PathLike[str], target: DeploymentTarget,
                        checkpoint_id: str, lineage: Lineage | None = None) -> ModelDefinition:
    """The seed's name for ``registry.register(checkpoint_path, target, checkpoint_id, lineage)``."""
    return registry.register(checkpoint_path, target, checkpoint_id, lineage)
