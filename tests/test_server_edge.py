"""The server's edge (``server/edge.py``): hosts, origins, the API key on /metrics and /health, body size.

The policy is tested on its own, then ``GuardMiddleware`` in front of a two-route app under a real
uvicorn (no model needed); ``test_server.py`` checks the same on the real app.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request

from specdec.cli.main import build_parser
from specdec.config import DEFAULT_SPEC_TYPES
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


# -- docs/server.md states the flags' defaults ------------------------------------------------------
DOC = Path(__file__).parents[1] / "docs" / "server.md"
ROW = re.compile(r"^\| `(--[a-z0-9-]+)` \| ([^|]*) \|", re.M)
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")


def specdec_text(doc: str) -> str:
    """The prose, and of the code blocks the specdec command lines (bench scripts take flags of their own)."""
    out, in_code = [], False
    for line in doc.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code:
            out.append(line)
        elif "specdec " in line:
            out.append(line[line.index("specdec ") :])
    return "\n".join(out)


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every option string of ``parser`` and its subcommands -> its action."""
    out = {}
    for action in parser._actions:
        out.update({opt: action for opt in action.option_strings})
        for sub in getattr(action, "choices", None) or {}:
            if isinstance(action.choices, dict):
                out.update(options(action.choices[sub]))
    return out


def documented_default(flag: str, default) -> set[str]:
    if flag == "--spec-type":
        return {",".join(t.value for t in DEFAULT_SPEC_TYPES)}
    if default is None or default == []:
        return {"none", "", "model path", "auto", "$SPECDEC_API_KEY"}
    if isinstance(default, bool):
        return {"on" if default else "off"}
    if isinstance(default, int) and default % 2**20 == 0:
        return {f"{default // 2**20} MiB"}
    return {str(default)}


def test_server_doc_flags_table_matches_the_parser(monkeypatch):
    monkeypatch.delenv("SPECDEC_API_KEY", raising=False)
    parser = build_parser("serve")
    serve = options(parser._subparsers._group_actions[0].choices["serve"])
    text = DOC.read_text()
    rows = dict(ROW.findall(text))
    server_group = next(g for g in parser._subparsers._group_actions[0].choices["serve"]._action_groups
                        if g.title == "server")
    missing = [a.option_strings[0] for a in server_group._group_actions if a.option_strings[0] not in rows]
    assert not missing, f"docs/server.md's flag table lacks {missing}"
    for flag, cell in rows.items():
        assert flag in serve, f"docs/server.md documents {flag}, which specdec serve does not take"
        got = cell.strip().replace("`", "")
        assert got in documented_default(flag, serve[flag].default), (flag, got, serve[flag].default)
    known = options(build_parser())
    stale = sorted(set(FLAG.findall(specdec_text(text))) - set(known))
    assert not stale, f"docs/server.md names flags specdec does not have: {stale}"


def test_bodies_in_flight_together_are_bounded():
    """Bodies held by running requests count against one total: with room for 2500 bytes, a second
    2000-byte upload while the first's request still runs gets 429; once it finished, the next is served."""
    import asyncio
    import threading

    app = FastAPI()
    release, entered = threading.Event(), threading.Event()

    @app.post("/v1/hold")
    async def hold(request: Request):
        entered.set()
        await asyncio.to_thread(release.wait, 30)
        return {"bytes": len(await request.body())}

    guard = GuardMiddleware(app, None, 2000, EdgePolicy.for_bind("127.0.0.1"), max_total_body_bytes=2500)
    with running_server(guard) as url, httpx.Client(timeout=30) as client:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(client.post, url + "/v1/hold", content=b"x" * 2000)
            assert entered.wait(30)
            busy = httpx.post(url + "/v1/hold", content=b"y" * 2000, timeout=30)
            assert busy.status_code == 429 and busy.json()["error"]["code"] == "rate_limit_exceeded"
            assert guard.held == 2000
            release.set()
            assert first.result().json() == {"bytes": 2000}
        assert guard.held == 0
        assert httpx.post(url + "/v1/hold", content=b"z" * 2000, timeout=30).json() == {"bytes": 2000}
