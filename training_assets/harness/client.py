"""The OpenAI client the harness (and ``agent run``) talks to model servers through.

    client = chat_client("http://127.0.0.1:8000/v1", api_key=None, timeout_s=60, max_retries=2)
    message = chat_message(client, model="smollm2", messages=[...], tools=[...], max_tokens=96)

``chat_client`` gives ``openai.OpenAI`` an ``httpx.Client`` that never follows a redirect (a 3xx
to another host would get the request replayed there, key included) and ignores proxy variables
(the key goes to the named server only), with a timeout on every request and openai's retries
(connection errors, 408/409/429/5xx, with backoff). ``chat_message`` posts one chat completion
and returns the assistant message as a plain dict, or raises a ``ChatError`` whose one-line
message names the URL: the raw answer is parsed here, so a 200 that is not JSON, or JSON that is
not a chat completion, is an error that says so rather than a string where a message should be.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai

from training_assets import http_client
from training_assets.harness.errors import HarnessError

NO_KEY = "no-key"  # openai requires a key; a local server ignores it, and OPENAI_API_KEY is never read


class ChatError(RuntimeError):
    """One chat request failed; ``kind`` says how (down, timeout, connection, status, not_json, not_chat)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def chat_client(base_url: str, api_key: str | None = None, timeout_s: float = 60, max_retries: int = 2) -> openai.OpenAI:
    """An OpenAI client for ``base_url`` (…/v1): timeouts, retries, no redirects, no proxies."""
    try:
        http_client.parse_url(base_url)
    except http_client.BadURL as exc:
        raise HarnessError(f"model server URL: {exc}") from None
    if timeout_s <= 0 or max_retries < 0:
        raise HarnessError(f"timeout_s must be > 0 and max_retries >= 0, got {timeout_s} and {max_retries}")
    transport = httpx.Client(follow_redirects=False, trust_env=False, timeout=httpx.Timeout(timeout_s))
    return openai.OpenAI(base_url=base_url.strip().rstrip("/"), api_key=api_key or NO_KEY, timeout=timeout_s,
                         max_retries=max_retries, http_client=transport)


def chat_url(client: openai.OpenAI) -> str:
    return str(client.base_url).rstrip("/") + "/chat/completions"


def _status_error(url: str, response: httpx.Response) -> ChatError:
    status = response.status_code
    if 300 <= status < 400:
        location = response.headers.get("location") or "(no Location)"
        return ChatError("status", f"{url} answered {status} redirect to {location}; redirects are not followed "
                                   "because the request carries a key: point the URL at the final server")
    return ChatError("status", f"{url} answered {status}: {response.text[:300]!r}")


def chat_message(client: openai.OpenAI, **request: Any) -> dict[str, Any]:
    """POST one chat completion (``request``: model, messages, tools, ...); the assistant message as a dict."""
    url = chat_url(client)
    try:
        raw = client.chat.completions.with_raw_response.create(**request)
    except openai.APITimeoutError:
        raise ChatError("timeout", f"{url} gave no answer within {client.timeout}s") from None
    except openai.APIConnectionError as exc:
        refused = isinstance(exc.__cause__, httpx.ConnectError)
        raise ChatError("down" if refused else "connection",
                        f"{url} unreachable ({type(exc.__cause__ or exc).__name__}: {exc.__cause__ or exc})") from None
    except openai.APIStatusError as exc:
        raise _status_error(url, exc.response) from None
    body = raw.http_response.text
    try:
        payload = json.loads(body)
    except ValueError:
        raise ChatError("not_json", f"{url} answered {raw.http_response.status_code} with {body[:200]!r}, which is not "
                                    "JSON: the URL must be an OpenAI-compatible base URL (…/v1)") from None
    try:
        message = payload["choices"][0]["message"]
        if not isinstance(message, dict):
            raise TypeError(type(message).__name__)
    except (KeyError, IndexError, TypeError):
        raise ChatError("not_chat", f"{url}: not a chat-completions answer: {' '.join(str(payload)[:300].split())}") \
            from None
    return message
