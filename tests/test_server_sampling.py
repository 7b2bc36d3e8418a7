"""The server's sampling API beyond text: scoring a prompt (echo, max_tokens 0), vLLM's logprobs modes,
streamed tool calls, and the README's parameter list against what the server accepts.

A real uvicorn server on the tiny random Llama with ngram speculation and the official ``openai``
client; greedy results are compared with offline ``LLM.generate`` without speculation.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

import httpx
import openai
import pytest

from specdec.cli.main import build_parser
from specdec.config import SamplingParams
from specdec.llm import LLM
from specdec.logprobs import JSON_LOGPROB_FLOOR
from specdec.server.app import create_app
from specdec.server.cli import serve_config
from specdec.server.protocol import ChatCompletionRequest, CompletionRequest
from specdec.server.ray.options import deployment_from_args
from tests.test_server import API_KEY, AUTH, MAX_LEN, running_server

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def served(tiny_llama):
    """(base URL, served LLM, offline LLM without speculation), both in processed_logprobs mode."""
    llm = LLM(str(tiny_llama), spec="ngram", max_model_len=MAX_LEN, max_num_seqs=4,
              logprobs_mode="processed_logprobs", plan_drafts=False)
    offline = LLM(str(tiny_llama), max_model_len=MAX_LEN, spec="none", logprobs_mode="processed_logprobs")
    with running_server(create_app(llm, api_key=API_KEY)) as url:
        yield url, llm, offline


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[0] + "/v1", api_key=API_KEY, max_retries=0)


# -- echo with max_tokens 0: the prompt and its logprobs, nothing generated (lm-eval's loglikelihood) ----
def test_echo_without_generation_scores_the_prompt(served, client):
    url, llm, offline = served
    prompt = "The capital of France is Paris"
    ids = llm.encode(prompt)
    want = offline.generate(ids, SamplingParams(max_new_tokens=0, prompt_logprobs=2))[0].prompt_logprobs
    kw = dict(model=llm.model_name, prompt=prompt, max_tokens=0, temperature=0, echo=True, logprobs=2)
    r = client.completions.create(**kw)
    choice = r.choices[0]
    assert choice.text == offline.tokenizer.decode(ids) and choice.finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (len(ids), 0, len(ids))
    lp = choice.logprobs
    assert "".join(lp.tokens) == choice.text and len(lp.tokens) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing predicts the first token
    # Prompt logprobs are raw whatever the server's logprobs mode, and exact.
    assert lp.token_logprobs[1:] == [t.logprob for t in want[1:]]
    assert all(len(top) >= 2 and lp.tokens[k] in top for k, top in enumerate(lp.top_logprobs) if k)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:k]) for k in range(len(ids))]
    chunks = list(client.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert [x for c in chunks if c.choices and c.choices[0].logprobs
            for x in c.choices[0].logprobs.token_logprobs] == lp.token_logprobs
    assert chunks[-1].choices[0].finish_reason == "length"


def test_echo_without_generation_in_batches_of_token_ids(served, client):
    """As lm-eval sends it: several prompts as token ids, logprobs 1, a seed."""
    url, llm, offline = served
    prompts = [llm.encode("one two three"), llm.encode("a much longer second prompt, scored alone")]
    r = client.completions.create(model=llm.model_name, prompt=prompts, max_tokens=0, temperature=0, echo=True,
                                  logprobs=1, seed=1234)
    assert [c.index for c in r.choices] == [0, 1] and r.usage.completion_tokens == 0
    for ids, choice in zip(prompts, r.choices, strict=True):
        want = offline.generate(ids, SamplingParams(max_new_tokens=0, prompt_logprobs=1))[0].prompt_logprobs
        assert choice.logprobs.token_logprobs == [None, *(t.logprob for t in want[1:])]
        assert choice.text == offline.tokenizer.decode(ids)
    bare = client.completions.create(model=llm.model_name, prompt="just echo", max_tokens=0, echo=True)
    assert bare.choices[0].text == "just echo" and bare.choices[0].logprobs is None
    assert health_free_slots(url) == 4


def health_free_slots(url: str) -> int:
    return httpx.get(url + "/health", headers=AUTH).json()["free_slots"]  # the key guards /health too


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}),  # nothing to return
    ("/v1/completions", {"prompt": "hi", "max_completion_tokens": 0, "logprobs": 1}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}),
])
def test_max_tokens_zero_needs_echo(served, path, body):
    r = httpx.post(served[0] + path, json=body, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_value"


# -- vLLM's logprobs_mode --------------------------------------------------------------------------
def test_processed_logprobs_through_the_server(served, client):
    url, llm, offline = served
    messages = [{"role": "user", "content": "Count: 1 2 3 1 2 3 1 2 3"}]
    params = SamplingParams(max_new_tokens=12, logprobs=2, presence_penalty=1.5, frequency_penalty=1.0)
    want = offline.generate(llm.chat_prompt(messages), params)[0].choices[0]
    r = client.chat.completions.create(model=llm.model_name, messages=messages, max_tokens=12, temperature=0,
                                       logprobs=True, top_logprobs=2, presence_penalty=1.5, frequency_penalty=1.0)
    content = r.choices[0].logprobs.content
    assert r.choices[0].message.content == want.text
    assert [c.logprob for c in content] == [t.logprob for t in want.logprobs]  # exact under speculation
    assert all(c.top_logprobs[0].logprob == c.logprob for c in content)  # greedy took the processed argmax
    # Sampled with top_k 2: the third most likely token is out of the distribution (-inf; in JSON, the floor).
    r = client.chat.completions.create(model=llm.model_name, messages=messages, max_tokens=6, temperature=0.7,
                                       seed=5, logprobs=True, top_logprobs=3, extra_body={"top_k": 2})
    assert all(c.top_logprobs[2].logprob == JSON_LOGPROB_FLOOR < c.logprob for c in r.choices[0].logprobs.content)


def test_logprobs_mode_flag_reaches_the_engine():
    args = build_parser().parse_args(["serve", "--logprobs-mode", "processed_logits", "--spec-type", "ngram"])
    assert args.logprobs_mode == "processed_logits"
    assert deployment_from_args(args, *serve_config(args)).replica.logprobs_mode == "processed_logits"
    assert build_parser().parse_args(["generate", "hi"]).logprobs_mode == "raw_logprobs"


# -- tool calls, streamed ----------------------------------------------------------------------------
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 9}},
                   "required": ["city", "days"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "get_time"}}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_call_streams_piece_by_piece(served, client, tool_choice):
    """OpenAI's shape: a first delta with the call's id, type and name, then arguments in fragments, then
    finish_reason "tool_calls"; assembled by the openai client's own stream helper, the call parses and
    equals the non-streamed one."""
    url, llm, _ = served
    kw = dict(model=llm.model_name, messages=MESSAGES, max_tokens=80, temperature=0, tools=[WEATHER, CLOCK],
              tool_choice=tool_choice)
    whole = client.chat.completions.create(**kw)
    assert whole.choices[0].finish_reason == "tool_calls" and whole.choices[0].message.content is None
    [call] = whole.choices[0].message.tool_calls
    with client.chat.completions.stream(**kw) as stream:
        fragments = [e.arguments_delta for e in stream if e.type == "tool_calls.function.arguments.delta"]
        final = stream.get_final_completion()
    [streamed] = final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason == "tool_calls" and not final.choices[0].message.content
    assert (streamed.function.name, streamed.function.arguments) == (call.function.name, call.function.arguments)
    assert streamed.id.startswith("call_") and streamed.type == "function"
    assert "".join(fragments) == call.function.arguments
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(args) == {"city", "days"} and len(fragments) >= 3  # piece by piece, not one chunk
        assert streamed.function.parsed_arguments == args  # the client parsed it against the strict tool
    else:
        assert args == {}
    # The raw chunks: the name before any argument, the id only on the first.
    chunks = [c for c in client.chat.completions.create(**kw, stream=True) if c.choices]
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or []]
    assert deltas[0].id.startswith("call_") and deltas[0].type == "function"
    assert deltas[0].function.name == call.function.name
    assert all(d.id is None and d.function.name is None and d.index == 0 for d in deltas[1:])
    assert [c.choices[0].finish_reason for c in chunks].count("tool_calls") == 1


def test_forced_tool_call_cut_by_max_tokens(served, client):
    url, llm, _ = served
    kw = dict(model=llm.model_name, messages=MESSAGES, max_tokens=12, temperature=0, tools=[WEATHER],
              tool_choice="required")
    whole = client.chat.completions.create(**kw)
    assert whole.choices[0].finish_reason == "length"
    [call] = whole.choices[0].message.tool_calls  # the call so far, as OpenAI returns a cut call
    assert call.function.name == "get_weather" and call.function.arguments.startswith("{")
    chunks = [c for c in client.chat.completions.create(**kw, stream=True) if c.choices]
    assert "".join(d.function.arguments for c in chunks for d in c.choices[0].delta.tool_calls or []) \
        == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "length"


def test_auto_tool_choice_streams_plain_replies_as_content(served, client):
    """With tools on "auto" a reply whose start rules out a call streams as content, chunk by chunk, and
    equals the non-streamed one; logprobs and provenance cover every token."""
    url, llm, offline = served
    kw = dict(model=llm.model_name, messages=MESSAGES, max_tokens=16, temperature=0, tools=[WEATHER], logprobs=True)
    whole = client.chat.completions.create(**kw)
    text = whole.choices[0].message.content
    assert text and not text.lstrip().startswith(("{", "[", "<")), "the random model answered with a call"
    chunks = [c for c in client.chat.completions.create(**kw, stream=True) if c.choices]
    pieces = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
    assert "".join(pieces) == text and len(pieces) > 1
    assert [x.logprob for c in chunks if c.choices[0].logprobs for x in c.choices[0].logprobs.content] \
        == [x.logprob for x in whole.choices[0].logprobs.content]
    tokens = [t for c in chunks for t in (c.model_extra.get("spec_decode") or {}).get("tokens", [])]
    assert "".join(tokens) == text


def test_tool_reply_streaming_rules():
    from specdec.server.protocol import Tool
    from specdec.server.tools import ToolReply

    tools = [Tool.model_validate(WEATHER), Tool.model_validate(CLOCK)]
    forced = ToolReply(tools, forced=True)
    pieces = ['{"name": "get_', 'weather", "arguments": {"ci', 'ty": "O}s\\"lo", "days"', ': 2}', "}"]
    out = [forced.push(p, final=i == len(pieces) - 1) for i, p in enumerate(pieces)]
    assert out[0] is None
    first = out[1].tool_calls[0]
    assert (first.id, first.type, first.function.name, first.function.arguments) == \
        (forced.call_id, "function", "get_weather", '{"ci')
    assert [o.tool_calls[0].function.arguments for o in out[2:4]] == ['ty": "O}s\\"lo", "days"', ": 2}"]
    assert out[4] is None  # the object's closing brace is not part of the arguments
    assert forced.calls[0].function.arguments == '{"city": "O}s\\"lo", "days": 2}'
    assert forced.finish_reason("stop") == "tool_calls"
    split = ToolReply(tools, forced=True)  # the head is complete before the arguments start
    assert split.push('{"name": "get_time", "arguments":', False) is None
    assert split.push(' {}', False).tool_calls[0].function.arguments == "{}"
    # auto: held while it may be a call, content once ruled out; a whole call at the end
    auto = ToolReply(tools, forced=False)
    assert auto.push("  ", False) is None and auto.push("<tool", False) is None
    assert auto.push("ing> is", False).content == "  <tooling> is" and auto.push(" it", True).content == " it"
    assert auto.finish_reason("stop") == "stop"
    auto = ToolReply(tools, forced=False)
    assert auto.push('<tool_call>{"name": "get_time", "arguments": {}}', False) is None
    end = auto.push("</tool_call>", True)
    assert end.tool_calls[0].function.name == "get_time" and auto.finish_reason("stop") == "tool_calls"
    auto = ToolReply(tools, forced=False)
    assert auto.push("{not a call", True).content == "{not a call" and auto.finish_reason("length") == "length"


# -- the README's parameter list is what the server accepts ----------------------------------------------
def test_readme_parameter_list_matches_the_api():
    """The README's table names every SamplingParams field, only real `specdec generate` flags, and
    exactly the fields the server's request models accept (``suffix`` is accepted only to be refused
    with a 400 that says so)."""
    readme = (ROOT / "README.md").read_text()
    rows = [r.split("|")[1:4] for r in readme[readme.index("<!-- parameters -->"):
                                             readme.index("<!-- /parameters -->")].splitlines()[3:]]
    assert rows and all(len(r) == 3 for r in rows)
    names = [{n for cell in col for n in re.findall(r"`([a-z_]+)`", cell)} for col in zip(*rows, strict=True)]
    assert names[0] == {f.name for f in dataclasses.fields(SamplingParams)}
    flags = {f for row in rows for f in re.findall(r"`(--[a-z-]+)", row[1])}
    generate = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["generate"]
    assert flags and flags <= set(generate._option_string_actions)
    accepted = set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields)
    assert names[2] == accepted - {"suffix"}


def test_each_choice_and_each_role_draws_its_own_stream():
    """n > 1 with a seed: choice i's target stream, and its drafter's, are all distinct (with seed + i
    and a drafter at seed + 1, choice i's drafter drew choice i + 1's target stream: correlated
    choices, though each was exact). Choice 0 keeps the seed: n = 1 samples are unchanged."""
    for seed in (0, 7, 2**63 - 1):
        params = SamplingParams(temperature=1.0, seed=seed, n=8)
        choices = [params.for_choice(i) for i in range(8)]
        streams = [c.seed for c in choices] + [c.draft_seed for c in choices]
        assert len(set(streams)) == 16 and all(0 <= s < 2**63 for s in streams)
        assert choices[0].seed == seed and all(c.n == 1 for c in choices)
        assert all(choices[i].draft_seed != choices[i + 1].seed for i in range(7))
    assert SamplingParams(temperature=1.0).for_choice(3).seed is None  # unseeded stays unseeded
    assert SamplingParams(temperature=1.0).draft_seed is None
