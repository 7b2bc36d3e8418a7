"""Soak check of `specdec serve` (issue 34): many concurrent clients and every fault, bounded in time,
127.0.0.1 only. Prints one JSON object of figures (docs/server.md records them).

    .venv/bin/python scripts/soak.py                        # 64 clients, 300 s, the default model
    .venv/bin/python scripts/soak.py --seconds 60 --clients 16
    .venv/bin/python scripts/soak.py --ray --replicas 2     # and one replica killed half-way

It starts the server (a subprocess on a free loopback port), answers a fixed set of greedy requests
quietly (the reference texts), then runs ``--clients`` workers for ``--seconds``. Each worker draws
its next request from a fixed mix: streaming and non-streaming chat, completions with echo and
logprobs, n up to 4, grammars (a JSON schema, a regex), the greedy reference requests again, and
hostile bodies (``tests/hostile.py``: every field given deep nesting, huge numbers and strings,
wrong types); a tenth of streams are dropped mid-way. Under ``--ray`` one engine replica process is
killed half-way. Afterwards it checks and reports: 5xx answers (none allowed but a replica's death
mid-stream under --ray), every request answered (a status, or the stream's end or error event),
greedy texts equal to the quiet run's, the server's peak RSS against ``--max-rss-mib``, and the
server idle (no running or waiting sequence) and still answering.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.hostile: the fuzz cases
from tests.hostile import hostile_cases  # noqa: E402

GREEDY = [("/v1/completions", {"prompt": p, "max_tokens": 24, "temperature": 0}) for p in (
    "The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4,")] + [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": q}], "max_tokens": 24, "temperature": 0})
    for q in ("Name three colours.", "What is 2 + 2?")]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "specdec.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--max-batch-size", str(args.batch), "--max-queue", str(4 * args.clients), "--max-model-len", "2048"]
    if args.ray:
        cmd += ["--ray", "--replicas", str(args.replicas)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(args.log, "w"), start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 900
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited; see {args.log}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError("the server did not start")


def mix(rng: random.Random, hostile: list[tuple[str, bytes]]):
    """The next request: (kind, path, body as dict or raw bytes, stream?)."""
    roll = rng.random()
    chat = {"messages": [{"role": "user", "content": rng.choice(["Tell me a story.", "List four fruits.",
                                                                 "Explain rain briefly."])}]}
    if roll < 0.15:
        return ("greedy",) + (rng.choice(GREEDY)) + (False,)
    if roll < 0.35:
        return "chat-stream", "/v1/chat/completions", {**chat, "max_tokens": 48, "stream": True}, True
    if roll < 0.5:
        return "chat", "/v1/chat/completions", {**chat, "max_tokens": 32, "n": rng.randint(1, 4),
                                                "temperature": 0.8, "seed": rng.randrange(1000)}, False
    if roll < 0.6:
        prompt = "Score this sentence, please. " * rng.randint(1, 20)
        return "echo-logprobs", "/v1/completions", {"prompt": prompt, "echo": True, "logprobs": 3,
                                                    "max_tokens": rng.choice([0, 8])}, False
    if roll < 0.7:
        grammar = rng.choice([{"guided_json": SCHEMA}, {"guided_regex": "[a-z]{3,12}( [a-z]{2,8}){2}"}])
        return "grammar", "/v1/completions", {"prompt": "A person:", "max_tokens": 40, **grammar}, False
    if roll < 0.8:
        return "completion-stream", "/v1/completions", {"prompt": "Write a list:", "max_tokens": 64,
                                                        "stream": True, "n": rng.randint(1, 2)}, True
    path, body = rng.choice(hostile)
    return "fuzz", path, body, False


async def one(client: httpx.AsyncClient, url: str, req, rng: random.Random, out: dict) -> None:
    kind, path, body, stream = req
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    out["sent"][kind] += 1
    try:
        if not stream:
            r = await client.post(url + path, headers={"content-type": "application/json"}, **kw)
            out["status"][r.status_code] += 1
            if r.status_code >= 500:
                out["fives"].append((kind, r.status_code, r.text[:200]))
            if kind == "greedy" and r.status_code == 200:
                out["greedy"].append((path, json.dumps(body, sort_keys=True), answer_text(r.json())))
            return
        drop_after = rng.randint(1, 6) if rng.random() < 0.1 else None
        async with client.stream("POST", url + path, **kw) as r:
            out["status"][r.status_code] += 1
            out["streams"] += r.status_code == 200
            lines = 0
            async for line in r.aiter_lines():
                if line.startswith("data: {\"error\""):
                    out["stream_errors"].append(line[:200])
                if line == "data: [DONE]":
                    out["streams_done"] += 1
                lines += 1
                if drop_after is not None and lines >= drop_after:
                    out["dropped"] += 1
                    break
    except httpx.HTTPError as exc:
        out["transport_errors"].append(f"{kind}: {type(exc).__name__}: {exc}"[:200])


def answer_text(body: dict) -> str:
    choice = body["choices"][0]
    return choice["text"] if "text" in choice else choice["message"]["content"]


def server_rss(proc: subprocess.Popen) -> int:
    """Bytes resident in the server and its children (Ray's processes too)."""
    try:
        root = psutil.Process(proc.pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
    except psutil.Error:
        return 0


def kill_one_replica(proc: subprocess.Popen) -> str | None:
    """SIGKILL one engine replica process of our own Ray cluster (a child of the server we started)."""
    for p in psutil.Process(proc.pid).children(recursive=True):
        try:
            if "SpecdecEngine" in " ".join(p.cmdline()):
                p.kill()
                return f"pid {p.pid}"
        except psutil.Error:
            continue
    return None


async def load(args, url: str, proc: subprocess.Popen) -> dict:
    out = {"sent": Counter(), "status": Counter(), "fives": [], "greedy": [], "stream_errors": [],
           "transport_errors": [], "streams": 0, "streams_done": 0, "dropped": 0, "rss_peak": 0, "killed": None}
    hostile = list(hostile_cases(huge_string=1 << 16))
    deadline = time.monotonic() + args.seconds
    half = time.monotonic() + args.seconds / 2

    async def worker(i: int) -> None:
        rng = random.Random(i)
        async with httpx.AsyncClient(timeout=600) as client:
            while time.monotonic() < deadline:
                await one(client, url, mix(rng, hostile), rng, out)

    async def watch() -> None:
        while time.monotonic() < deadline:
            out["rss_peak"] = max(out["rss_peak"], server_rss(proc))
            if args.ray and out["killed"] is None and time.monotonic() > half:
                out["killed"] = kill_one_replica(proc) or "none found"
            await asyncio.sleep(1)

    await asyncio.gather(watch(), *(worker(i) for i in range(args.clients)))
    return out


def quiet_run(url: str) -> dict[str, str]:
    texts = {}
    for path, body in GREEDY:
        r = httpx.post(url + path, json=body, timeout=600)
        r.raise_for_status()
        texts[json.dumps(body, sort_keys=True)] = answer_text(r.json())
    return texts


def settle(url: str, timeout: float = 300) -> dict:
    """Wait until the server runs and queues nothing; its last /health."""
    deadline = time.time() + timeout
    health = {}
    while time.time() < deadline:
        health = httpx.get(url + "/health", timeout=30).json()
        if health.get("running_sequences", 1) == 0 and health.get("waiting_requests", 1) == 0:
            break
        time.sleep(1)
    return health


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=300)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--batch", type=int, default=8, help="--max-batch-size of the server")
    p.add_argument("--ray", action="store_true")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--max-rss-mib", type=float, default=None,
                   help="the bound the server's peak RSS (its processes together) must keep; default 2048 MiB, "
                        "under --ray 2048 MiB per replica and 2048 for Ray's own processes")
    p.add_argument("--log", default="/tmp/specdec-soak-server.log")
    args = p.parse_args()
    if args.max_rss_mib is None:
        args.max_rss_mib = 2048 * (args.replicas + 1 if args.ray else 1)
    proc, url = start_server(args)
    try:
        reference = quiet_run(url)
        rss_idle = server_rss(proc)
        t0 = time.monotonic()
        out = asyncio.run(load(args, url, proc))
        wall = time.monotonic() - t0
        health = settle(url)
        still = httpx.post(url + "/v1/completions", json=GREEDY[0][1], timeout=600)
        mismatches = [(body, text) for _, body, text in out["greedy"] if reference[body] != text]
        sent = sum(out["sent"].values())
        answered = sum(out["status"].values())
        figures = {
            "seconds": round(wall, 1), "clients": args.clients, "ray": args.ray, "requests": sent,
            "answered": answered, "by_kind": dict(out["sent"]), "status": {str(k): v for k, v in out["status"].items()},
            "fives": out["fives"][:5], "num_fives": len(out["fives"]), "stream_errors": out["stream_errors"][:3],
            "num_stream_errors": len(out["stream_errors"]), "transport_errors": out["transport_errors"][:3],
            "num_transport_errors": len(out["transport_errors"]), "streams": out["streams"],
            "streams_done": out["streams_done"],
            "dropped_streams": out["dropped"], "greedy_checked": len(out["greedy"]),
            "greedy_mismatches": len(mismatches), "rss_idle_mib": round(rss_idle / 2**20),
            "rss_peak_mib": round(out["rss_peak"] / 2**20), "rss_bound_mib": args.max_rss_mib,
            "killed_replica": out["killed"],
            "idle_after": {k: health.get(k) for k in ("running_sequences", "waiting_requests", "free_slots")},
            "answering_after": still.status_code,
        }
        print(json.dumps(figures, indent=1))
        ok = (not out["fives"] or args.ray) and answered == sent - len(out["transport_errors"]) \
            and not mismatches and out["rss_peak"] <= args.max_rss_mib * 2**20 and still.status_code == 200 \
            and health.get("running_sequences") == 0 and (args.ray or not out["transport_errors"]) \
            and out["streams_done"] + out["dropped"] + len(out["stream_errors"]) >= out["streams"]
        print("soak:", "ok" if ok else "FAILED", file=sys.stderr)
        return 0 if ok else 1
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """End the server we started and every process it started (Ray's), by their ids."""
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        children = []
    os.killpg(proc.pid, signal.SIGTERM)  # the server's own process group (start_new_session)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    for child in children:  # Ray's processes may have left the group
        try:
            child.wait(10)
        except psutil.TimeoutExpired:
            child.kill()
        except psutil.Error:
            pass


if __name__ == "__main__":
    sys.exit(main())
