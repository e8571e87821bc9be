"""HTTP for requests that carry a secret: the URL parsed once, the connection to that host, no redirects.

    endpoint = parse_url("http://127.0.0.1:8000/v1/models")   # Endpoint(scheme, host, port, target)
    check(endpoint.origin)                                      # the caller's allow-list, on this parse
    status, body = send(endpoint, "GET", headers={"Authorization": f"Bearer {key}"}, timeout_s=10)

Why not ``urlopen`` or ``requests``: both follow redirects, so a server answering 307 with another
host gets the request, key included, replayed there; and each parses the URL again its own way
(``http://169.254.169.254\\@127.0.0.1/`` is host 127.0.0.1 to ``urlsplit``, which an allow-list
reads, and host 169.254.169.254 to urllib3). Here ``urlsplit`` parses the URL once; user info,
backslashes, whitespace and schemes other than http(s) are refused; the caller checks that parse,
and ``http.client`` connects to exactly its host and port. A 3xx answer is :class:`Redirected`,
never followed: the fix is to point the URL at the final server. ``HTTP(S)_PROXY`` is not used
either, for the same reason: the key goes to the named server only. HTTPS verifies the
certificate and host name with the system's CA store.
"""

from __future__ import annotations

import http.client
import ssl
import urllib.parse
from dataclasses import dataclass


class BadURL(ValueError):
    """A URL this module will not send a request to; the message names it and the fix."""


class RequestError(RuntimeError):
    """The request got no usable answer; the message names the URL."""


class Unreachable(RequestError):
    """No connection, a timeout, or a broken answer: worth a retry."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url} unreachable ({reason})")
        self.reason = reason


class Redirected(RequestError):
    """The server answered 3xx; the redirect was not followed."""


@dataclass(frozen=True)
class Endpoint:
    """One parsed http(s) URL: where to connect and what to ask for."""

    url: str  # as given, for messages
    scheme: str
    host: str  # lower case, IPv6 without brackets
    port: int
    target: str  # path and query: the request line's target

    @property
    def origin(self) -> tuple[str, str, int]:
        return self.scheme, self.host, self.port


def parse_url(url: str) -> Endpoint:
    """The one parse of ``url`` that both the allow-list check and the connection use."""
    url = url.strip()
    if "\\" in url or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise BadURL(f"URL {url!r} contains a backslash, a space or a control character, which HTTP libraries "
                     "read differently; write the URL without it")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadURL(f"URL {url!r} is not an http(s) URL with a host (e.g. http://vllm:8000)")
    if "@" in parts.netloc:
        raise BadURL(f"URL {url!r} carries user info (user@host); drop it: keys travel in the Authorization "
                     "header from their environment variable, never in the URL")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise BadURL(f"URL {url!r} has an invalid port") from None
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Endpoint(url, parts.scheme, parts.hostname.lower(), port, target)


def send(endpoint: Endpoint, method: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         timeout_s: float = 30.0) -> tuple[int, bytes]:
    """One request to exactly ``endpoint``'s host and port; ``(status, body)`` for any non-3xx answer."""
    if endpoint.scheme == "https":
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(
            endpoint.host, endpoint.port, timeout=timeout_s, context=ssl.create_default_context())
    else:
        connection = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeout_s)
    try:
        connection.request(method, endpoint.target, body=body, headers=headers or {})
        response = connection.getresponse()
        data = response.read()
    except (OSError, http.client.HTTPException) as exc:  # refused, reset, timeout, TLS, a malformed answer
        raise Unreachable(endpoint.url, f"{type(exc).__name__}: {exc}") from None
    finally:
        connection.close()
    if 300 <= response.status < 400:
        location = response.getheader("Location") or "(no Location)"
        raise Redirected(f"{method} {endpoint.url} answered {response.status} redirect to {location}; redirects are "
                         "not followed because the request carries a key: point the URL at the final server")
    return response.status, data
