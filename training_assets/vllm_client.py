"""HTTP client for a vLLM OpenAI-compatible server: API key, bounded retries, runtime LoRA load/unload.

    client = VllmClient("http://127.0.0.1:8000", api_key_env="VLLM_API_KEY",
                        retry=RetryPolicy(max_attempts=5, backoff_s=0.5, max_backoff_s=8.0))
    client.load_adapter("run-v3", "/shared/adapters/run-v3")     # POST /v1/load_lora_adapter
    gens = client.complete("run-v3", prompt_ids=[1, 5, 9], n=4, max_tokens=32, temperature=1.0)
    client.unload_adapter("run-v2")                                # POST /v1/unload_lora_adapter

The key is read from the environment variable *named* by ``api_key_env`` at each request (it is
never stored in a config, a manifest or a log line) and sent as ``Authorization: Bearer <key>``.
Before any request the URL must pass ``deploy.require_allowed``: the run config names the URL, so
without an operator's allow-list (``$TRAINING_ASSETS_DEPLOY_ALLOWED_URLS``) only loopback servers
receive the key and the prompts. Requests go through ``http_client`` to exactly the host and port
that check parsed; a 3xx answer fails at once (never followed, never retried).

Retries: 429, 5xx, connection errors and timeouts are retried up to ``max_attempts`` in all, waiting
``min(max_backoff_s, backoff_s · 2^k) · (1 + jitter · u)``, u ~ U[0, 1) (exponential backoff with
bounded jitter, so workers that failed together do not retry together). Any other status fails at
once. The last failure raises :class:`VllmError` naming the URL, the path and the status.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from training_assets import http_client
from training_assets.deploy import require_allowed

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class VllmError(RuntimeError):
    """The vLLM server refused a request, or did not answer after the last retry."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a request is retried (see the module docstring for the formula)."""

    max_attempts: int = 5  # tries in all, the first included
    backoff_s: float = 0.5  # wait before the first retry
    max_backoff_s: float = 8.0  # cap on one wait (before jitter)
    jitter: float = 0.5  # each wait is stretched by up to this fraction

    def delay_s(self, retry: int, u: float) -> float:
        """Wait before retry number ``retry`` (0-based); ``u`` in [0, 1)."""
        return min(self.max_backoff_s, self.backoff_s * 2**retry) * (1.0 + self.jitter * u)


class VllmClient:
    """Requests to one vLLM server (the server root: a trailing ``/v1`` is dropped)."""

    def __init__(self, base_url: str, api_key_env: str = "VLLM_API_KEY", retry: RetryPolicy | None = None,
                 timeout_s: float = 120.0, allowed_urls: Iterable[str] | None = None,
                 sleep: Callable[[float], None] = time.sleep, seed: int = 0) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        require_allowed(self.base_url, allowed_urls)  # fail at construction, before any request
        self.allowed_urls = tuple(allowed_urls) if allowed_urls is not None else None
        self.api_key_env, self.retry, self.timeout_s = api_key_env, retry or RetryPolicy(), timeout_s
        self._sleep, self._rng = sleep, random.Random(seed)
        self.retries = 0  # retries so far, all requests (a figure for logs and tests)
        self.last_attempts = 0  # tries the latest request took

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env)
        return {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One request with the retries; returns the JSON body (or the text when it is not JSON)."""
        url = f"{self.base_url}{path}"
        endpoint = require_allowed(url, self.allowed_urls)  # connect to exactly what was checked
        data = json.dumps(body).encode() if body is not None else None
        last = ""
        status: int | None = None
        for attempt in range(self.retry.max_attempts):
            self.last_attempts = attempt + 1
            if attempt:
                self.retries += 1
                self._sleep(self.retry.delay_s(attempt - 1, self._rng.random()))
            try:
                status, answer = http_client.send(endpoint, method, data, self._headers(), self.timeout_s)
            except http_client.Unreachable as exc:
                status, last = None, f"unreachable ({exc.reason})"
                continue
            except http_client.Redirected as exc:
                raise VllmError(f"vLLM {exc}") from None
            text = answer.decode("utf-8", "replace")
            if status == 200:
                try:
                    return json.loads(text)
                except ValueError:
                    return text  # vLLM answers the adapter endpoints in plain text
            last = f"answered {status}: {text[:300]}"
            if status == 401:
                raise VllmError(f"vLLM {method} {url} answered 401 (unauthorised): put the server's API key in "
                                f"${self.api_key_env}", status=401)
            if status not in RETRY_STATUSES:
                raise VllmError(f"vLLM {method} {url} {last}", status=status)
        raise VllmError(f"vLLM {method} {url} failed after {self.retry.max_attempts} attempt(s); last: {last}. "
                        "Check the server (or raise grpo.vllm.max_attempts), or use rollout='local'", status=status)

    def request_json(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """``request`` for an endpoint that answers a JSON object; anything else names the URL."""
        answer = self.request(method, path, body)
        if not isinstance(answer, dict):
            raise VllmError(f"vLLM {method} {self.base_url}{path} answered 200 with {str(answer)[:200]!r}, not a JSON "
                            "object: is the URL a vLLM OpenAI-compatible server?")
        return answer

    def served_models(self) -> list[str]:
        """``GET /v1/models``: the names the server answers to (base model and loaded adapters)."""
        return [card["id"] for card in self.request_json("GET", "/v1/models")["data"]]

    def load_adapter(self, name: str, path: str) -> None:
        """``POST /v1/load_lora_adapter``; a retried load whose first try got through is not an error."""
        try:
            self.request("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        except VllmError as exc:
            if exc.status == 400 and "already" in str(exc) and self.last_attempts > 1:
                return  # the try that timed out or failed upstream did load it
            raise VllmError(f"{exc} (loading adapter {name!r} from {path}: the server needs --enable-lora, "
                            "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and read access to that path)", exc.status) from None

    def unload_adapter(self, name: str) -> None:
        self.request("POST", "/v1/unload_lora_adapter", {"lora_name": name})

    def complete(self, model: str, prompt_ids: Sequence[int], n: int, max_tokens: int,
                 temperature: float) -> list[tuple[str, list[int], list[float]]]:
        """``n`` samples of ``model`` after ``prompt_ids``: (text, sampled token ids, their log-probs) each."""
        body = {"model": model, "prompt": list(prompt_ids), "n": n, "max_tokens": max_tokens,
                "temperature": temperature, "logprobs": 0, "return_tokens_as_token_ids": True}
        out = []
        for choice in self.request_json("POST", "/v1/completions", body)["choices"]:
            lp = choice.get("logprobs") or {}
            tokens, logps = lp.get("tokens") or [], lp.get("token_logprobs") or []
            if len(tokens) != len(logps) or any(not str(t).startswith("token_id:") for t in tokens):
                raise ValueError("vLLM response lacks token ids with log-probs: the server must support "
                                 "return_tokens_as_token_ids and logprobs")
            out.append((choice["text"], [int(str(t).split(":", 1)[1]) for t in tokens], [float(x) for x in logps]))
        return out
