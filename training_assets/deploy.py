"""The deploy seam to vLLM: load a LoRA adapter into a running server, or record how to serve it.

    target = DeploymentTarget(role="generator", served_model_name="agent-generator",
                              base_url="http://127.0.0.1:8000/v1")   # stored as http://127.0.0.1:8000
    deployment = deploy(target, checkpoint_dir, base_model_dir)   # base_model_dir None for a full model

With a ``base_url`` and an adapter, the adapter is loaded at runtime through vLLM's
``POST /v1/load_lora_adapter`` (the server must run with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``
and ``--enable-lora``) and confirmed through ``GET /v1/models``. Without a server, or for a full
model (vLLM cannot swap base weights at runtime), the exact ``vllm serve`` command is recorded
instead. An unreachable or refusing server raises :class:`DeploymentError`; nothing is changed.
Only the standard library is used: no HTTP client dependency.
"""

from __future__ import annotations

import json
import os
import shlex
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HTTP_TIMEOUT_S = 10.0


class DeploymentError(RuntimeError):
    """The serving endpoint could not be reached or refused the adapter."""


@dataclass(frozen=True)
class DeploymentTarget:
    """Where a role's model is served: the name clients ask for, and the vLLM server (optional)."""

    role: str
    served_model_name: str
    base_url: str | None = None  # the server's root; a trailing /v1 (OpenAI-client style) is dropped; None: command only
    max_lora_rank: int = 64  # vLLM's --max-lora-rank must be >= the adapter's r

    def __post_init__(self) -> None:
        # The seed writes base_url="http://localhost:8000/v1" (what an OpenAI client takes); the
        # endpoints below add /v1 themselves, so keep the server root only.
        if self.base_url is not None:
            object.__setattr__(self, "base_url", self.base_url.rstrip("/").removesuffix("/v1"))


@dataclass(frozen=True)
class Deployment:
    """What the seam did: ``loaded`` (runtime LoRA load verified), ``already_loaded`` or ``command_recorded``."""

    status: str
    served_model_name: str
    base_url: str | None
    serve_command: str
    served_models: tuple[str, ...] = ()
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _lora_rank(adapter_dir: Path) -> int | None:
    config = adapter_dir / "adapter_config.json"
    if not config.is_file():
        return None
    return json.loads(config.read_text(encoding="utf-8")).get("r")


def serve_command(target: DeploymentTarget, checkpoint_dir: str | Path, base_model_dir: str | Path | None) -> str:
    """The ``vllm serve`` command that serves this checkpoint under ``target.served_model_name``.

    >>> serve_command(DeploymentTarget("generator", "agent"), "/ckpt/adapter", "/ckpt/base")
    'vllm serve /ckpt/base --served-model-name agent-base --enable-lora --lora-modules agent=/ckpt/adapter --max-lora-rank 64'
    """
    if base_model_dir is None:
        args = ["vllm", "serve", str(checkpoint_dir), "--served-model-name", target.served_model_name]
    else:
        rank = max(target.max_lora_rank, _lora_rank(Path(checkpoint_dir)) or 0)
        args = ["vllm", "serve", str(base_model_dir), "--served-model-name", f"{target.served_model_name}-base",
                "--enable-lora", "--lora-modules", f"{target.served_model_name}={checkpoint_dir}",
                "--max-lora-rank", str(rank)]
    return shlex.join(args)


def _request(base_url: str, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, str]:
    url = base_url.rstrip("/") + path
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if os.environ.get("VLLM_API_KEY"):  # a server started with --api-key (as in docker-compose) wants it
        headers["Authorization"] = f"Bearer {os.environ['VLLM_API_KEY']}"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:  # noqa: S310 - http(s) URL from config
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DeploymentError(f"vLLM server {base_url} unreachable ({method} {path}: {reason}); start it with "
                              "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora, or deploy without "
                              "base_url to record the serve command only") from None


def served_models(base_url: str) -> dict[str, dict[str, Any]]:
    """``GET /v1/models``: id -> model card (LoRA cards carry ``root`` = adapter path, ``parent`` = base)."""
    status, text = _request(base_url, "GET", "/v1/models")
    if status != 200:
        raise DeploymentError(f"GET {base_url}/v1/models answered {status}: {text[:200]}")
    try:
        return {card["id"]: card for card in json.loads(text)["data"]}
    except (json.JSONDecodeError, KeyError, TypeError):
        raise DeploymentError(f"GET {base_url}/v1/models did not return an OpenAI model list: {text[:200]}") from None


def load_adapter(base_url: str, name: str, adapter_dir: str | Path) -> None:
    status, text = _request(base_url, "POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(adapter_dir)})
    if status != 200:
        raise DeploymentError(f"vLLM refused to load adapter {name!r} from {adapter_dir} ({status}): {text[:300]}")


def unload_adapter(base_url: str, name: str) -> None:
    status, text = _request(base_url, "POST", "/v1/unload_lora_adapter", {"lora_name": name})
    if status != 200:
        raise DeploymentError(f"vLLM refused to unload adapter {name!r} ({status}): {text[:300]}")


def deploy(target: DeploymentTarget, checkpoint_dir: str | Path, base_model_dir: str | Path | None) -> Deployment:
    """Put the checkpoint behind ``target``; see the module docstring for what happens when."""
    command = serve_command(target, checkpoint_dir, base_model_dir)
    if target.base_url is None:
        return Deployment("command_recorded", target.served_model_name, None, command,
                          detail="no base_url: serve with the recorded command")
    models = served_models(target.base_url)  # reachability first: fail before any change
    if base_model_dir is None:
        return Deployment("command_recorded", target.served_model_name, target.base_url, command, tuple(models),
                          detail="a full model cannot be swapped into a running vLLM; restart it with the command")
    current = models.get(target.served_model_name)
    if current is not None and current.get("root") == str(checkpoint_dir):
        return Deployment("already_loaded", target.served_model_name, target.base_url, command, tuple(models),
                          detail="the server already serves this adapter under that name")
    replaced = None
    if current is not None:  # same name, other adapter: vLLM refuses a duplicate name, so swap it
        unload_adapter(target.base_url, target.served_model_name)
        replaced = current.get("root")
    load_adapter(target.base_url, target.served_model_name, checkpoint_dir)
    models = served_models(target.base_url)
    if target.served_model_name not in models:
        raise DeploymentError(f"{target.base_url} accepted adapter {target.served_model_name!r} but GET /v1/models "
                              f"does not list it (lists {sorted(models)})")
    return Deployment("loaded", target.served_model_name, target.base_url, command, tuple(models),
                      detail="runtime LoRA load verified through GET /v1/models",
                      extra={"replaced_adapter": replaced} if replaced else {})


def undo_deploy(deployment: Deployment) -> str:
    """Reverse a ``loaded`` deployment (used when registration fails after it); returns what was done."""
    if deployment.status != "loaded" or deployment.base_url is None:
        return "nothing to undo"
    unload_adapter(deployment.base_url, deployment.served_model_name)
    replaced = deployment.extra.get("replaced_adapter")
    if replaced:
        load_adapter(deployment.base_url, deployment.served_model_name, replaced)
        return f"restored adapter {replaced}"
    return f"unloaded {deployment.served_model_name}"
