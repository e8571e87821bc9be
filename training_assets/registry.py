"""The model registry: which checkpoint serves each role, what trained it, and how to roll back.

    registry = ModelRegistry("sqlite:///data/mlflow/mlflow.db")
    entry = registry.register("data/merged_adapter", DeploymentTarget("generator", "agent"),
                              checkpoint_id="merged-3f2a", lineage=collect_lineage(root, "merged_adapter"))
    register_checkpoint(registry, "data/merged_adapter", target, "merged-3f2a")   # the seed's name for the same
    registry.pick_for_role("generator").lineage.trace_partitions   # which traces trained it
    registry.rollback("generator")                                 # the alias goes back one step

Backed by the MLflow Model Registry: one registered model (``model_name``), one model version per
checkpoint, one alias per role (the alias *is* the promotion). Each version is created by a small
registration run whose artifact ``model_definition.json`` holds the full :class:`ModelDefinition`
(lineage lists can outgrow MLflow's 5,000-character tag limit); searchable fields are copied into
version tags. Registration is idempotent on ``checkpoint_id`` (tag ``checkpoint_id``) and
all-or-nothing: the deployment happens first, the version is tagged ``registration=complete`` and
the alias moved last, and any failure removes what was created (and unloads a loaded adapter).
The alias history per role is a stack in the registered model's tag ``role_history.<role>``;
rollback pops it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from training_assets.deploy import Deployment, DeploymentError, DeploymentTarget, deploy, undo_deploy
from training_assets.lineage import Lineage
from training_assets.storage import canonical_json, fingerprint
from training_assets.tracking import local_artifact_location
from training_assets.trainers.loading import resolve_checkpoint
from training_assets.trainers.manifest import (MANIFEST_FILE, CheckpointManifest, folder_manifest, read_manifest_file,
                                               snapshot_manifest, write_manifest)

DEFAULT_MODEL_NAME = "agent-model"
REGISTRY_EXPERIMENT = "model_registry"
DEFINITION_ARTIFACT = "model_definition.json"
SNAPSHOT_DIR = "model"
_ROLE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_CHECKPOINT_ID = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")


@dataclass(frozen=True)
class ModelDefinition:
    name: str
    role: str
    served_model_name: str
    base_url: str | None
    checkpoint_id: str
    checkpoint_uri: str  # immutable snapshot in the registration run's artifacts (manifest.json inside)
    adapter_uri: str | None
    base_model: str  # the base an adapter applies to (the model itself when full), inside the snapshot
    source_uri: str  # the checkpoint asset it was registered from (replaced on re-training; provenance only)
    lineage: Lineage
    deployment: Mapping[str, Any] = field(default_factory=dict)  # Deployment.to_dict()
    version: int | None = None
    note: str = ""  # not stored: what this call did ("registered", "already registered ...")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelDefinition:
        lineage = dict(data["lineage"])
        lineage["trace_partitions"] = tuple(lineage.get("trace_partitions", ()))
        return cls(**{**data, "lineage": Lineage(**lineage)})


class RegistryError(RuntimeError):
    """A registry operation could not be done (unknown role or version, nothing to roll back to)."""


def _uri(path: str | Path) -> str:
    return Path(path).resolve().as_uri()


def uri_path(uri: str) -> Path:
    """A local path from a ``file://`` URI (or a plain path)."""
    parsed = urllib.parse.urlparse(uri)
    return Path(urllib.request.url2pathname(parsed.path)) if parsed.scheme == "file" else Path(uri)


def _local_artifact_path(artifact_uri: str) -> Path:
    parsed = urllib.parse.urlparse(artifact_uri)
    if parsed.scheme not in ("", "file"):
        raise RegistryError(f"artifact store {artifact_uri} is not local: vLLM and rollback need the snapshot on a "
                            "local or mounted path; point MLflow's artifact root at shared storage")
    return uri_path(artifact_uri)


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

    def __init__(self, tracking_uri: str, model_name: str = DEFAULT_MODEL_NAME, artifact_location: str | None = None):
        self.tracking_uri = tracking_uri
        self.model_name = model_name
        self.artifact_location = artifact_location or local_artifact_location(tracking_uri)
        self._client = None

    @property
    def client(self) -> Any:
        if self._client is None:
            from mlflow import MlflowClient

            if self.tracking_uri.startswith("sqlite:///"):
                Path(self.tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            self._client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)
        return self._client

    # ------------------------------------------------------------------ reading
    def _registered(self) -> Any | None:
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_registered_model(self.model_name)
        except MlflowException:
            return None

    def _versions(self, checkpoint_id: str | None = None) -> list[Any]:
        query = f"name='{self.model_name}'"
        if checkpoint_id is not None:
            query += f" and tags.checkpoint_id='{checkpoint_id}'"
        return sorted(self.client.search_model_versions(query), key=lambda v: int(v.version))

    def _definition(self, version: Any) -> ModelDefinition:
        with tempfile.TemporaryDirectory() as tmp:
            path = self.client.download_artifacts(version.run_id, DEFINITION_ARTIFACT, tmp)
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        return replace(ModelDefinition.from_dict(data), version=int(version.version))

    def find(self, checkpoint_id: str) -> ModelDefinition | None:
        """The completely registered version of ``checkpoint_id``, if any."""
        done = [v for v in self._versions(checkpoint_id) if v.tags.get("registration") == "complete"]
        return self._definition(done[0]) if done else None

    def get(self, version: int) -> ModelDefinition:
        from mlflow.exceptions import MlflowException

        try:
            return self._definition(self.client.get_model_version(self.model_name, str(version)))
        except MlflowException:
            raise RegistryError(f"{self.model_name} has no version {version}; see `training-assets registry list`") from None

    def pick_for_role(self, role: str) -> ModelDefinition:
        """The model currently serving ``role`` (the version its alias points at)."""
        model = self._registered()
        if model is None or role not in model.aliases:
            roles = sorted(model.aliases) if model else []
            raise RegistryError(f"no model registered for role {role!r} in {self.model_name} (roles: {roles})")
        return self.get(int(model.aliases[role]))

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
                         "checkpoint_uri": v.tags.get("checkpoint_uri"), "trace_partitions": v.tags.get("trace_partitions")})
        return rows

    # ------------------------------------------------------------------ writing
    def _experiment_id(self) -> str:
        experiment = self.client.get_experiment_by_name(REGISTRY_EXPERIMENT)
        if experiment is not None:
            return experiment.experiment_id
        return self.client.create_experiment(REGISTRY_EXPERIMENT, artifact_location=self.artifact_location)

    def _set_alias(self, role: str, version: int, history: list[int]) -> None:
        self.client.set_registered_model_tag(self.model_name, f"role_history.{role}", json.dumps(history))
        self.client.set_registered_model_alias(self.model_name, role, str(version))

    def _snapshot(self, run_id: str, source: str | os.PathLike[str]) -> Path:
        """Copy the checkpoint (weights, tokenizer, base for an adapter) into the run's artifacts.

        The checkpoint assets are replaced whole on every re-materialisation, so a registered
        version must not point at them: rollback would serve whatever was trained last. The
        snapshot's manifest keeps the source's provenance with paths relative to the snapshot.
        """
        dirs = resolve_checkpoint(source)
        if (Path(source) / MANIFEST_FILE).is_file():
            manifest = read_manifest_file(source)
        else:
            manifest = folder_manifest(dirs.checkpoint_dir, dirs.tokenizer_dir, dirs.base_model_dir, Path(source).name)
        with tempfile.TemporaryDirectory() as tmp:
            staged = Path(tmp) / SNAPSHOT_DIR
            shutil.copytree(dirs.checkpoint_dir, staged / "checkpoint")
            shutil.copytree(dirs.tokenizer_dir, staged / "tokenizer")
            if dirs.base_model_dir is not None:
                shutil.copytree(dirs.base_model_dir, staged / "base_model")
            write_manifest(staged, snapshot_manifest(manifest))
            self.client.log_artifacts(run_id, str(staged), SNAPSHOT_DIR)
        return _local_artifact_path(self.client.get_run(run_id).info.artifact_uri) / SNAPSHOT_DIR

    def _create_version(self, run_id: str, definition: ModelDefinition) -> int:
        """Log the definition, create the version, move the alias, mark it complete (in that order)."""
        client = self.client
        if self._registered() is None:
            client.create_registered_model(self.model_name, description="training_assets: one alias per role")
        for stale in self._versions(definition.checkpoint_id):  # a crash left a pending version: replace it
            client.delete_model_version(self.model_name, stale.version)
        stored = {k: v for k, v in definition.to_dict().items() if k not in ("version", "note")}
        client.log_text(run_id, json.dumps(stored, indent=2, sort_keys=True), DEFINITION_ARTIFACT)
        lineage = definition.lineage
        tags = {"checkpoint_id": definition.checkpoint_id, "role": definition.role, "registration": "pending",
                "served_model_name": definition.served_model_name, "checkpoint_uri": definition.checkpoint_uri,
                "corpus_version": str(lineage.corpus_version), "tokenizer_hash": str(lineage.tokenizer_hash),
                "trace_partitions": f"{len(lineage.trace_partitions)} batches, "
                                    f"fingerprint {fingerprint(sorted(lineage.trace_partitions))}"}
        version = client.create_model_version(self.model_name, f"runs:/{run_id}/{SNAPSHOT_DIR}", run_id=run_id,
                                              tags=tags, description=f"{definition.role}: {definition.source_uri}")
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
        snapshot the checkpoint into a registration run, deploy from the snapshot (an unreachable
        server raises here), create the version and move the alias. A failure at any step removes
        the run and version it created and undoes a runtime adapter load: nothing is registered
        half-way.
        """
        if not _ROLE.match(target.role):
            raise ValueError(f"role {target.role!r}: use lowercase letters, digits, '-' or '_' (it becomes an MLflow alias)")
        if not _CHECKPOINT_ID.match(checkpoint_id):
            raise ValueError(f"checkpoint_id {checkpoint_id!r}: use letters, digits and . _ : - (it is searched as a tag)")
        existing = self.find(checkpoint_id)
        if existing is not None:
            return replace(existing, note=f"already registered: checkpoint {checkpoint_id} is version {existing.version}")
        resolve_checkpoint(checkpoint_path)  # fails early on a path that is not a checkpoint
        run = self.client.create_run(self._experiment_id(), run_name=f"register-{checkpoint_id}",
                                     tags={"checkpoint_id": checkpoint_id, "role": target.role})
        run_id = run.info.run_id
        deployment: Deployment | None = None
        try:
            snapshot = self._snapshot(run_id, checkpoint_path)
            dirs = resolve_checkpoint(snapshot)
            deployment = deploy(target, dirs.checkpoint_dir, dirs.base_model_dir)
            definition = ModelDefinition(
                name=self.model_name, role=target.role, served_model_name=target.served_model_name,
                base_url=target.base_url, checkpoint_id=checkpoint_id, checkpoint_uri=_uri(snapshot),
                adapter_uri=_uri(dirs.checkpoint_dir) if dirs.is_adapter else None,
                base_model=str(dirs.base_model_dir or dirs.checkpoint_dir), source_uri=_uri(checkpoint_path),
                lineage=lineage or Lineage(), deployment=deployment.to_dict())
            version = self._create_version(run_id, definition)
        except BaseException as exc:
            self.client.delete_run(run_id)
            undone = undo_deploy(deployment) if deployment is not None else "nothing deployed"
            if isinstance(exc, DeploymentError):
                raise DeploymentError(f"{exc}; nothing registered") from exc
            raise RegistryError(f"registering {checkpoint_id} failed ({exc}); nothing registered; deployment: {undone}") from exc
        return replace(definition, version=version, note=f"registered {checkpoint_id} as version {version} for {target.role}")

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
            dirs = resolve_checkpoint(uri_path(chosen.checkpoint_uri))
            deploy(target, dirs.checkpoint_dir, dirs.base_model_dir)
        self._set_alias(role, to_version, new_history)
        return chosen, f"role {role!r}: version {current.version} -> {to_version}"


def register_checkpoint(registry: ModelRegistry, checkpoint_path: str | os.PathLike[str], target: DeploymentTarget,
                        checkpoint_id: str, lineage: Lineage | None = None) -> ModelDefinition:
    """The seed's name for ``registry.register(checkpoint_path, target, checkpoint_id, lineage)``."""
    return registry.register(checkpoint_path, target, checkpoint_id, lineage)


def definition_json(definition: ModelDefinition) -> str:
    """Canonical JSON of a definition (for files and CLI output)."""
    return canonical_json(definition.to_dict())
