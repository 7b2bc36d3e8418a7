"""Forwarding a request as data through the server app in-process (what each Ray replica does)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from specdec.config import SamplingParams
from specdec.llm import LLM
from specdec.server.app import create_app
from specdec.server.ray.forward import ForwardedRequest, ResponsePart, call_asgi

JSON = [("content-type", "application/json")]


@pytest.fixture(scope="module")
def served(tiny_llama):
    llm = LLM(str(tiny_llama), spec="ngram", max_model_len=256, max_num_seqs=4, plan_drafts=False)
    app = create_app(llm, api_key="k")
    scheduler = app.state.specdec.scheduler
    scheduler.start()  # what the app's lifespan does under uvicorn
    yield llm, app, scheduler
    scheduler.stop()


def post(path: str, body, auth: bool = True) -> ForwardedRequest:
    headers = JSON + ([("authorization", "Bearer k")] if auth else [])
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return ForwardedRequest("POST", path, headers=headers, body=data)


async def collect(app, request: ForwardedRequest) -> list[ResponsePart]:
    return [part async for part in call_asgi(app, request)]


def test_json_response_is_one_part(served):
    llm, app, _ = served
    want = llm.generate("Hello there", SamplingParams(max_new_tokens=8))[0].text
    parts = asyncio.run(collect(app, post("/v1/completions", {"prompt": "Hello there", "max_tokens": 8,
                                                              "temperature": 0})))
    assert len(parts) == 1 and parts[0].status == 200 and not parts[0].more
    assert ("content-type", "application/json") in parts[0].headers
    assert json.loads(parts[0].body)["choices"][0]["text"] == want


def test_stream_arrives_in_parts(served):
    _, app, _ = served
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "stream": True}
    parts = asyncio.run(collect(app, post("/v1/chat/completions", body)))
    assert parts[0].status == 200 and dict(parts[0].headers)["content-type"].startswith("text/event-stream")
    assert all(p.status is None for p in parts[1:]) and not parts[-1].more
    text = b"".join(p.body for p in parts).decode()
    assert text.rstrip().endswith("data: [DONE]") and text.count("data: ") >= 3


@pytest.mark.parametrize("request_, status", [
    (post("/v1/completions", b"{not json"), 400),
    (post("/v1/completions", {"prompt": "hi"}, auth=False), 401),
    (post("/v1/completions", {"prompt": "hi", "model": "other"}), 404),
    (ForwardedRequest("GET", "/nowhere"), 404),
])
def test_errors_come_back_as_openai_bodies(served, request_, status):
    _, app, _ = served
    parts = asyncio.run(collect(app, request_))
    assert parts[0].status == status and set(json.loads(parts[0].body)["error"]) >= {"message", "type", "code"}


def test_closing_early_cancels_the_generation(served):
    _, app, scheduler = served
    body = {"prompt": "Go on:", "max_tokens": 240, "ignore_eos": True, "stream": True}

    async def first_part_then_leave() -> ResponsePart:
        parts = call_asgi(app, post("/v1/completions", body))
        first = await anext(parts)
        await parts.aclose()
        return first

    assert asyncio.run(first_part_then_leave()).status == 200
    deadline = time.time() + 10
    while scheduler.snapshot()["running_sequences"]:
        assert time.time() < deadline, "the cancelled request still holds its slot"
        time.sleep(0.02)


def test_app_failing_before_a_response_raises():
    async def broken(scope, receive, send):
        raise ValueError("no response")

    with pytest.raises(ValueError, match="no response"):
        asyncio.run(collect(broken, ForwardedRequest("GET", "/")))

    async def silent(scope, receive, send):
        return None

    with pytest.raises(RuntimeError, match="without a complete response"):
        asyncio.run(collect(silent, ForwardedRequest("GET", "/")))
