"""The server's edge: what a request must be before any route sees it (``GuardMiddleware``).

Checked in this order, each refusal an OpenAI error body:

1. ``Host`` is one the server answers to (400 ``invalid_host``). A page on ``evil.example`` can
   point that name at 127.0.0.1 (DNS rebinding) and then read the replies as same-origin, but
   its requests still say ``Host: evil.example``. Allowed by default: ``localhost`` (and
   ``*.localhost``, which browsers resolve to loopback themselves), the bound address, and any IP
   literal (a page cannot rebind a name it does not own; an IP is reached by typing it).
2. A request that changes state (any method but GET/HEAD/OPTIONS) whose ``Origin`` is not the
   server's own (the host it was sent to) and not in ``--allowed-origins`` (403 ``invalid_origin``):
   another site's page cannot make the user's browser spend the model. Clients outside a browser
   send no ``Origin`` and pass; the playground at ``/`` is same-origin and passes.
3. The API key, when set, on ``PROTECTED_PATHS`` and, unless ``metrics_public``, on ``/metrics``
   and ``/health`` (401 ``invalid_api_key``): they name the model, which may be a file path.
4. The body: at most ``max_body_bytes`` (413 ``request_too_large``), whether announced by
   ``Content-Length`` or sent chunked; the body is read here, counted, and handed on whole. The
   bodies of all requests in flight together stay within ``max_total_body_bytes`` (429 beyond).

Plain ASGI (not BaseHTTPMiddleware), so streamed responses and client disconnects pass through
untouched. No heavy imports: ``specdec serve --help`` reads its defaults from here.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass

from specdec.server.errors import error_body
from specdec.server.web import PROTECTED_PATHS

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
ANY = "*"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
METRICS_PATHS = ("/metrics", "/health")  # "/metrics" covers /metrics/live, already protected


def split_host(host: str) -> str:
    """A Host header or an origin's netloc -> the host name, lower case, without port or IPv6 brackets.

    >>> split_host("[::1]:8000"), split_host("LocalHost:80"), split_host("10.0.0.2")
    ('::1', 'localhost', '10.0.0.2')
    """
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class EdgePolicy:
    """Which hosts and origins the server answers, and whether /metrics and /health need the key.

    ``allowed_hosts``: host names (no port) besides the defaults, or ``"*"`` for any;
    ``allowed_origins``: origins (``https://app.example:3000``) besides the server's own, or ``"*"``.
    """

    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    metrics_public: bool = False
    check_hosts: bool = True  # False: any Host (what ``open()`` gives)

    @classmethod
    def for_bind(cls, bind: str, allowed_hosts: Sequence[str] = (), allowed_origins: Sequence[str] = (),
                 metrics_public: bool = False) -> EdgePolicy:
        """The policy of a server bound to ``bind`` (``--host``) with the ``--allowed-*`` lists."""
        hosts = tuple(split_host(h) if h != ANY else ANY for h in (bind, *allowed_hosts))
        origins = tuple(o.strip().rstrip("/").lower() for o in allowed_origins)
        return cls(hosts, origins, metrics_public, check_hosts=ANY not in hosts)

    @classmethod
    def open(cls) -> EdgePolicy:
        """No host or origin check and open metrics (behind a proxy that does the checking)."""
        return cls(allowed_origins=(ANY,), metrics_public=True, check_hosts=False)

    def host_allowed(self, host: str | None) -> bool:
        if not self.check_hosts or host is None:  # no Host at all: HTTP/1.0, not a browser
            return True
        name = split_host(host)
        return name == "localhost" or name.endswith(".localhost") or _is_ip(name) or name in self.allowed_hosts

    def origin_allowed(self, origin: str | None, host: str | None) -> bool:
        """``origin`` (the header, None when absent) may send a state-changing request to ``host``."""
        if origin is None or ANY in self.allowed_origins:
            return True
        origin = origin.strip().rstrip("/").lower()
        own = origin.partition("://")[2]  # scheme ignored: a TLS proxy in front sees http
        return (host is not None and own == host.strip().lower()) or origin in self.allowed_origins

    def protected(self, path: str) -> bool:
        return path.startswith(PROTECTED_PATHS) or (not self.metrics_public and path.startswith(METRICS_PATHS))


class GuardMiddleware:
    """Host, origin, API key and body size, as the module docstring lists them."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int, edge: EdgePolicy,
                 max_total_body_bytes: int | None = None) -> None:
        # ``edge`` has no default: a front door that forgot it must not fall open (the Ray ingress did)
        self.app, self.api_key, self.max_body_bytes, self.edge = app, api_key, max_body_bytes, edge
        # Bodies being read or held by a running request, all together: 16 clients uploading 16 MiB
        # each must not take 256 MiB (429 beyond it; default 4 bodies of the largest size)
        self.max_total_body_bytes = max_total_body_bytes or 4 * max_body_bytes
        self.held = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await _send_json(send, *refusal)
            return
        if scope["method"] in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        counted = [0]  # this request's bytes in ``held``
        try:
            body = await _read_body(receive, self.max_body_bytes, self._reserve(counted))
            if body is None:
                await _send_json(send, 413, self._too_large("more than"), {"connection": "close"})
            elif body is _BUSY:
                await _send_json(send, 429, error_body(
                    f"the server holds {self.max_total_body_bytes} bytes of request bodies already; retry later",
                    "rate_limit_error", "rate_limit_exceeded"), {"connection": "close"})
            else:
                await self.app(scope, _replay(body, receive), send)
        finally:
            self.held -= counted[0]

    def _reserve(self, counted: list[int]):
        """A callback taking ``n`` more bytes of this request into ``held``; False when they do not fit."""
        def reserve(n: int) -> bool:
            if self.held + n > self.max_total_body_bytes:
                return False
            self.held += n
            counted[0] += n
            return True

        return reserve

    def _refusal(self, scope, headers: dict[str, str]) -> tuple[int, dict, dict] | None:
        """(status, body, extra headers) when the request is refused before its body is read."""
        host = headers.get("host")
        if not self.edge.host_allowed(host):
            return 400, error_body(f"this server does not answer to the host {host!r} (see --allowed-hosts)",
                                   "invalid_request_error", "invalid_host"), {}
        if scope["method"] not in SAFE_METHODS and not self.edge.origin_allowed(headers.get("origin"), host):
            return 403, error_body(f"cross-origin requests from {headers['origin']!r} are refused "
                                   "(see --allowed-origins)", "invalid_request_error", "invalid_origin"), {}
        if self.api_key and self.edge.protected(scope["path"]):
            given = headers.get("authorization", "")
            token = given[7:] if given[:7].lower() == "bearer " else ""
            if not hmac.compare_digest(token.encode(), self.api_key.encode()):
                return 401, error_body("invalid or missing API key (send 'Authorization: Bearer KEY')",
                                       "authentication_error", "invalid_api_key"), {"www-authenticate": "Bearer"}
        length = headers.get("content-length", "")
        if length.isascii() and length.isdigit() and int(length) > self.max_body_bytes:
            return 413, self._too_large(f"{length} bytes >"), {"connection": "close"}
        return None

    def _too_large(self, size: str) -> dict:
        return error_body(f"request body too large ({size} {self.max_body_bytes} bytes)", "invalid_request_error",
                          "request_too_large")


_BUSY = b"busy"  # _read_body's answer when the bodies held together would pass their bound


async def _read_body(receive, limit: int, reserve=lambda n: True) -> bytes | None:
    """The whole request body, or None as soon as it passes ``limit`` bytes, or ``_BUSY`` when
    ``reserve(len(chunk))`` refuses a chunk (the rest is not read)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        if not reserve(len(chunk)):
            return _BUSY
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive):
    """A ``receive`` that gives the app ``body`` in one message, then the client's own messages
    (so a later disconnect still reaches ``request.is_disconnected()``)."""
    sent = False

    async def replay():
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _send_json(send, status: int, body: dict, extra_headers: dict | None = None) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in (extra_headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
