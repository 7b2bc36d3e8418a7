"""TokenLogprob lists -> OpenAI's two logprobs shapes (legacy completions, chat).

A processed logprobs mode reports -inf for tokens the sampler excludes; JSON has no
infinities, so they go out as -9999.0 (vLLM's floor).
"""

from __future__ import annotations

from collections.abc import Sequence

from specdec.logprobs import TokenLogprob, json_logprob
from specdec.server.protocol import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob


class TokenTexts:
    """Each token's own text (special tokens spelled out), decoded once per id."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self.tokenizer.decode([token_id])
        return text


def completion_logprobs(texts: TokenTexts, token_ids: Sequence[int], entries: Sequence[TokenLogprob | None],
                        offset: int = 0) -> CompletionLogprobs:
    """Parallel lists for ``token_ids``; an entry of None (the prompt's first token) has no logprob.

    top_logprobs holds the N most likely tokens plus the chosen one (as vLLM), text_offset
    each token's start in the text, counted from ``offset``.
    """
    out = CompletionLogprobs()
    for token_id, entry in zip(token_ids, entries, strict=True):
        text = texts(token_id)
        out.tokens.append(text)
        out.text_offset.append(offset)
        offset += len(text)
        if entry is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        out.token_logprobs.append(json_logprob(entry.logprob))
        top = {texts(t): json_logprob(lp) for t, lp in entry.top}
        top.setdefault(text, json_logprob(entry.logprob))
        out.top_logprobs.append(top)
    return out


def chat_logprobs(texts: TokenTexts, entries: Sequence[TokenLogprob]) -> ChatLogprobs:
    def top(token_id: int, logprob: float) -> TopLogprob:
        text = texts(token_id)
        return TopLogprob(token=text, logprob=json_logprob(logprob), bytes=list(text.encode("utf-8")))

    content = []
    for e in entries:
        chosen = top(e.token_id, e.logprob)
        content.append(ChatTokenLogprob(**chosen.model_dump(), top_logprobs=[top(t, lp) for t, lp in e.top]))
    return ChatLogprobs(content=content)
