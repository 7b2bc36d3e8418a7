"""Serving benchmark: throughput and latency of `specdec serve` at several concurrencies, with and
without speculation, beside llama-server where asked, on chat prompts (code edits by default). Prints a
markdown table.

    .venv/bin/python scripts/serve_concurrency.py                      # default model, ngram vs none
    .venv/bin/python scripts/serve_concurrency.py --concurrency 1 4 16 32 --methods none suffix
    .venv/bin/python scripts/serve_concurrency.py --methods none ngram \
        "ngram-fixed-K=--spec-type ngram --spec-batch-draft-tokens 1024"   # without the batch-aware budget
    .venv/bin/python scripts/serve_concurrency.py --model qwen2.5-coder-1.5b --methods none adaptive \
        --llama-server plain ngram-mod --workload mt_bench --concurrency 1 4 --requests 4 8

For each method it starts one server (a subprocess on a free 127.0.0.1 port),
warms it up, then for each concurrency C sends a fixed list of requests through
C concurrent streaming clients. Requests are greedy, so every method must return
the same completions; the script counts token ids from the server's usage
(never re-tokenised text) and reports any completion that differs from the
baseline's.

Columns: tok/s = completion tokens of the level / wall time of the level;
TTFT = send to first content chunk (p50/p90/p99 over the level's requests, and
p50 against the baseline's: speculation must not delay first tokens); ITL =
per-token inter-token latency: the gap between two content chunks divided over
the tokens the later one carries (exact counts from vLLM-style
``continuous_usage_stats``), p50/p99 over all tokens of the level.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx

from specdec.bench.llama_cpp import MODES, LlamaServer, ServerSettings, find_llama_server
from specdec.bench.workloads import load_workload
from specdec.catalog import DEFAULT_MODEL
from specdec.model.weights import gguf_file


def first_turns(workload: str, count: int) -> list[list[dict]]:
    """``count`` chat requests: the workload's first turns in order, from the start again if it has fewer."""
    conversations = load_workload(workload).conversations
    return [conversations[i % len(conversations)].messages(0, []) for i in range(count)]


@dataclass
class Result:
    ttft: float
    itl: list[float] = field(default_factory=list)  # one per token after the first
    tokens: int = 0
    text: str = ""


async def one_request(client: httpx.AsyncClient, url: str, messages: list[dict], max_tokens: int) -> Result:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    t0 = time.perf_counter()
    result, last_t, last_tokens, parts, final = None, None, 0, [], None
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            now = time.perf_counter()
            content = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
            parts.append(content or "")
            if chunk["choices"] and chunk.get("usage"):  # continuous usage: exact tokens so far
                tokens = chunk["usage"]["completion_tokens"]
            elif chunk.get("usage"):  # the closing usage chunk (no choices)
                final = chunk["usage"]["completion_tokens"]
                tokens = last_tokens
            else:  # no per-chunk usage (llama-server): one token a content chunk
                tokens = last_tokens + 1 if content else last_tokens
            if tokens > last_tokens:
                if result is None:
                    result = Result(ttft=now - t0)
                elif last_t is not None:
                    gap = (now - last_t) / (tokens - last_tokens)
                    result.itl.extend([gap] * (tokens - last_tokens))
                last_t, last_tokens = now, tokens
    assert result is not None, "no tokens streamed"
    # the closing usage is the count (llama-server's counts its end-of-generation token, which streams no text)
    result.tokens, result.text = final if final is not None else last_tokens, "".join(parts)
    return result


async def run_level(url: str, prompts: list[list[dict]], concurrency: int, max_tokens: int,
                    ) -> tuple[list[Result], float]:
    queue: asyncio.Queue[tuple[int, list[dict]]] = asyncio.Queue()
    for item in enumerate(prompts):
        queue.put_nowait(item)
    results: list[Result | None] = [None] * len(prompts)
    limits = httpx.Limits(max_connections=concurrency + 4)

    async with httpx.AsyncClient(timeout=httpx.Timeout(1800.0), limits=limits) as client:
        async def worker():
            while not queue.empty():
                i, prompt = queue.get_nowait()
                results[i] = await one_request(client, url, prompt, max_tokens)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return [r for r in results if r is not None], wall


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def method_flags(method: str) -> tuple[str, list[str]]:
    """'ngram' -> ('ngram', ['--spec-type', 'ngram']); 'label=--flag value ...' -> (label, flags)."""
    if "=" in method:
        label, flags = method.split("=", 1)
        return label, flags.split()
    return method, ["--spec-type", method]


def start_server(args, flags: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "specdec.cli", "serve", "--port", str(port), *flags,
           "--max-batch-size", str(max(args.concurrency)), "--max-model-len", str(args.max_model_len),
           "--max-queue", "1024", *args.server_args]
    if args.model:
        cmd += ["--model", args.model]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("server did not start")


@contextlib.contextmanager
def specdec_server(args, flags: list[str]) -> Iterator[tuple[str, Callable[[], dict[str, float]]]]:
    """A `specdec serve` subprocess: (its URL, a reader of its spec-decode counters)."""
    proc, url = start_server(args, flags)
    try:
        yield url, lambda: spec_counters(httpx.get(url + "/metrics").text)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def llama_server(args, mode: str) -> Iterator[tuple[str, Callable[[], dict[str, float]]]]:
    """llama-server on the same GGUF file with -np = the highest concurrency, each slot --max-model-len long."""
    binary, gguf = find_llama_server(), gguf_file(args.model or DEFAULT_MODEL)
    if binary is None or gguf is None:
        raise SystemExit("--llama-server needs llama-server (bash scripts/build_llama_cpp.sh) and a GGUF model")
    parallel = max(args.concurrency)
    settings = ServerSettings(binary, gguf, mode, threads=os.cpu_count() or 1, n_ctx=args.max_model_len * parallel,
                              parallel=parallel)
    with LlamaServer(settings) as server:
        try:
            yield f"http://127.0.0.1:{server.port}", dict
        except Exception:
            print(f"[bench] llama-server {mode}'s log ends:\n{server.log_tail()}", file=sys.stderr, flush=True)
            raise


def bench_method(label: str, server, args, prompts_by_level: dict[int, list[list[dict]]]) -> dict[int, dict]:
    with server as (url, counters):
        asyncio.run(run_level(url, prompts_by_level[min(prompts_by_level)][:1], 1, 8))  # warm-up
        rows = {}
        for c, prompts in prompts_by_level.items():
            results, wall = asyncio.run(run_level(url, prompts, c, args.max_tokens))
            ttft = [r.ttft for r in results]
            itl = [x for r in results for x in r.itl]
            tokens = sum(r.tokens for r in results)
            rows[c] = dict(requests=len(results), tokens=tokens, wall=wall, tok_s=tokens / wall,
                           ttft50=pct(ttft, 50), ttft90=pct(ttft, 90), ttft99=pct(ttft, 99),
                           itl50=pct(itl, 50), itl99=pct(itl, 99), texts=[r.text for r in results])
            print(f"[bench] {label:>6} c={c:<3} {tokens} tokens in {wall:.1f} s = {tokens / wall:.1f} tok/s",
                  file=sys.stderr, flush=True)
        rows["metrics"] = counters()
        return rows


def spec_counters(page: str) -> dict[str, float]:
    """Unlabelled spec-decode counters; a Ray endpoint's per-replica series (``{replica="..."}``) summed."""
    out: dict[str, float] = {}
    for line in page.splitlines():
        if not line.startswith("specdec:spec_decode_num_"):
            continue
        name, _, labels = line.split()[0].partition("{")
        if not labels or labels.startswith('replica="') and "," not in labels:
            out[name] = out.get(name, 0.0) + float(line.split()[-1])
    return out


def table(results: dict[str, dict], baseline: str) -> str:
    head = (f"| method | concurrency | requests | tokens | tok/s | vs {baseline} | TTFT p50 (s) | TTFT p90 (s) "
            f"| TTFT p99 (s) | TTFT p50 vs {baseline} | ITL p50 (ms) | ITL p99 (ms) | same text as {baseline} |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for method, rows in results.items():
        for c, row in rows.items():
            if c == "metrics":
                continue
            base = results[baseline][c]
            same = sum(a == b for a, b in zip(row["texts"], base["texts"], strict=True))
            lines.append(
                f"| {method} | {c} | {row['requests']} | {row['tokens']} | {row['tok_s']:.1f} | "
                f"{row['tok_s'] / base['tok_s']:.2f}x | {row['ttft50']:.2f} | {row['ttft90']:.2f} | "
                f"{row['ttft99']:.2f} | {row['ttft50'] / base['ttft50']:.2f}x | "
                f"{row['itl50'] * 1000:.0f} | {row['itl99'] * 1000:.0f} | {same}/{row['requests']} |"
            )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--methods", nargs="+", default=["none", "ngram"],
                   help="servers to compare, the first is the baseline: a --spec-type name, or "
                        "'label=<serve flags>'")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--requests", type=int, nargs="+", default=None,
                   help="requests per concurrency level (default: max(4, C) each)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--llama-server", nargs="+", default=[], choices=MODES, metavar="MODE",
                   help=f"also llama-server on the same GGUF, plain or a --spec-type ({', '.join(MODES)})")
    p.add_argument("--workload", default="code_edit", help="the bench workload whose first turns are the prompts")
    p.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                   help="extra `specdec serve` flags for both servers (must come last)")
    args = p.parse_args()
    counts = args.requests or [max(4, c) for c in args.concurrency]
    if len(counts) != len(args.concurrency):
        p.error("--requests needs one count per --concurrency level")
    prompts = first_turns(args.workload, max(counts))
    prompts_by_level = {c: prompts[:n] for c, n in zip(args.concurrency, counts, strict=True)}
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    results = {}
    servers = [(label, specdec_server(args, flags)) for label, flags in map(method_flags, args.methods)]
    servers += [(f"llama-server {mode}", llama_server(args, mode)) for mode in args.llama_server]
    for label, server in servers:
        try:
            results[label] = bench_method(label, server, args, prompts_by_level)
        except (RuntimeError, httpx.HTTPError) as exc:  # one server's failure: the others' rows still print
            print(f"[bench] {label} failed: {exc!r}", file=sys.stderr, flush=True)
    baseline = method_flags(args.methods[0])[0]
    print(table(results, baseline))
    print()
    for label, rows in results.items():
        m = rows["metrics"]
        if not m:  # llama-server: no spec-decode counters read
            continue
        drafted = m.get("specdec:spec_decode_num_draft_tokens_total", 0)
        accepted = m.get("specdec:spec_decode_num_accepted_tokens_total", 0)
        print(f"{label}: {drafted:.0f} drafted, {accepted:.0f} accepted "
              f"({accepted / drafted if drafted else 0:.2f} acceptance) over the whole run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
