"""The OpenAI-compatible server, end to end: a real uvicorn server on 127.0.0.1 and the official client.

Most tests share one server on the tiny random Llama (speculation: ngram, 16
slots); the server's greedy output is compared with offline ``LLM.generate``
without speculation, so these tests also check that batching and speculation
change nothing. One test runs the real default model.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from specdec.budget import DraftBudget
from specdec.cli.main import build_parser
from specdec.config import SamplingParams, SpecConfig, SpecType
from specdec.drafters.ngram_cache import load_counts
from specdec.errors import UsageError
from specdec.llm import LLM
from specdec.server.app import create_app
from specdec.server.cli import serve_config, spec_from_vllm_config

API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MAX_LEN = 512


@contextlib.contextmanager
def running_server(app):
    """Serve ``app`` with uvicorn on a free 127.0.0.1 port in a thread; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        assert thread.is_alive() and time.time() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def serve_like_plain(llm, prompt: str, want: str, max_tokens: int = 16) -> None:
    """Serve ``llm`` over real HTTP: a greedy completion of ``prompt`` is ``want`` (plain decoding's
    text) and a seeded sampled one is answered (a drafter's tests of the server edge)."""
    from specdec.server.app import create_app

    with running_server(create_app(llm)) as url:
        body = {"model": llm.model_name, "prompt": prompt, "max_tokens": max_tokens}
        r = httpx.post(url + "/v1/completions", json=body | {"temperature": 0}, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == want
        r = httpx.post(url + "/v1/completions", json=body | {"temperature": 1.0, "seed": 3}, timeout=120)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0, r.text


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    """(base URL, served LLM, offline reference LLM without speculation)."""
    llm = LLM(str(tiny_llama), spec="ngram", max_model_len=MAX_LEN, max_num_seqs=16, plan_drafts=False)
    offline = LLM(str(tiny_llama), max_model_len=MAX_LEN, spec="none")
    with running_server(create_app(llm, api_key=API_KEY)) as url:
        yield url, llm, offline


@pytest.fixture(scope="module")
def client(tiny):
    return openai.OpenAI(base_url=tiny[0] + "/v1", api_key=API_KEY, max_retries=0)


def greedy(offline: LLM, prompt, max_tokens: int) -> str:
    return offline.generate(prompt, SamplingParams(max_new_tokens=max_tokens))[0].text


def health(url: str) -> dict:
    return httpx.get(url + "/health", headers=AUTH).json()  # with an API key, /health takes it too


def metric_values(url: str, auth: dict = AUTH) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", headers=auth).text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def slow_down(monkeypatch, llm: LLM, seconds: float = 0.01) -> None:
    """Make each engine step last a while, so a long request is surely still running when we act."""
    real_step = llm.engine.step

    def step(seqs, draft_budget=None):
        time.sleep(seconds)
        return real_step(seqs, draft_budget)

    monkeypatch.setattr(llm.engine, "step", step)


def wait_for(check, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while not check():
        assert time.time() < deadline, "condition not reached in time"
        time.sleep(0.05)


# -- happy paths -------------------------------------------------------------------------------
def test_completions_match_offline(tiny, client):
    url, llm, offline = tiny
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):"
    ref = offline.generate(prompt, SamplingParams(max_new_tokens=24))[0].choices[0]
    want = ref.text
    r = client.completions.create(model=llm.model_name, prompt=prompt, max_tokens=24, temperature=0)
    assert r.choices[0].text == want
    assert r.object == "text_completion" and r.choices[0].finish_reason == ref.finish_reason
    ids = llm.encode(prompt)
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    spec = r.model_extra["spec_decode"]
    assert set(spec) >= {"drafted", "accepted", "acceptance_rate", "mean_accepted_len"}
    assert 0 <= spec["accepted"] <= spec["drafted"]  # drafting on the server: test_default_model_greedy_with_ngram
    assert spec["acceptance_rate"] == (round(spec["accepted"] / spec["drafted"], 4) if spec["drafted"] else 0.0)
    # one token per decoding pass, more exactly when drafts were kept
    assert (spec["mean_accepted_len"] > 1.0) == (spec["accepted"] > 0) and spec["mean_accepted_len"] >= 1.0
    stream = client.completions.create(model=llm.model_name, prompt=prompt, max_tokens=24, temperature=0,
                                       stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want
    assert chunks[-1].choices[0].finish_reason == ref.finish_reason
    assert "spec_decode" in chunks[-1].model_extra


def test_chat_matches_offline(tiny, client):
    url, llm, offline = tiny
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    want = greedy(offline, llm.chat_prompt(messages), 16)
    r = client.chat.completions.create(model=llm.model_name, messages=messages, max_tokens=16, temperature=0)
    assert r.choices[0].message.content == want and r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens == 16 or r.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(model=llm.model_name, messages=messages, max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens
    # the same greedy request, alone on the server, with a deterministic drafter: the same drafts
    assert chunks[-1].model_extra["spec_decode"]["drafted"] == r.model_extra["spec_decode"]["drafted"]


# -- the sampling API under speculation: logprobs, echo, penalties, structured output, tools ---------
def test_completion_logprobs_equal_offline_streamed_and_not(tiny, client):
    url, llm, offline = tiny
    prompt = "one two three one two three one two"
    want = offline.generate(prompt, SamplingParams(max_new_tokens=12, logprobs=3))[0].choices[0]
    r = client.completions.create(model=llm.model_name, prompt=prompt, max_tokens=12, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert lp.token_logprobs == [t.logprob for t in want.logprobs]  # exact: speculation changes no bit
    assert len(lp.tokens) == len(want.token_ids) and all(len(top) >= 3 for top in lp.top_logprobs)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    chunks = list(client.completions.create(model=llm.model_name, prompt=prompt, max_tokens=12, temperature=0,
                                            logprobs=3, stream=True))
    streamed = [x for c in chunks if c.choices and c.choices[0].logprobs for x in c.choices[0].logprobs.token_logprobs]
    assert streamed == lp.token_logprobs


def test_echo_returns_prompt_with_its_logprobs(tiny, client):
    url, llm, offline = tiny
    prompt = "alpha beta gamma"
    ids = llm.encode(prompt)
    r = client.completions.create(model=llm.model_name, prompt=prompt, max_tokens=4, temperature=0, echo=True,
                                  logprobs=1)
    choice = r.choices[0]
    assert choice.text.startswith(offline.tokenizer.decode(ids, skip_special_tokens=True))
    assert len(choice.logprobs.tokens) == len(ids) + r.usage.completion_tokens
    assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.top_logprobs[0] is None
    want = offline.generate(ids, SamplingParams(max_new_tokens=4, prompt_logprobs=1))[0].prompt_logprobs
    assert choice.logprobs.token_logprobs[1 : len(ids)] == [t.logprob for t in want[1:]]
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=llm.model_name, prompt=prompt, max_tokens=4, temperature=0, echo=True, stream=True) if c.choices)
    assert streamed == choice.text


def test_chat_logprobs_and_penalties_equal_offline(tiny, client):
    url, llm, offline = tiny
    messages = [{"role": "user", "content": "Count: 1 2 3 1 2 3 1 2 3"}]
    params = SamplingParams(max_new_tokens=10, logprobs=2, presence_penalty=0.5, frequency_penalty=0.5,
                            logit_bias={300: 5.0})
    want = offline.generate(llm.chat_prompt(messages), params)[0].choices[0]
    kw = dict(model=llm.model_name, messages=messages, max_tokens=10, temperature=0, logprobs=True, top_logprobs=2,
              presence_penalty=0.5, frequency_penalty=0.5, logit_bias={"300": 5.0})
    r = client.chat.completions.create(**kw)
    content = r.choices[0].logprobs.content
    assert r.choices[0].message.content == want.text
    assert [c.logprob for c in content] == [t.logprob for t in want.logprobs]
    assert all(len(c.top_logprobs) == 2 and c.bytes == list(c.token.encode()) for c in content)
    chunks = list(client.chat.completions.create(**kw, stream=True))
    assert [c.logprob for ch in chunks if ch.choices and ch.choices[0].logprobs
            for c in ch.choices[0].logprobs.content] == [c.logprob for c in content]


SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                           "rank": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["city", "rank"], "additionalProperties": False}


def test_response_format_json_schema_parses_and_equals_offline(tiny, client):
    import jsonschema

    from specdec.config import StructuredKind, StructuredOutput

    url, llm, offline = tiny
    messages = [{"role": "user", "content": "A city and its rank as JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
    r = client.chat.completions.create(model=llm.model_name, messages=messages, max_tokens=60, temperature=0,
                                       response_format=fmt)
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    structured = StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(SCHEMA))
    want = offline.generate(llm.chat_prompt(messages), SamplingParams(max_new_tokens=60, structured=structured))[0]
    assert r.choices[0].message.content == want.text
    obj = client.chat.completions.create(model=llm.model_name, messages=messages, max_tokens=60, temperature=0.8,
                                         seed=1, response_format={"type": "json_object"})
    assert obj.choices[0].message.content.startswith("{")  # any object: the random model may run past 60 tokens
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].message.content), dict)
    else:
        assert obj.choices[0].finish_reason == "length" and obj.usage.completion_tokens == 60
    r = client.completions.create(model=llm.model_name, prompt="Pick:", max_tokens=8, temperature=0,
                                  extra_body={"guided_choice": ["left", "right"]})
    assert r.choices[0].text in ("left", "right")


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "maxLength": 12}}, "required": ["city"],
                                                "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "get_time"}}


def test_forced_tool_calls(tiny, client):
    """Streamed piece by piece: tests/test_server_sampling.py."""
    url, llm, _ = tiny
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    for choice, name in (("required", None), ({"type": "function", "function": {"name": "get_weather"}},
                                               "get_weather")):
        r = client.chat.completions.create(model=llm.model_name, messages=messages, max_tokens=60, temperature=0,
                                           tools=[WEATHER, CLOCK], tool_choice=choice)
        assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
        calls = r.choices[0].message.tool_calls
        assert len(calls) == 1 and calls[0].id.startswith("call_")
        assert calls[0].function.name in ({name} if name else {"get_weather", "get_time"})
        args = json.loads(calls[0].function.arguments)
        if calls[0].function.name == "get_weather":
            assert isinstance(args["city"], str)
    # The call goes back into the conversation with its result.
    follow = client.chat.completions.create(model=llm.model_name, max_tokens=4, temperature=0, tools=[WEATHER],
                                            messages=[*messages, {"role": "assistant", "tool_calls": [
                                                {"id": "call_1", "type": "function", "function": {
                                                    "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                                                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])
    assert follow.choices[0].finish_reason in ("length", "stop", "tool_calls")
    assert follow.choices[0].finish_reason != "length" or follow.usage.completion_tokens == 4


def test_parse_tool_calls_formats():
    from specdec.server.protocol import Tool
    from specdec.server.tools import ToolReply, parse_tool_calls

    tools = [Tool.model_validate(WEATHER)]
    assert parse_tool_calls('{"name": "get_weather", "arguments": {"city": "Oslo"}}', tools)[0].function.name \
        == "get_weather"
    wrapped = parse_tool_calls('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
                               tools)
    assert json.loads(wrapped[0].function.arguments) == {"city": "Oslo"}
    assert parse_tool_calls("It is sunny.", tools) == []
    assert parse_tool_calls('{"name": "other", "arguments": {}}', tools) == []
    # A reply whose "name" is not a string is plain content, not a crash (it was a TypeError: unhashable list).
    for text in ('{"name": ["get_weather"]}', '[{"name": {"a": 1}, "arguments": {}}]', '{"name": null}'):
        assert parse_tool_calls(text, tools) == []
        reply = ToolReply(tools, forced=False)
        assert reply.push(text, final=True).content == text and reply.finish_reason("stop") == "stop"


def test_raw_sse_ends_with_done(tiny):
    url, llm, _ = tiny
    body = {"model": llm.model_name, "prompt": "Hello", "max_tokens": 4, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, headers=AUTH) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[0][6:])["object"] == "text_completion"


def test_models_and_health(tiny, client):
    url, llm, _ = tiny
    assert [m.id for m in client.models.list().data] == [llm.model_name]
    h = health(url)
    assert h["status"] == "ok" and h["max_num_seqs"] == 16


def test_stop_strings(tiny, client):
    url, llm, offline = tiny
    full = greedy(offline, "Once upon a time", 12)
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    want = full[: full.find(stop)]
    r = client.completions.create(model=llm.model_name, prompt="Once upon a time", max_tokens=12, temperature=0,
                                  stop=[stop])
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model=llm.model_name, prompt="Once upon a time", max_tokens=12,
                                            temperature=0, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want


def test_n_choices_and_seed(tiny, client):
    url, llm, _ = tiny
    kwargs = dict(model=llm.model_name, prompt="Pick a word:", max_tokens=6, temperature=1.0, top_p=0.9, n=3,
                  seed=7)
    a = client.completions.create(**kwargs)
    b = client.completions.create(**kwargs)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]  # same seed, same batch: same samples
    assert len({c.text for c in a.choices}) > 1  # each choice's seed is its own (SamplingParams.for_choice)
    assert a.usage.completion_tokens == 18 or any(c.finish_reason == "stop" for c in a.choices)


def test_concurrent_clients(tiny, client):
    url, llm, offline = tiny
    prompts = [f"Client {i} says: the number {i * 7} is" for i in range(16)]
    wants = [greedy(offline, p, 12) for p in prompts]
    steps_before = health(url)["steps"]

    def one(i: int) -> str:
        if i % 2:
            chunks = client.completions.create(model=llm.model_name, prompt=prompts[i], max_tokens=12,
                                               temperature=0, stream=True)
            return "".join(c.choices[0].text for c in chunks if c.choices)
        return client.completions.create(model=llm.model_name, prompt=prompts[i], max_tokens=12,
                                         temperature=0).choices[0].text

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(one, range(16)))
    assert got == wants
    # Continuous batching: far fewer engine steps than the 16 x 12 tokens one at a time would need.
    assert health(url)["steps"] - steps_before < 16 * 12
    assert health(url)["running_sequences"] == 0


# -- cancellation, capacity, failures ---------------------------------------------------------
def test_disconnect_mid_stream_frees_slot(tiny, monkeypatch):
    url, llm, _ = tiny
    slow_down(monkeypatch, llm)
    aborted = metric_values(url)[("specdec:request_success_total", (("finished_reason", "abort"),))]
    body = {"model": llm.model_name, "prompt": "Go on forever:", "max_tokens": 480, "ignore_eos": True,
            "stream": True}
    with httpx.Client() as c, c.stream("POST", url + "/v1/completions", json=body, headers=AUTH) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: {") for line in got)
        assert health(url)["running_sequences"] == 1
    wait_for(lambda: health(url)["running_sequences"] == 0 and health(url)["free_slots"] == 16)
    wait_for(lambda: metric_values(url)[("specdec:request_success_total", (("finished_reason", "abort"),))]
             == aborted + 1)


def test_disconnect_non_streaming_frees_slot(tiny, monkeypatch):
    url, llm, _ = tiny
    slow_down(monkeypatch, llm)
    body = {"model": llm.model_name, "prompt": "Go on:", "max_tokens": 480, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/v1/completions", json=body, headers=AUTH, timeout=0.4)
    wait_for(lambda: health(url)["running_sequences"] == 0)


def test_queue_full_returns_429(tiny_llama, monkeypatch):
    llm = LLM(str(tiny_llama), max_model_len=MAX_LEN, max_num_seqs=1)
    slow_down(monkeypatch, llm)
    with running_server(create_app(llm, max_queue=0)) as url:
        long = {"prompt": "Hold the slot:", "max_tokens": 480, "ignore_eos": True, "stream": True}
        with httpx.Client() as c, c.stream("POST", url + "/v1/completions", json=long) as r:
            lines = r.iter_lines()  # keep a reference: a collected iterator closes the response
            assert next(lines).startswith("data: {")
            busy = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert busy.status_code == 429
            assert busy.json()["error"]["type"] == "rate_limit_error"
        wait_for(lambda: health(url)["free_slots"] == 1)
        ok = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_engine_failure_fails_only_that_request(tiny, monkeypatch):
    url, llm, offline = tiny
    marker = llm.encode(" BOOM")
    real_new_sequence = llm.new_sequence

    def boom(_output_ids):
        raise RuntimeError("injected stop-check failure")

    def new_sequence(prompt_ids, params, spec_types=None):
        seq = real_new_sequence(prompt_ids, params, spec_types)
        if prompt_ids[-len(marker):] == marker:
            seq.should_stop = boom
        return seq

    monkeypatch.setattr(llm, "new_sequence", new_sequence)
    good = {"prompt": "A fine request", "max_tokens": 20, "temperature": 0}
    with ThreadPoolExecutor(2) as pool:
        bad_f = pool.submit(httpx.post, url + "/v1/completions", json={"prompt": "A bad request BOOM",
                                                                        "max_tokens": 20}, headers=AUTH)
        good_f = pool.submit(httpx.post, url + "/v1/completions", json=good, headers=AUTH)
        bad, ok = bad_f.result(), good_f.result()
    assert bad.status_code == 500 and "injected" in bad.json()["error"]["message"]
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == greedy(offline, "A fine request", 20)

    # A failure of the shared target pass fails the requests in it; the loop keeps going.
    real_step, calls = llm.engine.step, []

    def step_once_broken(seqs, draft_budget=None):
        calls.append(len(seqs))
        if len(calls) == 1:
            raise RuntimeError("injected step failure")
        return real_step(seqs, draft_budget)

    monkeypatch.setattr(llm.engine, "step", step_once_broken)
    failed = httpx.post(url + "/v1/completions", json=good, headers=AUTH)
    assert failed.status_code == 500 and failed.json()["error"]["type"] == "server_error"
    again = httpx.post(url + "/v1/completions", json=good, headers=AUTH)
    assert again.status_code == 200 and again.json()["choices"][0]["text"] == ok.json()["choices"][0]["text"]
    assert health(url)["free_slots"] == 16


# -- bad input -------------------------------------------------------------------------------------
BAD_REQUESTS = [
    # (path, body (dict = JSON, bytes = raw), headers, status, code or None)
    ("/v1/completions", b"{not json", AUTH, 400, "invalid_value"),
    ("/v1/completions", b"[1, 2, 3]", AUTH, 400, "invalid_value"),
    ("/v1/completions", b"", AUTH, 400, "invalid_value"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "many"}, AUTH, 400, "invalid_value"),
    ("/v1/completions", {"prompt": 12.5}, AUTH, 400, "invalid_value"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -3}, AUTH, 400, "invalid_value"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, AUTH, 400, "invalid_value"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10**12}, AUTH, 400, "context_length_exceeded"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10**30}, AUTH, 400, "invalid_value"),
    ("/v1/completions", {"prompt": "hi", "temperature": -1}, AUTH, 400, "invalid_value"),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, AUTH, 400, "invalid_value"),
    ("/v1/completions", {"prompt": "hi", "n": 17, "max_tokens": 1}, AUTH, 400, None),
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}, AUTH, 400, "invalid_value"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"x": 1}}, AUTH, 400, "invalid_value"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"5": 101}}, AUTH, 400, "invalid_value"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"99999999": 1}}, AUTH, 400, None),
    ("/v1/completions", {"prompt": "hi", "presence_penalty": 3}, AUTH, 400, "invalid_value"),
    ("/v1/completions", {"prompt": "hi", "guided_regex": "a(("}, AUTH, 400, "invalid_grammar"),
    ("/v1/completions", {"prompt": "hi", "guided_grammar": "start: nothing_defined"}, AUTH, 400, "invalid_grammar"),
    ("/v1/completions", {"prompt": "hi", "guided_choice": []}, AUTH, 400, "invalid_value"),
    ("/v1/completions", {"prompt": "hi", "guided_regex": "a", "guided_choice": ["b"]}, AUTH, 400, "invalid_value"),
    ("/v1/completions", {"prompt": "hi", "suffix": "x"}, AUTH, 400, "invalid_value"),
    ("/v1/completions", {"prompt": "hi", "model": "gpt-9"}, AUTH, 404, "model_not_found"),
    ("/v1/completions", {"prompt": ""}, AUTH, 400, "empty_prompt"),
    ("/v1/completions", {"prompt": []}, AUTH, 400, "empty_prompt"),
    ("/v1/completions", {"prompt": [[]]}, AUTH, 400, "empty_prompt"),
    ("/v1/completions", {"prompt": [5, 10**9]}, AUTH, 400, None),
    ("/v1/completions", {"prompt": [-1]}, AUTH, 400, None),
    ("/v1/completions", {"prompt": "word " * 600, "max_tokens": 1}, AUTH, 400, "context_length_exceeded"),
    ("/v1/completions", {"prompt": "hi"}, {}, 401, "invalid_api_key"),
    ("/v1/completions", {"prompt": "hi"}, {"Authorization": "Bearer wrong"}, 401, "invalid_api_key"),
    ("/v1/chat/completions", {"messages": []}, AUTH, 400, "invalid_value"),
    ("/v1/chat/completions", {"messages": "hello"}, AUTH, 400, "invalid_value"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, AUTH, 400, "invalid_value"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, AUTH, 400,
     "invalid_value"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 30,
                              "logprobs": True}, AUTH, 400, "invalid_value"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
                                  "type": "object", "properties": 3}}}}, AUTH, 400, "invalid_grammar"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, AUTH, 400,
     "invalid_value"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "xml"}},
     AUTH, 400, "invalid_value"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}, AUTH, 400,
     "invalid_value"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function",
     "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}, AUTH, 400,
     "invalid_value"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "text": "x"}]}]},
     AUTH, 400, "invalid_value"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": "NaN"}, AUTH, 400,
     "invalid_value"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "model": 3}, AUTH, 400,
     "invalid_value"),
    ("/v1/nothing-here", {"prompt": "hi"}, AUTH, 404, 404),
    # "²".isdigit() but int("²") fails; a 20-digit id is outside the vocabulary
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"\u00b2": 1}}, AUTH, 400, "invalid_value"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"\u0661\u0662": 1}}, AUTH, 400, "invalid_value"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"9" * 20: 1}}, AUTH, 400, None),
    *[("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function",
       "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": function}}, AUTH, 400,
       "invalid_value") for function in (["f"], "f", 3, {"name": ["f"]}, {"name": {"f": 1}})],
    *[("/v1/completions", f'{{"prompt": "hi", "{field}": {value}}}'.encode(), AUTH, 400, "invalid_value")
      for field in ("temperature", "top_p", "min_p", "presence_penalty") for value in ("NaN", "Infinity", "-Infinity")],
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', AUTH, 400,
     "invalid_value"),
    ("/metrics", None, {}, 401, "invalid_api_key"),
    ("/health", None, {}, 401, "invalid_api_key"),
]


@pytest.mark.parametrize("path,body,headers,status,code", BAD_REQUESTS)
def test_bad_input_gets_openai_error(tiny, path, body, headers, status, code):
    url, llm, _ = tiny
    if body is None:
        r = httpx.get(url + path, headers=headers)
    elif isinstance(body, bytes):
        r = httpx.post(url + path, content=body, headers={**headers, "content-type": "application/json"})
    else:
        r = httpx.post(url + path, json=body, headers=headers)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)
    if code is not None:
        assert err["code"] == code
    # The server still answers.
    ok = httpx.post(url + "/v1/completions", json={"prompt": "still there?", "max_tokens": 2}, headers=AUTH)
    assert ok.status_code == 200


def test_chunked_upload_over_the_limit_gets_413(tiny):
    """The body limit counts what arrives, not only Content-Length: a chunked upload (no length) past
    16 MiB is refused with 413 (it reached the routes before); one under it is served."""
    url, llm, _ = tiny
    head, limit = b'{"prompt": "hi", "max_tokens": 2', 16 * 2**20

    def body(size: int):  # JSON padded with whitespace to ``size`` bytes; only its last chunk crosses the limit
        yield head
        padding = size - len(head) - 1
        while padding > 0:
            yield b" " * min(padding, 2**20)
            padding -= 2**20
        yield b"}"

    json_type = {**AUTH, "content-type": "application/json"}
    r = httpx.post(url + "/v1/completions", content=body(limit + 1), headers=json_type, timeout=60)
    assert "content-length" not in r.request.headers and r.request.headers["transfer-encoding"] == "chunked"
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text
    r = httpx.post(url + "/v1/completions", content=body(limit), headers=json_type, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text


def check_edge(url: str, auth: dict) -> None:
    """The edge of a server bound to 127.0.0.1 with an API key (``specdec serve`` and the ``--ray``
    ingress alike): DNS rebinding (a foreign Host) gets 400, another site's POST 403, the
    playground's own origin works, and /health, /metrics and /playground/config take the key."""
    port = url.rsplit(":", 1)[1]
    body = {"prompt": "hi", "max_tokens": 2}
    for path in ("/", "/playground/config", "/health"):
        assert httpx.get(url + path, headers={**auth, "host": f"attacker.example:{port}"}).status_code == 400
    r = httpx.post(url + "/v1/completions", json=body, headers={**auth, "host": f"attacker.example:{port}"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host"
    r = httpx.post(url + "/v1/completions", json=body, headers={**auth, "origin": "https://attacker.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "invalid_origin"
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):  # the playground, same-origin: it chats
        r = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 2}, headers={**auth, "host": host, "origin": f"http://{host}"}, timeout=120)
        assert r.status_code == 200, r.text
    assert httpx.get(url + "/", headers={"host": f"localhost:{port}"}).status_code == 200
    for path in ("/health", "/metrics", "/playground/config"):
        denied = httpx.get(url + path)
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key", path
        assert httpx.get(url + path, headers=auth).status_code == 200, path


def test_edge_hosts_origins_and_the_playground(tiny):
    check_edge(tiny[0], AUTH)


def test_openai_client_raises_typed_errors(tiny, client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="invalid json"):
        client.chat.completions.create(model=tiny[1].model_name, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=2, response_format={"type": "json_schema", "json_schema": {
                                           "name": "bad", "schema": {"type": "object", "required": "a"}}})
    bad_key = openai.OpenAI(base_url=tiny[0] + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.models.list()


def test_tokenize_and_detokenize(tiny, client):
    """/tokenize gives the ids a completion or chat request would run (the same count the usage reports),
    /detokenize their text back; bad input is a 400, a wrong model a 404, no key a 401."""
    url, llm, _ = tiny
    text = "def add(a, b):\n    return a + b"
    r = httpx.post(url + "/tokenize", json={"model": llm.model_name, "prompt": text, "return_token_strs": True},
                   headers=AUTH)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["tokens"] == llm.encode(text) and got["count"] == len(got["tokens"]) and got["max_model_len"] == MAX_LEN
    assert got["token_strs"] == llm.tokenizer.convert_ids_to_tokens(got["tokens"])
    done = client.completions.create(model=llm.model_name, prompt=text, max_tokens=1, temperature=0)
    assert done.usage.prompt_tokens == got["count"]
    bare = httpx.post(url + "/tokenize", json={"prompt": text, "add_special_tokens": False}, headers=AUTH).json()
    assert bare["tokens"] == llm.tokenizer(text, add_special_tokens=False).input_ids and "token_strs" not in bare

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add 2 and 3."}]
    chat = httpx.post(url + "/tokenize", json={"messages": messages}, headers=AUTH).json()
    assert chat["tokens"] == llm.chat_prompt(messages)
    done = client.chat.completions.create(model=llm.model_name, messages=messages, max_tokens=1, temperature=0)
    assert done.usage.prompt_tokens == chat["count"]
    open_turn = httpx.post(url + "/tokenize", json={"messages": messages, "add_generation_prompt": False},
                           headers=AUTH).json()
    assert open_turn["tokens"] == llm.chat_prompt(messages, add_generation_prompt=False) != chat["tokens"]

    back = httpx.post(url + "/detokenize", json={"model": llm.model_name, "tokens": bare["tokens"]}, headers=AUTH)
    assert back.status_code == 200 and back.json() == {"prompt": text}, back.text
    assert httpx.post(url + "/detokenize", json={"tokens": chat["tokens"]}, headers=AUTH).json()["prompt"] \
        == llm.tokenizer.decode(chat["tokens"])

    vocab = llm.runner.vocab_size
    for path, body, status, param in [
        ("/tokenize", {"prompt": text, "messages": messages}, 400, None),
        ("/tokenize", {}, 400, None),
        ("/tokenize", {"prompt": ""}, 400, "prompt"),
        ("/tokenize", {"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]}, 400,
         "messages.1.role"),
        ("/tokenize", {"prompt": text, "model": "no-such-model"}, 404, "model"),
        ("/detokenize", {"tokens": [1, vocab]}, 400, "tokens"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
        ("/detokenize", {"tokens": []}, 400, "tokens"),
        ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
    ]:
        r = httpx.post(url + path, json=body, headers=AUTH)
        assert r.status_code == status, (path, body, r.text)
        assert r.json()["error"]["message"] and r.json()["error"]["param"] == param, (path, body, r.text)
    for path in ("/tokenize", "/detokenize"):
        r = httpx.post(url + path, json={"prompt": text, "tokens": [1]}, headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_metrics_move(tiny, client):
    url, llm, _ = tiny
    before = metric_values(url)
    client.completions.create(model=llm.model_name, prompt="Count: 1 2 3 1 2 3 1 2", max_tokens=8, temperature=0)
    after = metric_values(url)

    def delta(name, labels=()):
        return after.get((name, labels), 0.0) - before.get((name, labels), 0.0)

    assert delta("specdec:request_success_total", (("finished_reason", "length"),)) \
        + delta("specdec:request_success_total", (("finished_reason", "stop"),)) == 1
    assert delta("specdec:generation_tokens_total") >= 1
    assert delta("specdec:prompt_tokens_total") == len(llm.encode("Count: 1 2 3 1 2 3 1 2"))
    assert delta("specdec:step_duration_seconds_count") >= 1
    assert delta("specdec:spec_decode_verify_seconds_total") > 0
    for name in ("specdec:spec_decode_num_drafts_total", "specdec:spec_decode_num_draft_tokens_total",
                 "specdec:spec_decode_num_accepted_tokens_total", "specdec:num_requests_waiting",
                 "specdec:num_requests_running", "specdec:running_batch_size", "specdec:kv_cache_free_slots",
                 "specdec:spec_decode_draft_seconds_total", "specdec:spec_decode_draft_budget"):
        assert (name, ()) in after, name
    assert delta("specdec:spec_decode_num_accepted_tokens_total") <= delta(
        "specdec:spec_decode_num_draft_tokens_total")


# -- token provenance -------------------------------------------------------------------------------
LOOPING_PROMPT = "héllo wörld 你好 🙂 x"  # the bigram tiny model loops on it: drafts get accepted


@pytest.fixture(scope="module")
def looping(tiny_model_factory):
    """(base URL, served LLM) of a bigram tiny model with the n-gram and suffix drafters."""
    llm = LLM(str(tiny_model_factory("llama", bigram=True)), spec="ngram,suffix", max_model_len=MAX_LEN,
              max_num_seqs=4, plan_drafts=False)  # drafts whatever the machine's load
    with running_server(create_app(llm, api_key=API_KEY)) as url:
        yield url, llm


def test_provenance_in_streamed_chunks(looping):
    url, llm = looping
    client = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
    messages = [{"role": "user", "content": LOOPING_PROMPT}]
    # The first answer teaches the suffix drafter this output: the streamed repeat drafts from it.
    want = client.chat.completions.create(model=llm.model_name, messages=messages, max_tokens=40, temperature=0,
                                          extra_body={"ignore_eos": True}).choices[0].message.content
    stream = client.chat.completions.create(
        model=llm.model_name, messages=messages, max_tokens=40, temperature=0,
        stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, "spec_decode_detail": True})
    chunks = list(stream)
    tokens, origins, steps = [], [], []
    for c in chunks[1:-1]:  # the role chunk and the usage chunk carry no tokens
        spec = c.model_extra["spec_decode"]
        assert len(spec["tokens"]) == len(spec["origins"])
        assert "".join(spec["tokens"]) == c.choices[0].delta.content
        tokens += spec["tokens"]
        origins += spec["origins"]
        steps += spec["steps"]
    final, usage = chunks[-2].model_extra["spec_decode"], chunks[-1]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "".join(tokens) == text == want
    assert len(origins) == usage.usage.completion_tokens == 40
    assert final["accepted"] > 0 and sum(o != "target" for o in origins) == final["accepted"]
    assert set(origins) <= {"ngram", "suffix", "target"}
    # Step detail: the accepted prefix of each drafting step is its drafter's; a rejected draft is shown.
    assert sum(s["drafted"] for s in steps) == final["drafted"]
    for s in steps:
        assert origins[s["start"] : s["start"] + s["accepted"]] == [s["drafter"]] * s["accepted"]
        assert len(s["rejected"]) == len(s["rejected_ids"]) <= s["drafted"] - s["accepted"]


def test_ngram_cache_and_ngram_mod_served_and_the_cache_saved_at_shutdown(tiny_model_factory, tmp_path):
    folder = str(tiny_model_factory("llama", bigram=True))
    cache_file = tmp_path / "lookup.bin"
    spec = SpecConfig(types=(SpecType.NGRAM_CACHE, SpecType.NGRAM_MOD), ngram_mod_n_match=2, ngram_mod_n_min=1,
                      ngram_cache_file=str(cache_file))
    llm = LLM(folder, spec=spec, max_model_len=MAX_LEN, max_num_seqs=2, plan_drafts=False)
    want = LLM(folder, max_model_len=MAX_LEN).generate(LOOPING_PROMPT, SamplingParams(max_new_tokens=30,
                                                                                      ignore_eos=True))[0]
    body = {"prompt": LOOPING_PROMPT, "max_tokens": 30, "temperature": 0, "ignore_eos": True}
    with running_server(create_app(llm)) as url:
        r = httpx.post(url + "/v1/completions", json=body).json()
        only_mod = httpx.post(url + "/v1/completions", json={**body, "spec_decode_drafter": "ngram-mod"}).json()
        assert not cache_file.exists()  # written when the server stops
    assert r["choices"][0]["text"] == only_mod["choices"][0]["text"] == want.text
    assert r["spec_decode"]["accepted"] > 0 and only_mod["spec_decode"]["accepted"] > 0
    saved = load_counts(cache_file, llm.runner.vocab_size)
    assert saved.get(tuple(want.token_ids[-4:-2])) is not None  # the output's n-grams were learned


def test_provenance_in_responses_and_drafter_choice(looping):
    url, llm = looping
    body = {"prompt": LOOPING_PROMPT, "max_tokens": 30, "temperature": 0, "ignore_eos": True, "n": 2}
    r = httpx.post(url + "/v1/completions", json=body, headers=AUTH).json()
    spec = r["spec_decode"]
    assert [c["index"] for c in spec["choices"]] == [0, 1]
    for choice, prov in zip(r["choices"], spec["choices"], strict=True):
        assert "".join(prov["tokens"]) == choice["text"] and len(prov["origins"]) == 30
        assert prov["steps"] is None  # detail only when asked
    assert sum(o != "target" for c in spec["choices"] for o in c["origins"]) == spec["accepted"] > 0

    # A request may pick among the loaded drafters, or none.
    plain = httpx.post(url + "/v1/completions", json={**body, "n": 1, "spec_decode_drafter": "none"},
                       headers=AUTH).json()
    assert plain["spec_decode"]["drafted"] == 0 and set(plain["spec_decode"]["choices"][0]["origins"]) == {"target"}
    assert plain["choices"][0]["text"] == r["choices"][0]["text"]  # lossless either way
    ngram = httpx.post(url + "/v1/completions", json={**body, "n": 1, "spec_decode_drafter": "ngram"},
                       headers=AUTH).json()
    assert set(ngram["spec_decode"]["choices"][0]["origins"]) <= {"ngram", "target"}
    for bad in ("draft-model", "bogus", "ngram,none"):
        err = httpx.post(url + "/v1/completions", json={**body, "spec_decode_drafter": bad}, headers=AUTH)
        assert err.status_code == 400 and err.json()["error"]["param"] == "spec_decode_drafter", bad


def test_adaptive_server_reports_drafters_windows_and_monitor(tiny_model_factory):
    """The default spec type: which drafter proposed each accepted token, the sliding windows and the
    monitor's pauses appear in the request's spec_decode object and in /metrics."""
    # min_acceptance 0, no draft planning: nothing is judged by wall-clock time (it failed once under load)
    llm = LLM(str(tiny_model_factory("llama", bigram=True)), spec=SpecConfig(types=(SpecType.ADAPTIVE,),
              min_acceptance=0.0), max_model_len=MAX_LEN, max_num_seqs=2, plan_drafts=False)
    assert llm.spec.types == (SpecType.ADAPTIVE,)
    body = {"prompt": LOOPING_PROMPT, "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    with running_server(create_app(llm)) as url:
        first = httpx.post(url + "/v1/completions", json=body).json()  # teaches the suffix drafter
        r = httpx.post(url + "/v1/completions", json=body).json()
        metrics = metric_values(url)
    assert r["choices"][0]["text"] == first["choices"][0]["text"]
    spec = r["spec_decode"]
    members = {"ngram", "ngram-map-k", "suffix"}
    assert set(spec["drafters"]) == members  # every member has a window, asked or not
    assert sum(d["accepted"] for d in spec["drafters"].values()) == spec["accepted"] > 0
    origins = spec["choices"][0]["origins"]
    for name, d in spec["drafters"].items():
        assert origins.count(name) == d["accepted"]
        assert set(d["window"]) >= {"alpha", "tau", "steps"}
    assert set(spec["window"]) >= {"alpha", "tau", "speedup"}
    assert spec["off_steps"] == spec["switch_offs"] == 0  # min_acceptance 0 switches nothing off
    steps = {labels: v for (name, labels), v in metrics.items() if name == "specdec:spec_decode_sequence_steps_total"}
    assert sum(steps.values()) == 2 * 40 - first["spec_decode"]["accepted"] - spec["accepted"]  # one per step
    accepted = sum(v for (name, labels), v in metrics.items()
                   if name == "specdec:spec_decode_drafter_tokens_total" and ("outcome", "accepted") in labels)
    assert accepted == first["spec_decode"]["accepted"] + spec["accepted"]


# -- fuzzing the request schema --------------------------------------------------------------------
JSON_SCALARS = (st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats()
                | st.text(max_size=12))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
          "min_p", "seed", "stop", "n", "stream", "stream_options", "logprobs", "ignore_eos", "echo",
          "spec_decode_detail", "spec_decode_drafter",
          "top_logprobs", "presence_penalty", "logit_bias", "response_format", "guided_regex", "guided_choice",
          "tools", "tool_choice", "bad_words", "min_tokens"]
PLAUSIBLE = {
    "prompt": st.text(min_size=0, max_size=30) | st.lists(st.integers(-5, 60000), max_size=5),
    "messages": st.lists(st.fixed_dictionaries({
        "role": st.sampled_from(["system", "user", "assistant", "tool", "robot"]),
        "content": st.text(max_size=20) | st.lists(st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "image_url"]), "text": st.text(max_size=8)}), max_size=2),
    }), max_size=3),
    "max_tokens": st.integers(-2, 3),
    "temperature": st.floats(-1, 3),
    "n": st.integers(0, 3),
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=3),
    "stream": st.booleans(),
    "seed": st.integers(-(2**70), 2**70),
    # nested shapes: tools, tool_choice, response_format, logit_bias keys (unicode digits, up to 20 characters)
    "tools": st.lists(st.fixed_dictionaries({"type": st.sampled_from(["function", "code"]), "function": (
        st.fixed_dictionaries({"name": st.sampled_from(["f", "g", "", "a b"]) | JSON_VALUES},
                              optional={"parameters": JSON_VALUES | st.just({"type": "object"})}) | JSON_VALUES)}),
        max_size=2),
    "tool_choice": st.sampled_from(["none", "auto", "required", "any"]) | st.fixed_dictionaries(
        {"type": st.sampled_from(["function", "tool"]),
         "function": st.fixed_dictionaries({"name": st.sampled_from(["f", "g"]) | JSON_VALUES}) | JSON_VALUES}),
    "response_format": st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "json_object", "json_schema", "xml"]) | JSON_VALUES},
        optional={"json_schema": st.fixed_dictionaries({}, optional={
            "name": st.text(max_size=5), "schema": JSON_VALUES | st.just({"type": "object"})}) | JSON_VALUES}),
    "logit_bias": st.dictionaries(st.text(alphabet=st.sampled_from("0123456789\u00b2\u0661\u096b\uff15 +-x"),
                                          max_size=20), st.floats(-150, 150) | JSON_VALUES, max_size=3),
}


@st.composite
def request_bodies(draw):
    body = {"max_tokens": draw(st.integers(1, 3))}
    for key in draw(st.lists(st.sampled_from(FIELDS), max_size=6, unique=True)):
        strategy = PLAUSIBLE.get(key, JSON_VALUES)
        body[key] = draw(strategy | JSON_VALUES) if key in PLAUSIBLE else draw(strategy)
    return body


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
       body=request_bodies() | JSON_VALUES | st.binary(max_size=40))
def test_fuzz_request_schema_never_5xx(tiny, path, body):
    url = tiny[0]
    if isinstance(body, bytes):
        r = httpx.post(url + path, content=body, headers={**AUTH, "content-type": "application/json"}, timeout=60)
    else:
        r = httpx.post(url + path, content=json.dumps(body), headers={**AUTH, "content-type": "application/json"},
                       timeout=60)
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert set(r.json()["error"]) >= {"message", "type", "code"}
    assert health(url)["status"] == "ok"  # and the server is still there


# -- the real default model ----------------------------------------------------------------------
# Cheap on purpose: 24 tokens offline, then the same through the server (~17 s on 2 cores).
def test_default_model_greedy_with_ngram():
    llm = LLM(spec="ngram", max_model_len=1024, max_num_seqs=2, plan_drafts=False)
    messages = [{"role": "user", "content": "Repeat exactly: the quick brown fox jumps over the lazy dog, "
                                             "the quick brown fox jumps over the lazy dog."}]
    want = llm.generate(llm.chat_prompt(messages), SamplingParams(max_new_tokens=24))[0]
    with running_server(create_app(llm)) as url:
        c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        r = c.chat.completions.create(model=llm.model_name, messages=messages, max_tokens=24, temperature=0)
        metrics = metric_values(url)
    assert r.choices[0].message.content == want.text
    assert r.usage.completion_tokens == len(want.token_ids)
    # the offline request's slot kept its K/V (all but the last prompt token, which the first decode pass runs)
    assert r.usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - 1
    spec = r.model_extra["spec_decode"]
    assert spec["drafted"] > 0 and spec["accepted"] > 0 and spec["mean_accepted_len"] > 1.0
    assert metrics[("specdec:spec_decode_num_draft_tokens_total", ())] == spec["drafted"]
    assert metrics[("specdec:spec_decode_num_accepted_tokens_per_pos_total", (("position", "0"),))] >= 1


# -- command line ----------------------------------------------------------------------------------
def test_serve_flags_and_speculative_config():
    args = build_parser().parse_args(["serve"])
    assert args.host == "127.0.0.1" and args.port == 8000 and args.max_batch_size == 8
    assert args.allowed_hosts == [] and args.allowed_origins == [] and not args.metrics_public
    args = build_parser().parse_args(["serve", "--allowed-hosts", "a.example, b.example", "--allowed-origins",
                                      "https://app.example", "--metrics-public"])
    assert args.allowed_hosts == ["a.example", "b.example"] and args.allowed_origins == ["https://app.example"]
    spec, budget = serve_config(args)
    assert spec.types == (SpecType.ADAPTIVE,) and budget == DraftBudget(spec.draft_n_max)  # the engine plans
    assert serve_config(build_parser().parse_args(["serve", "--spec-type", "none"]))[0].enabled is False
    with pytest.raises(UsageError, match="min-acceptance"):
        serve_config(build_parser().parse_args(["serve", "--spec-min-acceptance", "1.5"]))

    args = build_parser().parse_args(["serve", "--speculative-config",
                                      '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, '
                                      '"disable_by_batch_size": 3}'])
    spec, budget = serve_config(args)
    assert spec.types == (SpecType.NGRAM,) and spec.draft_n_max == 5 and spec.ngram_size_n == 4
    assert budget == DraftBudget(5, None, 3) and budget(3) == 5 and budget(4) == 0

    assert spec_from_vllm_config('{"method": "suffix"}')[0].types == (SpecType.SUFFIX,)
    spec, _ = spec_from_vllm_config('{"method": "draft_model", "model": "some/model", "num_speculative_tokens": 3}')
    assert spec.types == (SpecType.DRAFT_MODEL,) and spec.draft_model == "some/model" and spec.draft_n_max == 3
    assert spec_from_vllm_config('{"model": "[ngram]"}')[0].types == (SpecType.NGRAM,)
    for bad in ('{"method": "eagle"}', "not json", "[1]", '{"method": "ngram", "num_speculative_tokens": 0}',
                '{"method": "draft_model"}'):
        with pytest.raises(ValueError):
            spec_from_vllm_config(bad)
    both = build_parser().parse_args(["serve", "--spec-type", "ngram", "--speculative-config", '{"method": "ngram"}'])
    with pytest.raises(UsageError):
        serve_config(both)
    budget = serve_config(build_parser().parse_args(["serve", "--spec-type", "ngram", "--spec-draft-n-max", "6",
                                                     "--spec-batch-draft-tokens", "12"]))[1]
    assert [budget(b) for b in (1, 2, 3, 4, 6, 12, 13)] == [6, 6, 4, 3, 2, 1, 0]
