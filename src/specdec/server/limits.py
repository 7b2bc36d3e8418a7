"""The bounds on one request's lists and texts, and JSON text parsed without surprises.

A request may be up to ``--max-request-bytes`` (16 MiB), but the work some fields cost grows
faster than their bytes: every bad word is matched at every verify row, every stop string is
searched at every step, a grammar compiles in time that grows with its text. Each such field gets
a count and a size here (beyond them: a 400 that says which), so no single request can stall the
server's one engine thread or its event loop.

``loads`` parses JSON text that came from a client or the model: nesting past Python's recursion
limit and integers past its 4300-digit conversion limit raise ValueError (not RecursionError), so
a caller that refuses bad JSON refuses these too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

MAX_STOPS, MAX_STOP_CHARS = 16, 256
MAX_BAD_WORDS, MAX_BAD_WORDS_CHARS = 256, 16 * 1024
MAX_LOGIT_BIAS = 1024  # OpenAI's own limit is 300 entries
MAX_TOKEN_ID_DIGITS = 10  # a token id: larger vocabularies than 10**10 do not exist
MAX_GRAMMAR_CHARS = 64 * 1024  # regex, Lark/GBNF, a JSON schema's text, the choices together
MAX_CHOICES = 1024
MAX_TOOLS = 128
# Logprob values one response may hold (scored tokens x (top k + 1), all choices): prompt logprobs
# are computed in bounded chunks (engine.PROMPT_LOGPROB_ROWS), but the answer itself is kept whole.
MAX_LOGPROB_ENTRIES = 1 << 20


def check_texts(name: str, texts: Sequence[str], max_count: int, max_chars: int) -> None:
    """ValueError when ``texts`` holds more than ``max_count`` items or ``max_chars`` characters in all."""
    if len(texts) > max_count:
        raise ValueError(f"{name} holds at most {max_count} items, got {len(texts)}")
    total = sum(len(t) for t in texts)
    if total > max_chars:
        raise ValueError(f"{name} holds at most {max_chars} characters in all, got {total}")


def loads(text: str) -> Any:
    """``json.loads``, raising ValueError for every text it cannot turn into a value."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and integers over the digit limit
        raise ValueError(f"not valid JSON: {exc}") from None
