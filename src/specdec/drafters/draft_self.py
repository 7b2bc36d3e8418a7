"""Self-history drafting: reuse what this request's own output said after the same few tokens.

``draft-self`` looks only at the tokens the model generated in this request (never
the prompt). For every short key (the last 3 generated tokens) it keeps one earlier
continuation to copy when the key comes back. Which one it keeps is what sets it
apart from ``ngram`` (which always copies the most recent match):

- each new occurrence of a key is compared, token by token as the output arrives,
  with the key's previous occurrence; the length they agree for is how far the
  old continuation *would have been accepted* as a draft;
- the continuation with the longest such confirmed run is kept (ties go to the
  newer one), so a one-off digression does not displace text the model repeats;
- the kept run halves each time a later occurrence fails to beat it, so a
  continuation the model stopped repeating gives way within a few occurrences.

This targets reasoning traces and loops, where a model restates its own earlier
sentences with occasional detours.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specdec.config import SpecConfig
from specdec.drafters.base import EMPTY, DraftProposal, IndexingDrafter


@dataclass(slots=True)
class Kept:
    """The continuation kept for one key."""

    start: int  # position in the text where the continuation begins
    run: int  # tokens of it a later occurrence repeated (aged by halving)


class SelfHistoryIndex:
    """Per-key kept continuations over the generated part of one token sequence.

    text: every token so far (prompt then output). A key is k consecutive tokens
    lying entirely at or after ``prompt_len``; it is indexed as soon as it is
    complete, and its continuation starts right after it.

    Example (k=2, prompt_len=0, max_run=16)::

        text = [1 2 3 4  1 2 3 4  1 2 9  1 2]
        (1 2) at 0: first occurrence, kept = Kept(start=2, run=0)
        (1 2) at 4: its text "3 4 1 2" repeats the one at 0 until the key recurs at 8
                    -> run 4 >= 0, kept = Kept(start=6, run=4)
        (1 2) at 8: "9" disagrees with "3" at once -> run 0 < 4, keep; run halves to 2
        lookup((1, 2)) -> 6: draft "3 4 1 2 9 ..." where ngram would copy "9 1 2"
    """

    def __init__(self, key_size: int = 3, max_run: int = 16, prompt_len: int = 0) -> None:
        if key_size < 1 or max_run < 1:
            raise ValueError("key_size and max_run must be >= 1")
        self.key_size = key_size
        self.max_run = max_run
        self.prompt_len = prompt_len
        self.text: list[int] = []
        self.kept: dict[tuple[int, ...], Kept] = {}
        self._last: dict[tuple[int, ...], int] = {}  # key -> start of its newest occurrence
        # key -> [start, previous start, agreed]: the newest occurrence vs the previous one
        self._open: dict[tuple[int, ...], list[int]] = {}

    def lookup(self, key: tuple[int, ...]) -> int | None:
        """Start of the kept continuation for ``key``, or None if it has no token yet."""
        kept = self.kept.get(key)
        if kept is None or kept.start >= len(self.text):
            return None
        return kept.start

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens, advancing every open comparison and indexing completed keys."""
        k = self.key_size
        for tok in tokens:
            pos = len(self.text)
            self.text.append(tok)
            self._advance(pos, tok)
            if pos - k + 1 >= self.prompt_len and pos + 1 >= k:
                self._add(tuple(self.text[pos - k + 1 :]), pos + 1)

    def _advance(self, pos: int, tok: int) -> None:
        done = []
        for key, (_, prev, agreed) in self._open.items():
            if self.text[prev + agreed] == tok:  # prev + agreed < start + agreed == pos
                agreed += 1
                self._open[key][2] = agreed
                if agreed < self.max_run:
                    continue
            done.append(key)
        for key in done:
            self._close(key)

    def _add(self, key: tuple[int, ...], start: int) -> None:
        if key in self._open:  # the key recurred before its last comparison settled
            self._close(key)
        prev = self._last.get(key)
        self._last[key] = start
        if prev is None:
            self.kept[key] = Kept(start, 0)
        else:
            self._open[key] = [start, prev, 0]

    def _close(self, key: tuple[int, ...]) -> None:
        start, _, agreed = self._open.pop(key)
        kept = self.kept[key]
        if agreed >= kept.run:
            self.kept[key] = Kept(start, agreed)
        else:
            kept.run //= 2


class DraftSelfDrafter(IndexingDrafter):
    """``draft-self``: copy the kept continuation of the last ``key_size`` generated tokens.

    key_size:   tokens in the key (default 3: short enough to recur in free text,
                long enough that a recurrence usually means a repeat).
    max_tokens: most tokens proposed per step (default 48, --spec-ngram-size-m).
    max_run:    a comparison stops after this many agreeing tokens (default 16); a
                continuation confirmed that far counts as fully confirmed.
    """

    name = "draft-self"

    def __init__(self, key_size: int = 3, max_tokens: int = 48, max_run: int = 16) -> None:
        if max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        super().__init__()
        self.key_size = key_size
        self.max_tokens = max_tokens
        self.max_run = max_run
        self.index = SelfHistoryIndex(key_size, max_run)

    @classmethod
    def from_config(cls, spec: SpecConfig) -> DraftSelfDrafter:
        return cls(max_tokens=spec.ngram_size_m)

    def _reset_index(self) -> None:
        # Also a new sequence seen without begin(): all of it counts as prompt.
        self.index = SelfHistoryIndex(self.key_size, self.max_run, prompt_len=len(self.seen))

    def _index(self, new_ids: Sequence[int]) -> None:
        self.index.extend(new_ids)

    def propose(self, context: Sequence[int], max_tokens: int) -> DraftProposal:
        self._sync(context)
        text = self.index.text
        if len(text) < self.key_size:
            return EMPTY
        start = self.index.lookup(tuple(text[-self.key_size :]))
        if start is None:
            return EMPTY
        return DraftProposal(text[start : start + min(max_tokens, self.max_tokens)])
