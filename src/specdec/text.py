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


def encode_prompt(tokenizer, prompt: str | list[int]) -> list[int]:
    """Token ids of a plain prompt: text goes through the tokenizer (special tokens such as BOS
    included), token ids pass through unchanged. Raises ValueError on empty text."""
    if isinstance(prompt, list):
        return prompt
    if not prompt:
        raise ValueError("the prompt is empty")
    return tokenizer(prompt).input_ids


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
    out: list[tuple[int, ...]] = []
    for word in words:
        for text in (word, " " + word.lstrip()):
            ids = tuple(tokenizer(text, add_special_tokens=False).input_ids)
            if ids and ids not in out:
                out.append(ids)
    return out


def decode(tokenizer, token_ids: list[int]) -> str:
    return tokenizer.decode(token_ids, skip_special_tokens=True)


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """Text before the earliest stop string, and whether one was found."""
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


class StopChecker:
    """Engine callback: has the output produced one of the stop strings?"""

    def __init__(self, tokenizer, stops: tuple[str, ...]) -> None:
        self.tokenizer, self.stops = tokenizer, stops

    def __call__(self, output_ids: list[int]) -> bool:
        return cut_at_stop(decode(self.tokenizer, output_ids), self.stops)[1]


class TextStream:
    """Turns a growing list of output ids into text deltas.

    Holds back a trailing replacement character (a multi-byte character split
    across tokens) and any tail that could begin a stop string, so streamed text
    never shows a stop string or half a character.
    """

    def __init__(self, tokenizer, stops: tuple[str, ...] = ()) -> None:
        self.tokenizer, self.stops = tokenizer, stops
        self.sent = 0  # characters already emitted

    def final(self, output_ids: list[int]) -> str:
        return cut_at_stop(decode(self.tokenizer, output_ids), self.stops)[0]

    def push(self, output_ids: list[int]) -> str:
        return self._emit(*self.showable(output_ids))

    def showable(self, output_ids: list[int]) -> tuple[str, int]:
        """The output's text cut at a stop string, and how much of it may be shown now."""
        text, stopped = cut_at_stop(decode(self.tokenizer, output_ids), self.stops)
        end = len(text)
        if not stopped:
            end = len(text.rstrip("\ufffd"))
            for s in self.stops:
                for k in range(min(len(s) - 1, end), 0, -1):
                    if text[:end].endswith(s[:k]):
                        end = min(end, len(text[:end]) - k)
                        break
        return text, end

    def flush(self, output_ids: list[int]) -> str:
        text = self.final(output_ids)
        return self._emit(text, len(text))

    def _emit(self, text: str, end: int) -> str:
        if end <= self.sent:
            return ""
        delta, self.sent = text[self.sent : end], end
        return delta
