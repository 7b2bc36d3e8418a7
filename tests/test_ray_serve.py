"""specdec on Ray Serve, end to end: a local Ray cluster, 2 replicas of the tiny Llama, the official client.

One deployment serves the whole module (starting Ray and two replicas takes ~35 s on the shared
2-core machine); the tests that kill or replace replicas run last. Skipped without Ray:
``pip install 'specdec[ray]'``.
"""

from __future__ import annotations

import json
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import httpx
import openai
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'specdec[ray]' runs these tests")
serve = pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install 'specdec[ray]'")

from specdec.budget import DraftBudget  # noqa: E402
from specdec.config import SamplingParams, SpecConfig, SpecType  # noqa: E402
from specdec.errors import UsageError  # noqa: E402
from specdec.llm import LLM  # noqa: E402
from specdec.server.app import create_app  # noqa: E402
from specdec.server.ray.app import build, flags_from_args  # noqa: E402
from specdec.server.ray.deployment import APP_NAME, ENGINE, REPLICA_HEADER, build_app  # noqa: E402
from specdec.server.ray.options import RayDeployment, ReplicaSettings, Scale  # noqa: E402
from tests.test_server import check_edge, metric_values, running_server, wait_for  # noqa: E402

API_KEY = "ray-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MAX_LEN = 512
SLOTS = 4  # per replica: also Ray's max_ongoing_requests


@pytest.fixture(scope="module")
def deployment(tiny_llama) -> RayDeployment:
    spec = SpecConfig(types=(SpecType.NGRAM,))
    replica = ReplicaSettings(str(tiny_llama), spec, DraftBudget(spec.draft_n_max, spec.draft_n_max),
                              max_model_len=MAX_LEN, max_batch_size=SLOTS)
    return RayDeployment(replica, Scale(2, 2), api_key=API_KEY)


@pytest.fixture(scope="module")
def endpoint(deployment):
    """Base URL of the Ray endpoint (2 replicas); Ray shuts down after the module."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level="WARNING")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config=deployment.logging_config)
        serve.run(build_app(deployment), name=APP_NAME, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def offline(tiny_llama) -> LLM:
    return LLM(str(tiny_llama), max_model_len=MAX_LEN, spec="none")


@pytest.fixture(scope="module")
def client(endpoint):
    return openai.OpenAI(base_url=endpoint + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def greedy(offline: LLM, prompt, max_tokens: int, ignore_eos: bool = False) -> str:
    return offline.generate(prompt, SamplingParams(max_new_tokens=max_tokens, ignore_eos=ignore_eos))[0].text


def replicas(url: str) -> list[str]:
    health = httpx.get(url + "/health", headers=AUTH, timeout=30).json()
    return sorted(r["replica"] for r in health["per_replica"])


def chat(client, messages, **kwargs) -> tuple[str, str]:
    """(answer, replica) of one greedy chat turn."""
    raw = client.chat.completions.with_raw_response.create(model=None, messages=messages, max_tokens=6,
                                                           temperature=0, **kwargs)
    return raw.parse().choices[0].message.content, raw.headers[REPLICA_HEADER]


# -- the same API as `specdec serve` ------------------------------------------------------------
def test_same_greedy_text_as_specdec_serve(endpoint, client, tiny_llama):
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):"
    messages = [{"role": "user", "content": "Name a colour."}]
    llm = LLM(str(tiny_llama), spec="ngram", max_model_len=MAX_LEN, max_num_seqs=SLOTS, plan_drafts=False)
    with running_server(create_app(llm, api_key=API_KEY)) as url:
        plain = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
        outputs = []
        for c in (plain, client):
            model = c.models.list().data[0].id
            done = c.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0)
            streamed = c.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0, stream=True)
            answer = c.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0)
            chunks = list(c.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0,
                                                    stream=True, stream_options={"include_usage": True}))
            outputs.append((model, done.choices[0].text, done.usage.completion_tokens,
                            "".join(x.choices[0].text for x in streamed if x.choices),
                            answer.choices[0].message.content,
                            "".join(x.choices[0].delta.content or "" for x in chunks if x.choices),
                            chunks[-1].usage.total_tokens))
    assert outputs[0] == outputs[1]
    assert outputs[1][1] == outputs[1][3] and outputs[1][4] == outputs[1][5]


def test_errors_health_and_metrics(endpoint, client):
    bad = [("/v1/completions", b"{not json", AUTH, 400, "invalid_value"),
           ("/v1/completions", {"prompt": "hi", "max_tokens": 10**6}, AUTH, 400, "context_length_exceeded"),
           ("/v1/completions", {"prompt": "hi", "model": "gpt-9"}, AUTH, 404, "model_not_found"),
           ("/v1/completions", {"prompt": "hi"}, {}, 401, "invalid_api_key"),
           ("/v1/chat/completions", {"messages": []}, AUTH, 400, "invalid_value"),
           ("/v1/nothing-here", {"prompt": "hi"}, AUTH, 404, 404)]
    for path, body, headers, status, code in bad:
        if isinstance(body, bytes):
            r = httpx.post(endpoint + path, content=body, headers={**headers, "content-type": "application/json"})
        else:
            r = httpx.post(endpoint + path, json=body, headers=headers)
        assert r.status_code == status and r.json()["error"]["code"] == code, (path, r.text)
    options = httpx.options(endpoint + "/v1/completions", headers=AUTH)
    assert options.status_code == 405 and options.json()["error"]["code"] == 405
    too_big = httpx.post(endpoint + "/v1/completions", content=b"x" * (17 * 2**20), headers=AUTH)
    assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "request_too_large"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=endpoint + "/v1", api_key="nope", max_retries=0).models.list()

    def generated() -> float:
        return sum(v for (name, _), v in metric_values(endpoint, AUTH).items()
                   if name == "specdec:generation_tokens_total")

    before = generated()
    client.completions.create(model=None, prompt="Count: 1 2 3 1 2 3", max_tokens=8, temperature=0)
    health = httpx.get(endpoint + "/health", headers=AUTH).json()
    assert health["status"] == "ok" and health["replicas"] == 2 and health["max_num_seqs"] == 2 * SLOTS
    wait_for(lambda: generated() == before + 8)  # replicas report every REPORT_EVERY_S
    values = metric_values(endpoint, AUTH)
    labelled = {dict(labels)["replica"] for (name, labels) in values if name == "specdec:generation_tokens_total"}
    assert labelled == set(replicas(endpoint))
    assert ("specdec:ray_request_retries_total", ()) in values


def test_the_ingress_applies_the_edge_of_specdec_serve(endpoint):
    """Under --ray the same EdgePolicy guards the front door: foreign Host 400, foreign Origin 403,
    /health and /metrics behind the key, and the playground's own origin can chat (the replicas
    refused every browser POST before)."""
    check_edge(endpoint, AUTH)


def test_hostile_bodies_at_the_ingress_never_5xx(endpoint):
    """A sample of the hostile bodies (every value for three fields, and whole bodies nested 3000
    deep): 4xx or an answer from the ingress, never a 5xx."""
    from tests.hostile import hostile_cases

    fives = []
    for path, body in hostile_cases(huge_string=1 << 14):
        field = body.split(b'"max_tokens": 1, "', 1)[-1]
        if not (body.startswith((b"[", b'{"a"')) or field.startswith((b"prompt", b"logit_bias", b"guided_json"))):
            continue
        r = httpx.post(endpoint + path, content=body, headers={**AUTH, "content-type": "application/json"},
                       timeout=120)
        if r.status_code >= 500:
            fives.append((body[:100], r.text[:200]))
    assert not fives, fives[:5]


# -- routing --------------------------------------------------------------------------------------
def test_concurrent_clients_spread_over_both_replicas(endpoint, client, offline):
    prompts = [f"Client {i} says: the number {i * 7} is" for i in range(8)]
    wants = [greedy(offline, p, 24) for p in prompts]

    def one(i: int) -> tuple[str, str]:
        raw = client.completions.with_raw_response.create(model=None, prompt=prompts[i], max_tokens=24,
                                                          temperature=0)
        return raw.parse().choices[0].text, raw.headers[REPLICA_HEADER]

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(one, range(8)))
    assert [text for text, _ in got] == wants
    assert {replica for _, replica in got} == set(replicas(endpoint))


@pytest.mark.parametrize("how", ["user", "header", "prefix"])
def test_affinity_keeps_a_conversation_on_one_replica(endpoint, client, how):
    extra = {"user": {"user": f"user-{how}"}, "header": {"extra_headers": {"X-Session-ID": f"s-{how}"}},
             "prefix": {}}[how]
    conversations = {}
    for name in ("first", "second", "third"):  # interleaved turns of three conversations
        conversations[name] = [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": f"Conversation {name} ({how}): start."}]
    seen: dict[str, set[str]] = {name: set() for name in conversations}
    for turn in range(3):
        for name, messages in conversations.items():
            answer, replica = chat(client, messages, **(extra if name == "first" else {}))
            seen[name].add(replica)
            messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": f"Turn {turn}."}]
    assert all(len(r) == 1 for r in seen.values()), seen


def test_affinity_yields_to_load(endpoint):
    """One conversation sending more requests than its replica has slots overflows to the other replica."""
    body = {"max_tokens": 200, "ignore_eos": True, "stream": True, "user": "crowd"}
    with ThreadPoolExecutor(2 * SLOTS) as pool:
        got = list(pool.map(lambda i: _stream_replica(endpoint, {**body, "prompt": f"Crowd {i}:"}), range(2 * SLOTS)))
    assert set(got) == set(replicas(endpoint)), got  # all on one replica = affinity that ignores capacity


def _stream_replica(url: str, body: dict) -> str:
    with httpx.stream("POST", url + "/v1/completions", json=body, headers=AUTH, timeout=120) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return r.headers[REPLICA_HEADER]


def _running(url: str) -> dict[str, int]:
    health = httpx.get(url + "/health", headers=AUTH).json()
    return {r["replica"]: r["running_sequences"] for r in health["per_replica"]}


# -- faults and scaling (last: they replace replicas; ~20 s each) ------------------------------------
def test_killing_a_replica_mid_load_loses_no_unstreamed_request(endpoint, client, offline):
    prompts = [f"Request {i}, please go on:" for i in range(6)]
    wants = [greedy(offline, p, 240, ignore_eos=True) for p in prompts]
    results: dict[int, tuple] = {}

    def non_streaming(i: int) -> None:
        r = httpx.post(endpoint + "/v1/completions", headers=AUTH, timeout=300,
                       json={"prompt": prompts[i], "max_tokens": 240, "ignore_eos": True, "temperature": 0})
        results[i] = ("json", r.status_code, r.json())

    def streaming(i: int) -> None:
        body = {"prompt": prompts[i], "max_tokens": 240, "ignore_eos": True, "temperature": 0, "stream": True}
        with httpx.stream("POST", endpoint + "/v1/completions", json=body, headers=AUTH, timeout=300) as r:
            lines = [line for line in r.iter_lines() if line]
        results[i] = ("sse", r.status_code, lines, r.headers[REPLICA_HEADER])

    before = replicas(endpoint)
    threads = [threading.Thread(target=non_streaming if i % 2 else streaming, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    wait_for(lambda: all(_running(endpoint).get(r, 0) > 0 for r in before), timeout=60)
    running = _running(endpoint)
    victim = max(before, key=lambda r: running.get(r, 0))
    ray.kill(ray.get_actor(f"SERVE_REPLICA::{APP_NAME}#{ENGINE}#{victim}", namespace="serve"), no_restart=True)
    for t in threads:
        t.join(300)

    for i, result in sorted(results.items()):
        if result[0] == "json":  # nothing streamed yet: retried elsewhere if its replica died
            assert result[1] == 200 and result[2]["choices"][0]["text"] == wants[i], result
        else:
            _, status, lines, replica = result
            assert status == 200 and lines[-1] == "data: [DONE]"
            events = [json.loads(line[6:]) for line in lines[:-1]]
            if "error" in events[-1]:  # died mid-stream: a clear error event, only on the victim
                assert replica == victim and events[-1]["error"]["type"] == "server_error"
            else:
                assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == wants[i]
    assert len(results) == 6
    values = metric_values(endpoint, AUTH)
    assert values[("specdec:ray_request_retries_total", ())] + values[("specdec:ray_request_failed_total", ())] >= 1
    # The endpoint keeps serving, and Serve brings a fresh replica in place of the victim.
    assert client.completions.create(model=None, prompt="Still there?", max_tokens=4).usage.completion_tokens == 4
    wait_for(lambda: len(replicas(endpoint)) == 2 and victim not in replicas(endpoint), timeout=180)


def test_redeploy_with_fewer_replicas_drains_without_failing_a_request(endpoint, deployment):
    """Under steady load, going from 2 replicas to 1 (a rolling update) fails no request: the old
    replicas stop taking work and finish what they run before they stop."""
    old = replicas(endpoint)
    stop, served, failures = threading.Event(), [], []

    def load(i: int) -> None:
        n = 0
        while not stop.is_set():
            body = {"prompt": f"Client {i} turn {n}:", "max_tokens": 60, "ignore_eos": True, "stream": True}
            try:
                served.append(_stream_replica(endpoint, body))
            except Exception as exc:  # noqa: BLE001 - collected and reported below
                failures.append(repr(exc))
            n += 1

    threads = [threading.Thread(target=load, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(served) >= 3, timeout=60)
        serve.run(build_app(replace(deployment, scale=Scale(1, 1))), name=APP_NAME, route_prefix="/")
        wait_for(lambda: len(replicas(endpoint)) == 1 and set(replicas(endpoint)).isdisjoint(old), timeout=120)
        count = len(served)
        wait_for(lambda: len(served) >= count + 3, timeout=60)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert not failures, failures[:3]
    # both generations served the load (which old replica Ray's router picked for the first requests is
    # its choice: requiring every old one failed when all three clients landed on the same replica)
    assert set(served) & set(old) and set(served) - set(old)


# -- the `serve run` / `serve deploy` application builder -------------------------------------------
def test_app_builder_takes_serve_flags(tiny_llama):
    assert flags_from_args({"spec_type": "ngram", "replicas": 2, "max-batch-size": "4", "x": True, "y": False,
                            "z": None}) == ["--spec-type", "ngram", "--replicas", "2", "--max-batch-size", "4", "--x"]
    assert build({"model": str(tiny_llama), "spec_type": "suffix", "autoscale": "1,3"}) is not None
    for bad in ({"port": 9000}, {"ray_address": "auto"}, {"replicas": 0}, {"no_such_flag": 1},
                {"replicas": 2, "autoscale": "1,2"}):
        with pytest.raises(UsageError):
            build(bad)
