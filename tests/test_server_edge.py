"""The server's edge (``server/edge.py``): hosts, origins, the API key on /metrics and /health, body size.

The policy is tested on its own, then ``GuardMiddleware`` in front of a two-route app under a real
uvicorn (no model needed); ``test_server.py`` checks the same on the real app.
"""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI, Request

from specdec.server.edge import EdgePolicy, GuardMiddleware, split_host
from tests.test_server import running_server

KEY = {"Authorization": "Bearer k"}


def test_split_host():
    assert [split_host(h) for h in ("[::1]:8000", "[::1]", "LocalHost:80", "10.0.0.2", "example.com:443")] == \
        ["::1", "::1", "localhost", "10.0.0.2", "example.com"]


def test_default_hosts_are_local_names_ip_literals_and_the_bound_address():
    edge = EdgePolicy.for_bind("127.0.0.1")
    for host in ("localhost:8000", "127.0.0.1:8000", "[::1]:8000", "app.localhost", "10.1.2.3:8000", None):
        assert edge.host_allowed(host), host
    for host in ("evil.example:8000", "localhost.evil.example", "127.0.0.1.nip.io", ""):
        assert not edge.host_allowed(host), host
    assert EdgePolicy.for_bind("myhost.lan").host_allowed("MyHost.lan:8000")
    assert EdgePolicy.for_bind("0.0.0.0", ["api.example"]).host_allowed("api.example")
    assert EdgePolicy.for_bind("127.0.0.1", ["*"]).host_allowed("evil.example")


def test_origins_own_listed_or_any():
    edge = EdgePolicy.for_bind("127.0.0.1", allowed_origins=["https://app.example/"])
    assert edge.origin_allowed(None, "127.0.0.1:8000")  # not a browser
    assert edge.origin_allowed("http://127.0.0.1:8000", "127.0.0.1:8000")  # the playground
    assert edge.origin_allowed("https://APP.example", "127.0.0.1:8000")
    for origin in ("http://evil.example", "http://127.0.0.1:9999", "null", "https://app.example.evil"):
        assert not edge.origin_allowed(origin, "127.0.0.1:8000"), origin
    assert EdgePolicy.for_bind("127.0.0.1", allowed_origins=["*"]).origin_allowed("http://evil.example", "x")


def test_metrics_and_health_behind_the_key_unless_public():
    closed, public = EdgePolicy.for_bind("127.0.0.1"), EdgePolicy.for_bind("127.0.0.1", metrics_public=True)
    assert all(closed.protected(p) for p in ("/v1/models", "/metrics", "/metrics/live", "/health"))
    assert not public.protected("/metrics") and not public.protected("/health") and public.protected("/metrics/live")
    assert not closed.protected("/") and not closed.protected("/static/playground.js")


def small_app() -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": "/home/me/models/secret.gguf"}

    @app.post("/v1/echo")
    async def echo(request: Request):
        return {"bytes": len(await request.body())}

    return app


@pytest.fixture(scope="module")
def guarded():
    """Base URLs of a small app behind GuardMiddleware: (key and default edge, key and public metrics)."""
    edge, public = EdgePolicy.for_bind("127.0.0.1"), EdgePolicy.for_bind("127.0.0.1", metrics_public=True)
    with running_server(GuardMiddleware(small_app(), "k", 1000, edge)) as url, \
            running_server(GuardMiddleware(small_app(), "k", 1000, public)) as public_url:
        yield url, public_url


def test_host_origin_key_and_size_refusals(guarded):
    url, public_url = guarded
    port = url.rsplit(":", 1)[1]
    cases = [  # (method, path, headers, body, status, code)
        ("POST", "/v1/echo", KEY, b"x", 200, None),
        ("POST", "/v1/echo", {**KEY, "host": f"localhost:{port}"}, b"x", 200, None),
        ("GET", "/health", {**KEY, "host": f"rebound.evil.example:{port}"}, None, 400, "invalid_host"),
        ("POST", "/v1/echo", {**KEY, "host": "rebound.evil.example"}, b"x", 400, "invalid_host"),
        ("POST", "/v1/echo", {**KEY, "origin": "http://evil.example"}, b"x", 403, "invalid_origin"),
        ("POST", "/v1/echo", {**KEY, "origin": f"http://127.0.0.1:{port}"}, b"x", 200, None),
        ("GET", "/health", {"origin": "http://evil.example"}, None, 401, "invalid_api_key"),  # GET: key decides
        ("GET", "/health", {}, None, 401, "invalid_api_key"),
        ("GET", "/health", KEY, None, 200, None),
        ("POST", "/v1/echo", KEY, b"x" * 1001, 413, "request_too_large"),
    ]
    for method, path, headers, body, status, code in cases:
        r = httpx.request(method, url + path, headers=headers, content=body)
        assert r.status_code == status, (method, path, headers, r.text)
        if code is not None:
            assert r.json()["error"]["code"] == code and r.json()["error"]["message"]
    assert httpx.get(public_url + "/health").status_code == 200  # --metrics-public


def test_chunked_body_limit(guarded):
    url = guarded[0]

    def chunks(n: int):
        for _ in range(n):
            yield b"y" * 100

    r = httpx.post(url + "/v1/echo", content=chunks(10), headers=KEY)
    assert r.request.headers.get("transfer-encoding") == "chunked"
    assert r.status_code == 200 and r.json() == {"bytes": 1000}  # the body reaches the route whole
    r = httpx.post(url + "/v1/echo", content=chunks(11), headers=KEY)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = httpx.post(url + "/v1/nowhere", content=chunks(11), headers=KEY)
    assert r.status_code == 413  # before routing: no 404 for an oversized body
