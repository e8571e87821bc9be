"""The streamable-HTTP transport with a bearer token, and the loopback rule that needs one.

``serve_http`` binds the server's Starlette app with uvicorn; with a token every request must
carry ``Authorization: Bearer <token>`` (the scheme in any case, RFC 7235; the token compared in
constant time), otherwise 401. Callers refuse a non-loopback bind address without a token
(``paths.is_loopback``).
"""

from __future__ import annotations

import hmac
from typing import Any

TOKEN_ENV = "TRAINING_ASSETS_MCP_TOKEN"


def bearer_token(header: bytes) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` value; None for another scheme.

    RFC 7235 §2.1: the scheme is case-insensitive (``bearer``, ``BEARER``), one or more spaces
    before the token.
    """
    scheme, _, token = header.partition(b" ")
    return token.lstrip(b" ") if scheme.lower() == b"bearer" else None


class BearerTokenMiddleware:
    """ASGI middleware: 401 unless the request's bearer token is the configured one."""

    def __init__(self, app: Any, token: str) -> None:
        self.app, self.expected = app, token.encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = bearer_token(dict(scope.get("headers") or []).get(b"authorization", b""))
            # compare_digest on the token itself: the time taken says nothing about how much matched
            if given is None or not hmac.compare_digest(given, self.expected):
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain"), (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": b"missing or wrong bearer token\n"})
                return
        await self.app(scope, receive, send)


def serve_http(server: Any, host: str, port: int, token: str | None) -> None:
    import uvicorn  # only when serving over HTTP: stdio clients never load it

    app = server.streamable_http_app(host=host)
    uvicorn.run(BearerTokenMiddleware(app, token) if token else app, host=host, port=port, log_level="warning")
