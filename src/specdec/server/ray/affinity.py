"""Conversation affinity: which replica should serve a request so that its drafter caches keep paying.

The suffix drafter's cache of finished requests lives in each replica; a conversation whose turns
land on different replicas drafts from a cache that never saw its earlier turns. The router
therefore sends a request to the replica that served the same conversation before, while that
replica has capacity, and otherwise to the least-loaded one (the Ray router does the load part).

A conversation is recognised, strongest first, by

1. an explicit key: the ``X-Session-ID`` header, OpenAI's ``prompt_cache_key``, or ``user``;
2. otherwise its prompt: the longest earlier prompt that is a prefix of this one. A turn's chat
   prompt is the previous turn's messages plus the answer and the next question, so the previous
   prompt is an exact prefix of it, while two conversations that share only a system prompt are
   not prefixes of each other. Messages render with separators (``render_messages``), so a
   message that merely starts like an earlier one does not match.

Worked example (prefix store, replicas "a" and "b")::

    record("<sys>You help.<user>Fix bug 1", "a")
    record("<sys>You help.<user>Fix bug 2", "b")
    lookup("<sys>You help.<user>Fix bug 1<assistant>Done.<user>Now test it")  -> "a"
    lookup("<sys>You help.<user>Fix bug 3")                                   -> None (least-loaded)
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

SESSION_HEADER = "x-session-id"
_ROLE, _END = "\x1e", "\x1d"  # record/group separators: never in ordinary text


@dataclass(frozen=True)
class AffinityKey:
    """What identifies a request's conversation. ``session`` wins over ``prompt`` when both are set."""

    session: str | None = None
    prompt: str = ""


def render_messages(messages: list) -> str:
    """Chat messages -> one string where an earlier turn's prompt is a prefix of a later turn's."""
    parts = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        parts.append(f"{_ROLE}{m.get('role')}{_ROLE}{_content_text(m.get('content'))}{_END}")
    return "".join(parts)


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # text parts
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return ""


def render_prompt(prompt: object) -> str:
    """A completions ``prompt`` -> text; token ids as "1,2,3," so that [1, 2] is no prefix of [1, 23]."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, int):
            return "".join(f"{t}," for t in prompt)
        return render_prompt(first)  # a batch of prompts: the first stands for the request
    return ""


def affinity_key(headers: Mapping[str, str], body: object) -> AffinityKey | None:
    """The conversation key of a request (None when the body says nothing usable).

    ``headers`` have lower-case names; ``body`` is the parsed JSON (anything: bad bodies are
    the replica's to refuse, the router only needs a key).
    """
    session = headers.get(SESSION_HEADER) or None
    prompt = ""
    if isinstance(body, dict):
        for field in ("prompt_cache_key", "user"):
            value = body.get(field)
            if session is None and isinstance(value, str) and value:
                session = f"{field}:{value}"
        if isinstance(body.get("messages"), list):
            prompt = render_messages(body["messages"])
        else:
            prompt = render_prompt(body.get("prompt"))
    if session is None and not prompt:
        return None
    return AffinityKey(session, prompt)


class AffinityTable:
    """Which replica served each session and recent prompts; bounded, oldest forgotten first.

    Replica ids are opaque strings. ``rank`` orders candidates: the remembered replica alone
    first (the router takes it while it has capacity), then all the others in random order
    (the router takes the least loaded; the shuffle breaks ties so idle replicas share work).
    """

    def __init__(self, max_sessions: int = 100_000, max_prompt_chars: int = 8_000_000) -> None:
        self.max_sessions, self.max_prompt_chars = max_sessions, max_prompt_chars
        self._sessions: OrderedDict[str, str] = OrderedDict()
        self._prompts: OrderedDict[str, str] = OrderedDict()  # prompt -> replica, oldest first
        self._prompt_chars = 0

    def lookup(self, key: AffinityKey | None) -> str | None:
        if key is None:
            return None
        if key.session is not None:
            return self._sessions.get(key.session)
        best, best_len = None, 0
        for earlier, replica in self._prompts.items():
            if len(earlier) > best_len and key.prompt.startswith(earlier):
                best, best_len = replica, len(earlier)
        return best

    def record(self, key: AffinityKey | None, replica: str) -> None:
        """``replica`` now serves this conversation (its latest turn is there)."""
        if key is None:
            return
        if key.session is not None:
            self._sessions[key.session] = replica
            self._sessions.move_to_end(key.session)
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
            return
        if not key.prompt or len(key.prompt) > self.max_prompt_chars:
            return
        # Earlier turns of this conversation are prefixes of this prompt: this entry replaces them.
        for earlier in [p for p in self._prompts if key.prompt.startswith(p)]:
            self._drop_prompt(earlier)
        self._prompts[key.prompt] = replica
        self._prompt_chars += len(key.prompt)
        while self._prompt_chars > self.max_prompt_chars:
            self._drop_prompt(next(iter(self._prompts)))

    def _drop_prompt(self, prompt: str) -> None:
        del self._prompts[prompt]
        self._prompt_chars -= len(prompt)

    def forget_replicas(self, gone: Iterable[str]) -> None:
        """Drop what pointed at replicas that died or were scaled away."""
        gone = set(gone)
        if not gone:
            return
        for session in [s for s, r in self._sessions.items() if r in gone]:
            del self._sessions[session]
        for prompt in [p for p, r in self._prompts.items() if r in gone]:
            self._drop_prompt(prompt)

    def rank(self, key: AffinityKey | None, candidates: list[str], rng: random.Random | None = None) -> list[list[str]]:
        """[[remembered replica], others shuffled], or [all shuffled] for a new conversation."""
        others = list(candidates)
        (rng or random).shuffle(others)
        preferred = self.lookup(key)
        if preferred is None or preferred not in others:
            return [others] if others else []
        others.remove(preferred)
        return [[preferred], others] if others else [[preferred]]
