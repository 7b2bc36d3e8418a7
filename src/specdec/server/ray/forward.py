"""An HTTP request as plain data, run through an ASGI app in the same process, its response streamed as parts.

The Ray ingress sends each request to a replica this way, so a replica answers with exactly the
app ``specdec serve`` runs (routes, validation, errors, streaming) instead of a second copy of it.
Both types are plain dataclasses: Ray pickles them between processes.

    parts = call_asgi(app, ForwardedRequest("POST", "/v1/completions", body=b'{"prompt": "hi"}'))
    first = await anext(parts)   # ResponsePart(status=200, headers=[...], body=b'{"id": ...}', more=False)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

# Hop-by-hop or recomputed headers that must not be copied from one HTTP connection to another.
HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "upgrade", "te", "trailer",
                         "proxy-connection", "host"})


@dataclass
class ForwardedRequest:
    method: str
    path: str
    query: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)  # lower-case names
    body: bytes = b""


@dataclass
class ResponsePart:
    """A piece of a response body; the first part also carries the status and headers."""

    body: bytes
    more: bool  # False on the last part
    status: int | None = None
    headers: list[tuple[str, str]] | None = None


def _scope(request: ForwardedRequest) -> dict:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "scheme": "http",
        "method": request.method, "path": request.path, "raw_path": request.path.encode(),
        "query_string": request.query, "root_path": "", "client": None, "server": None,
        "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in request.headers
                    if k not in HOP_HEADERS],
    }


async def call_asgi(app, request: ForwardedRequest) -> AsyncIterator[ResponsePart]:
    """Run ``request`` through ``app``; yield its body as it is sent, status and headers on the first part.

    Closing the iterator early (the caller went away) tells the app the client disconnected
    and cancels it, so a streaming generation stops and frees its slot. An app that fails
    before sending a response raises here.
    """
    sent: asyncio.Queue[dict | None] = asyncio.Queue()
    gone = asyncio.Event()
    body_given = False

    async def receive() -> dict:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await gone.wait()  # Starlette listens for a disconnect while it streams
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        await sent.put(message)

    task = asyncio.ensure_future(app(_scope(request), receive, send))
    task.add_done_callback(lambda _t: sent.put_nowait(None))
    status, headers = None, None
    try:
        while (message := await sent.get()) is not None:
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", [])]
            elif message["type"] == "http.response.body":
                more = bool(message.get("more_body", False))
                yield ResponsePart(message.get("body", b""), more, status, headers)
                status = headers = None
                if not more:
                    return
        task.result()  # the app returned (or raised) without finishing a response
        raise RuntimeError("the app ended without a complete response")
    finally:
        gone.set()
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
