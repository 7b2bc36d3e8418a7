"""Hostile request bodies: every field of both endpoints given nesting, huge numbers, huge strings
and every wrong JSON type. Shared by the fuzz tests (``test_server.py``, ``test_ray_serve.py``)
and the soak check (``scripts/soak.py``).

Each case is (path, raw JSON bytes): the body is built as text, so depths past Python's recursion
limit and integers past ``sys.get_int_max_str_digits`` reach the server as a client would send them.

    >>> path, body = next(hostile_cases(depth=3))
    >>> path, body[:41]
    ('/v1/completions', b'{"prompt": "hi", "max_tokens": 1, "model"')
"""

from __future__ import annotations

import json
from collections.abc import Iterator

COMPLETION_FIELDS = ["model", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
                     "min_p", "seed", "stop", "n", "stream", "stream_options", "logprobs", "ignore_eos", "echo",
                     "spec_decode_detail", "spec_decode_drafter", "presence_penalty", "frequency_penalty",
                     "repetition_penalty", "logit_bias", "min_tokens", "bad_words", "user", "response_format",
                     "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                     "best_of", "suffix"]
CHAT_FIELDS = [f for f in COMPLETION_FIELDS if f not in ("prompt", "echo", "best_of", "suffix", "logprobs")] + [
    "messages", "logprobs", "top_logprobs", "tools", "tool_choice"]
BASES = {
    "/v1/completions": ({"prompt": "hi", "max_tokens": 1}, COMPLETION_FIELDS),
    "/v1/chat/completions": ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}, CHAT_FIELDS),
}
WRONG_TYPES = ["{}", '"x"', "1.5", "-1", "true", "null", '[{"a": [1, null]}]']  # every JSON type


def hostile_values(depth: int = 3000, huge_digits: int = 5000, huge_string: int = 1 << 20) -> list[str]:
    """Raw JSON texts: nesting ``depth`` deep (lists, objects, in a string; a tenth as deep, which parses),
    a ``huge_digits``-digit number and numeric string, a ``huge_string``-character string, wrong types."""
    values = ["[" * depth + "]" * depth, '{"a": ' * depth + "1" + "}" * depth]
    values.append(json.dumps("[" * depth + "]" * depth))  # a string holding deep JSON (guided_json, arguments)
    values.append("[" * (depth // 10) + "]" * (depth // 10))  # deep, but within what json parses
    digits = "9" * huge_digits
    values += [digits, json.dumps(digits), "1e999999", json.dumps("x" * huge_string)]
    values.append(json.dumps({digits: 1}))  # a huge key: logit_bias
    return values + WRONG_TYPES


def message_cases(depth: int, huge_digits: int) -> list[str]:
    """``messages`` whose earlier tool call carries hostile ``arguments`` text."""
    out = []
    for arguments in ("[" * depth, "[" * depth + "]" * depth, "9" * huge_digits, '{"x": ' + "9" * huge_digits + "}"):
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
        out.append(json.dumps([{"role": "assistant", "content": "", "tool_calls": [call]},
                               {"role": "user", "content": "hi"}]))
    return out


def hostile_cases(depth: int = 3000, huge_digits: int = 5000, huge_string: int = 1 << 20, spread: bool = False) \
        -> Iterator[tuple[str, bytes]]:
    """Every (endpoint, field, hostile value), each in an otherwise valid body; then whole bodies
    nested ``depth`` deep. ``spread``: each field with one value, the values in turn (every field and
    every value of both endpoints, ~80 bodies instead of ~1100), and ``messages`` with each of its own."""
    values = hostile_values(depth, huge_digits, huge_string)
    for path, (base, fields) in BASES.items():
        for i, field in enumerate(fields):
            extra = message_cases(depth, huge_digits) if field == "messages" else []
            for value in (values[i % len(values) : i % len(values) + 1] if spread else values) + extra:
                rest = {k: v for k, v in base.items() if k != field}
                head = json.dumps(rest)[:-1]
                yield path, f'{head}, "{field}": {value}}}'.encode()
        yield path, ("[" * depth + "]" * depth).encode()
        yield path, ('{"a": ' * depth + "1" + "}" * depth).encode()
