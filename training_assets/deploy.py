"""The deploy seam to vLLM: load a LoRA adapter into a running server, or record how to serve it.

    target = DeploymentTarget(role="generator", served_model_name="agent-generator",
                              base_url="http://127.0.0.1:8000/v1")   # stored as http://127.0.0.1:8000
    deployment = deploy(target, checkpoint_dir, base_model_dir)   # base_model_dir None for a full model

With a ``base_url`` and an adapter, the adapter is loaded at runtime through vLLM's
``POST /v1/load_lora_adapter`` (the server must run with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``
and ``--enable-lora``) and confirmed through ``GET /v1/models``. Without a server, or for a full
model (vLLM cannot swap base weights at runtime), the exact ``vllm serve`` command is recorded
instead. An unreachable or refusing server raises :class:`DeploymentError`; nothing is changed.
Requests go through ``http_client`` (standard library only): the connection goes to exactly the
host and port the allow-list check parsed, and a 3xx answer is an error, never followed (the
redirect would carry the key to a server nobody checked).

Allow-list: no request (and so no ``VLLM_API_KEY``) ever goes to a server that is not allowed.
The allowed servers are ``target.allowed_urls`` when given (the Dagster deployment resource
passes its instance configuration), else ``$TRAINING_ASSETS_DEPLOY_ALLOWED_URLS`` (comma-separated
URLs; compared by scheme, host and port), else loopback only (``localhost``, ``127.0.0.1``,
``::1``): a URL taken from somewhere else (a run config) cannot receive the key.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from training_assets import http_client

HTTP_TIMEOUT_S = 10.0
ALLOWED_URLS_ENV = "TRAINING_ASSETS_DEPLOY_ALLOWED_URLS"
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


class DeploymentError(RuntimeError):
    """The serving endpoint could not be reached or refused the adapter."""


@dataclass(frozen=True)
class DeploymentTarget:
    """Where a role's model is served: the name clients ask for, and the vLLM server (optional)."""

    role: str
    served_model_name: str
    base_url: str | None = None  # the server's root; a trailing /v1 (OpenAI-client style) is dropped; None: command only
    max_lora_rank: int = 64  # vLLM's --max-lora-rank must be >= the adapter's r
    allowed_urls: tuple[str, ...] | None = None  # servers that may be called; None: the environment's (module doc)

    def __post_init__(self) -> None:
        # The seed writes base_url="http://localhost:8000/v1" (what an OpenAI client takes); the
        # endpoints below add /v1 themselves, so keep the server root only.
        if self.base_url is not None:
            object.__setattr__(self, "base_url", self.base_url.rstrip("/").removesuffix("/v1"))
        if self.allowed_urls is not None:
            object.__setattr__(self, "allowed_urls", tuple(self.allowed_urls))


def origin(url: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of an http(s) URL (``http_client.parse_url``); a clear error for anything else."""
    return _parse(url).origin


def _parse(url: str) -> http_client.Endpoint:
    try:
        return http_client.parse_url(url)
    except http_client.BadURL as exc:
        raise DeploymentError(f"deploy {exc}") from None


def env_allowed_urls() -> tuple[str, ...] | None:
    """``$TRAINING_ASSETS_DEPLOY_ALLOWED_URLS`` split on commas; None when unset or empty."""
    urls = tuple(u.strip() for u in os.environ.get(ALLOWED_URLS_ENV, "").split(",") if u.strip())
    return urls or None


def require_allowed(url: str, allowed_urls: Iterable[str] | None = None) -> http_client.Endpoint:
    """Refuse ``url`` unless it is on an allowed server (module docstring); the parse that was checked.

    Callers connect to the returned endpoint, not to the URL string: what was checked is what is
    called (``http_client`` explains the URLs that parse two ways).
    """
    allowed = tuple(allowed_urls) if allowed_urls is not None else env_allowed_urls()
    endpoint = _parse(url)
    if allowed is None:
        if endpoint.host in LOOPBACK_HOSTS:
            return endpoint
        raise DeploymentError(f"deploy URL {url} is not allowed: without {ALLOWED_URLS_ENV} only loopback servers "
                              f"are; the operator adds it to {ALLOWED_URLS_ENV} (comma-separated) to allow it")
    if endpoint.origin not in {origin(u) for u in allowed}:
        raise DeploymentError(f"deploy URL {url} is not in the allow-list {sorted(allowed)} ({ALLOWED_URLS_ENV} or "
                              "the deployment resource): the API key is only sent to those servers; ask the operator "
                              "to add it, or leave base_url empty to use the configured server")
    return endpoint


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


def _request(base_url: str, method: str, path: str, body: dict[str, Any] | None = None,
             allowed_urls: Iterable[str] | None = None) -> tuple[int, str]:
    endpoint = require_allowed(base_url.rstrip("/") + path, allowed_urls)  # before the key is put into any header
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if os.environ.get("VLLM_API_KEY"):  # a server started with --api-key (as in docker-compose) wants it
        headers["Authorization"] = f"Bearer {os.environ['VLLM_API_KEY']}"
    try:
        status, answer = http_client.send(endpoint, method, data, headers, HTTP_TIMEOUT_S)
    except http_client.Redirected as exc:
        raise DeploymentError(f"vLLM server {base_url}: {exc}") from None
    except http_client.Unreachable as exc:
        raise DeploymentError(f"vLLM server {base_url} unreachable ({method} {path}: {exc.reason}); start it with "
                              "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora, or deploy without "
                              "base_url to record the serve command only") from None
    return status, answer.decode("utf-8", "replace")


def served_models(base_url: str, allowed_urls: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """``GET /v1/models``: id -> model card (LoRA cards carry ``root`` = adapter path, ``parent`` = base)."""
    status, text = _request(base_url, "GET", "/v1/models", allowed_urls=allowed_urls)
    if status != 200:
        raise DeploymentError(f"GET {base_url}/v1/models answered {status}: {text[:200]}")
    try:
        return {card["id"]: card for card in json.loads(text)["data"]}
    except (json.JSONDecodeError, KeyError, TypeError):
        raise DeploymentError(f"GET {base_url}/v1/models did not return an OpenAI model list: {text[:200]}") from None


def load_adapter(base_url: str, name: str, adapter_dir: str | Path, allowed_urls: Iterable[str] | None = None) -> None:
    status, text = _request(base_url, "POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(adapter_dir)},
                            allowed_urls)
    if status != 200:
        raise DeploymentError(f"vLLM refused to load adapter {name!r} from {adapter_dir} ({status}): {text[:300]}")


def unload_adapter(base_url: str, name: str, allowed_urls: Iterable[str] | None = None) -> None:
    status, text = _request(base_url, "POST", "/v1/unload_lora_adapter", {"lora_name": name}, allowed_urls)
    if status != 200:
        raise DeploymentError(f"vLLM refused to unload adapter {name!r} ({status}): {text[:300]}")


def deploy(target: DeploymentTarget, checkpoint_dir: str | Path, base_model_dir: str | Path | None) -> Deployment:
    """Put the checkpoint behind ``target``; see the module docstring for what happens when."""
    command = serve_command(target, checkpoint_dir, base_model_dir)
    if target.base_url is None:
        return Deployment("command_recorded", target.served_model_name, None, command,
                          detail="no base_url: serve with the recorded command")
    allowed = target.allowed_urls
    models = served_models(target.base_url, allowed)  # allowed and reachable first: fail before any change
    if base_model_dir is None:
        return Deployment("command_recorded", target.served_model_name, target.base_url, command, tuple(models),
                          detail="a full model cannot be swapped into a running vLLM; restart it with the command")
    current = models.get(target.served_model_name)
    if current is not None and current.get("root") == str(checkpoint_dir):
        return Deployment("already_loaded", target.served_model_name, target.base_url, command, tuple(models),
                          detail="the server already serves this adapter under that name")
    replaced = None
    if current is not None:  # same name, other adapter: vLLM refuses a duplicate name, so swap it
        unload_adapter(target.base_url, target.served_model_name, allowed)
        replaced = current.get("root")
    load_adapter(target.base_url, target.served_model_name, checkpoint_dir, allowed)
    models = served_models(target.base_url, allowed)
    if target.served_model_name not in models:
        raise DeploymentError(f"{target.base_url} accepted adapter {target.served_model_name!r} but GET /v1/models "
                              f"does not list it (lists {sorted(models)})")
    extra: dict[str, Any] = {"replaced_adapter": replaced} if replaced else {}
    if allowed is not None:
        extra["allowed_urls"] = list(allowed)
    return Deployment("loaded", target.served_model_name, target.base_url, command, tuple(models),
                      detail="runtime LoRA load verified through GET /v1/models", extra=extra)


def undo_deploy(deployment: Deployment) -> str:
    """Reverse a ``loaded`` deployment (used when registration fails after it); returns what was done."""
    if deployment.status != "loaded" or deployment.base_url is None:
        return "nothing to undo"
    allowed = deployment.extra.get("allowed_urls")
    unload_adapter(deployment.base_url, deployment.served_model_name, allowed)
    replaced = deployment.extra.get("replaced_adapter")
    if replaced:
        load_adapter(deployment.base_url, deployment.served_model_name, replaced, allowed)
        return f"restored adapter {replaced}"
    return f"unloaded {deployment.served_model_name}"
