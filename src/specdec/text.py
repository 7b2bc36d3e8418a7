"""Tokenizer loading, incremental detokenization and stop strings."""

from __future__ import annotations

from pathlib import Path

from specdec.model.weights import ModelLoadError


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder)  # trust_remote_code stays off
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load a tokenizer from {folder}: {exc}") from None


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
        text, stopped = cut_at_stop(decode(self.tokenizer, output_ids), self.stops)
        end = len(text)
        if not stopped:
            end = len(text.rstrip("\ufffd"))
            for s in self.stops:
                for k in range(min(len(s) - 1, end), 0, -1):
                    if text[:end].endswith(s[:k]):
                        end = min(end, len(text[:end]) - k)
                        break
        return self._emit(text, end)

    def flush(self, output_ids: list[int]) -> str:
        text = self.final(output_ids)
        return self._emit(text, len(text))

    def _emit(self, text: str, end: int) -> str:
        if end <= self.sent:
            return ""
        delta, self.sent = text[self.sent : end], end
        return delta
