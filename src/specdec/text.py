"""Tokenizer loading, prompt encoding, incremental detokenization and stop strings."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from specdec.errors import ModelLoadError


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer  # lazy: importing transformers takes seconds; most runs never need it

    try:
        return AutoTokenizer.from_pretrained(folder)  # trust_remote_code stays off
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load a tokenizer from {folder}: {exc}") from None


def as_prompt_list(prompts: str | list[int] | Sequence[str | list[int]]) -> Sequence[str | list[int]]:
    """One prompt (text or token ids) or several -> several: "hi" -> ["hi"], [1, 2] -> [[1, 2]]."""
    if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
        return [prompts]  # type: ignore[list-item]
    return prompts


def encode_prompt(tokenizer, prompt: str | list[int], add_special_tokens: bool = True) -> list[int]:
    """Token ids of a plain prompt: text goes through the tokenizer (special tokens such as BOS
    included unless ``add_special_tokens`` is False), token ids pass through unchanged. Raises
    ValueError on empty text."""
    if isinstance(prompt, list):
        return prompt
    if not prompt:
        raise ValueError("the prompt is empty")
    return tokenizer(prompt, add_special_tokens=add_special_tokens).input_ids


def encode_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = True,
                tools: list[dict] | None = None) -> list[int]:
    """Token ids of ``messages`` under the model's chat template (which writes its own special tokens);
    ``tools`` (OpenAI function definitions) go to templates that render them."""
    if not messages:
        raise ValueError("messages is empty")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model has no chat template")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         tools=tools)
    return tokenizer(text, add_special_tokens=False).input_ids


def bad_words_ids(tokenizer, words: Sequence[str]) -> list[tuple[int, ...]]:
    """Token ids of each bad word, alone and after a space (as vLLM: mid-text words start with one)."""
    out: dict[tuple[int, ...], None] = {}  # ordered and de-duplicated in O(1) a word (a list was O(W^2))
    for word in words:
        for text in (word, " " + word.lstrip()):
            ids = tuple(tokenizer(text, add_special_tokens=False).input_ids)
            if ids:
                out[ids] = None
    return list(out)


def decode(tokenizer, token_ids: list[int]) -> str:
    return tokenizer.decode(token_ids, skip_special_tokens=True)


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """Text before the earliest stop string, and whether one was found."""
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


class OutputText:
    """One consumer's view of a sequence's output text, decoded as tokens arrive (O(new tokens) a step).

    The window rule of vLLM's incremental detokenizer: decode the tokens since ``prefix`` with and
    without the new ones and append the difference, so a tokenizer's leading-space and byte-merging
    rules see the same neighbours as in a whole decode; a tail ending in U+FFFD (half a character)
    waits for its next byte. A tokenizer that rewrites spaces across tokens
    (``clean_up_tokenization_spaces``) is decoded whole instead, so ``text`` always equals
    ``decode(tokenizer, ids)`` less a trailing half character.

    Example (byte-level BPE): ids for "Hel", "lo", " wor" extended one by one give text "Hel",
    "Hello", "Hello wor"; a 4-byte emoji over two tokens shows after the second.
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""
        self.prefix = self.read = 0  # decode window: ids[prefix:read] are in ``text``
        self.pending = 0  # characters of ids[read:] in ``text`` while the window ends in half a character
        self.whole = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))

    def extend(self, new_ids: Sequence[int]) -> str:
        """Add tokens; returns the text they completed."""
        self.ids.extend(new_ids)
        if self.whole:
            text = decode(self.tokenizer, self.ids).rstrip("\ufffd")
            delta, self.text = text[len(self.text):] if text.startswith(self.text) else text, text
            return delta
        before = decode(self.tokenizer, self.ids[self.prefix : self.read])
        after = decode(self.tokenizer, self.ids[self.prefix :])
        shown = len(before) + self.pending  # of the window's text, what ``text`` holds already
        delta = after.rstrip("\ufffd")[shown:]  # a trailing half character waits for its next byte
        self.text += delta
        self.pending += len(delta)
        if not after.endswith("\ufffd"):  # complete: the window moves on, keeping this step as context
            self.prefix, self.read, self.pending = self.read, len(self.ids), 0
        return delta


class StopMatcher:
    """Where the earliest stop string starts in a growing text, searching only what is new.

    ``find(text)`` looks at the text added since its last call plus ``len(stop) - 1`` characters
    before it (a stop string may straddle the boundary), so a step costs O(new text x stops), not
    O(whole text). ``held(text)``: how many trailing characters could begin a stop string.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.longest = max((len(s) for s in self.stops), default=0)
        self.searched = 0  # characters of the text already searched
        self.hit: int | None = None

    def find(self, text: str) -> int | None:
        if self.hit is None and self.stops:
            start = max(0, self.searched - self.longest + 1)
            hits = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
            self.hit = min(hits) if hits else None
            self.searched = len(text)
        return self.hit

    def held(self, text: str) -> int:
        tail = text[-(self.longest - 1):] if self.longest > 1 else ""
        for k in range(len(tail), 0, -1):  # the longest tail that is a proper prefix of a stop string
            if any(s.startswith(tail[-k:]) and len(s) > k for s in self.stops):
                return k
        return 0


class StopChecker:
    """Engine callback: has the output produced one of the stop strings? (Incremental: O(new tokens).)"""

    def __init__(self, tokenizer, stops: tuple[str, ...]) -> None:
        self.output = OutputText(tokenizer)
        self.matcher = StopMatcher(stops)

    def __call__(self, output_ids: list[int]) -> bool:
        if len(output_ids) < len(self.output.ids) or output_ids[: len(self.output.ids)] != self.output.ids:
            self.output = OutputText(self.output.tokenizer)  # not the output it followed: start again
            self.matcher = StopMatcher(self.matcher.stops)
        self.output.extend(output_ids[len(self.output.ids):])
        return self.matcher.find(self.output.text) is not None


class TextStream:
    """Turns a growing list of output ids into text deltas.

    Holds back a trailing replacement character (a multi-byte character split
    across tokens) and any tail that could begin a stop string, so streamed text
    never shows a stop string or half a character. Decodes and searches only
    what each push adds (``OutputText``, ``StopMatcher``).
    """

    def __init__(self, tokenizer, stops: tuple[str, ...] = ()) -> None:
        self.tokenizer, self.stops = tokenizer, stops
        self.output = OutputText(tokenizer)
        self.matcher = StopMatcher(stops)
        self.sent = 0  # characters already emitted

    def final(self, output_ids: list[int]) -> str:
        return cut_at_stop(decode(self.tokenizer, output_ids), self.stops)[0]

    def push(self, output_ids: list[int]) -> str:
        return self._emit(*self.showable(output_ids))

    def showable(self, output_ids: list[int]) -> tuple[str, int]:
        """The output's text cut at a stop string, and how much of it may be shown now."""
        self.output.extend(output_ids[len(self.output.ids):])
        text = self.output.text
        hit = self.matcher.find(text)
        if hit is not None:
            return text[:hit], hit
        return text, len(text) - self.matcher.held(text)

    def flush(self, output_ids: list[int]) -> str:
        text = self.final(output_ids)
        return self._emit(text, len(text))

    def _emit(self, text: str, end: int) -> str:
        if end <= self.sent:
            return ""
        delta, self.sent = text[self.sent : end], end
        return delta
