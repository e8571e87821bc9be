"""Keep a vLLM server sampling the current GRPO policy: the LoRA adapter, versioned, loaded at runtime.

    sync = VllmPolicySync.from_config(config)      # config.grpo.rollout == "vllm" (config.grpo.vllm), config.lora set
    sync.preflight()                               # key accepted, base model served: fail before training
    sync.after_step(step, total_steps, model, resumed)   # run_loop's on_policy_update
    client.complete(sync.served_name, ...)         # rollouts ask for the newest loaded version

Every ``VllmSpec.sync_steps`` optimizer steps the adapter is saved (safetensors, atomically:
``checkpoints.save_model_dir``) to ``<adapter_dir>/<run>-v<step>/`` and loaded with
``POST /v1/load_lora_adapter``; only once the new version is in is the previous one unloaded
(``/v1/unload_lora_adapter``) and its folder removed, so a rollout never names an adapter that
is not loaded. Until the first sync, rollouts ask for the base model (``VllmSpec.model``): a fresh
LoRA's B matrices are zero, so the policy is the base. After a resume the restored adapter is
synced at once. The last step is not synced (no rollout follows it); the last synced version
stays loaded after training.

Only LoRA runs: vLLM loads adapters over HTTP but cannot hot-swap full weights (``TrainConfig``
refuses rollout="vllm" without ``lora``). Several processes: every rank takes part in the save
(gathering FSDP shards is a collective), rank 0 talks to the server, and a barrier keeps the
other ranks from asking for the new name before it is loaded.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any

from training_assets.trainers import checkpoints, dist_state
from training_assets.trainers.config import TrainConfig, VllmSpec
from training_assets.vllm_client import RetryPolicy, VllmClient, VllmError

log = logging.getLogger("training_assets.trainers")


def run_label(config: TrainConfig) -> str:
    """The run's adapter name prefix: ``run_name``, else the output dir's name, in a URL/path-safe form."""
    raw = config.run_name or Path(config.output_dir).resolve().name or "policy"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", raw).strip("-.") or "policy"


def client_for(spec: VllmSpec, seed: int = 0) -> VllmClient:
    """The HTTP client ``spec`` describes (``seed``: the retry jitter's, so a run retries reproducibly)."""
    retry = RetryPolicy(max_attempts=spec.max_attempts, backoff_s=spec.backoff_s, max_backoff_s=spec.max_backoff_s)
    return VllmClient(spec.base_url or "", api_key_env=spec.api_key_env, retry=retry, timeout_s=spec.timeout_s,
                      seed=seed)


class VllmPolicySync:
    """The versioned adapter the server holds for this run, and the name rollouts must ask for."""

    def __init__(self, client: VllmClient, base_model: str, run: str, adapter_dir: Path, sync_steps: int = 1,
                 accelerator: Any = None) -> None:
        self.client, self.base_model, self.run, self.adapter_dir = client, base_model, run, adapter_dir
        self.sync_steps, self.accelerator = sync_steps, accelerator
        self.loaded: str | None = None  # adapter name the server holds for us (None: the base model only)
        self.history: list[str] = []  # every version loaded, in order

    @classmethod
    def from_config(cls, config: TrainConfig, accelerator: Any = None) -> VllmPolicySync:
        spec = config.grpo.vllm
        if spec is None:
            raise ValueError("VllmPolicySync: config.grpo.vllm is None; set "
                             "grpo=GrpoSpec(rollout='vllm', vllm=VllmSpec(...))")
        root = Path(spec.adapter_dir or Path(config.output_dir) / "vllm_adapters").resolve()
        return cls(client_for(spec, config.seed), str(spec.model), run_label(config), root, spec.sync_steps,
                   accelerator)

    @property
    def served_name(self) -> str:
        return self.loaded or self.base_model

    def preflight(self) -> None:
        """The key is accepted and the base model is served (one ``GET /v1/models``)."""
        models = self.client.served_models()
        if self.base_model not in models:
            raise VllmError(f"vLLM {self.client.base_url} does not serve grpo.vllm.model={self.base_model!r} "
                            f"(it serves {sorted(models)}); set vllm.model to its --served-model-name")

    def after_step(self, step: int, total_steps: int, model: Any, resumed: bool = False) -> None:
        """``run_loop``'s policy hook: sync every ``sync_steps`` steps, and at once after a resume."""
        if 0 < step < total_steps and (resumed or step % self.sync_steps == 0):
            self.sync(model, step)

    def sync(self, model: Any, step: int) -> str:
        """Save the adapter as ``<run>-v<step>``, load it, then unload the previous version; returns the new name."""
        name = f"{self.run}-v{step}"
        folder = self.adapter_dir / name
        checkpoints.save_model_dir(model, folder, self.accelerator)  # every rank; rank 0 writes
        if dist_state.rank_and_world()[0] == 0:
            try:
                self.client.load_adapter(name, str(folder))
            except Exception:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            if self.loaded is not None and self.loaded != name:
                self.client.unload_adapter(self.loaded)
                shutil.rmtree(self.adapter_dir / self.loaded, ignore_errors=True)
            log.info("vLLM %s now serves %s (from %s)", self.client.base_url, name, folder)
        dist_state.barrier()  # no rank asks for the new name before rank 0 has loaded it
        self.loaded = name
        self.history.append(name)
        return name
