"""llama.cpp's ``ngram-cache`` (lookup decoding): next-token counts of 1- to 4-grams in three tiers.

- *context*: this request's prompt and output, updated as tokens are committed;
- *dynamic*: every finished request's context counts merged (``NgramCacheStore``, shared by
  the engine), loaded from and saved to ``--spec-ngram-cache-file`` so it outlives the process;
- *static*: read-only counts from ``--spec-ngram-cache-static`` (e.g. built over a corpus).

Each drafted token is the next token of the longest n-gram whose counts are convincing
enough: at least a few samples and a clear majority (``LAX`` in the context, the stricter
``STRICT`` in the dynamic tier, whose counts come from other texts). The static tier's
count for the last 2 tokens weighs the candidates (x100), and drafts alone as a last resort.
Drafting continues on its own output until no tier is convinced.

Example (context only, LAX)::

    tokens [1 2 3 1 2 3 1 2]: the last 4-gram (2 3 1 2) was followed once, by 3: 1 sample >= 1
    and 100% >= 50% -> draft 3; then (3 1 2 3) -> {1: 1} -> draft 1; then (1 2 3 1) -> draft 2 ...

Files use llama.cpp's binary layout (``common_ngram_cache_save``), so caches move between
the two: per n-gram, 4 int32 tokens (padded with -1), an int32 count of next tokens, then
(token, count) int32 pairs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specdec.config import SpecConfig
from specdec.drafters.base import EMPTY, DraftProposal, DraftSetup, IndexingDrafter, SharedState
from specdec.runners.base import ModelRunner

NGRAM_MIN, NGRAM_MAX = 1, 4  # n-gram sizes counted (llama.cpp's LLAMA_NGRAM_MIN / MAX)
NGRAM_STATIC = 2  # the static tier is consulted with the last 2 tokens
PAD = -1  # fills a file record's n-gram past its length (llama.cpp's LLAMA_TOKEN_NULL)
INT32_MAX = 2**31 - 1
MAX_DYNAMIC_NGRAMS = 1 << 19  # a server runs for days: the dynamic tier keeps its most frequent n-grams


@dataclass(frozen=True)
class Thresholds:
    """A tier's n-gram of size s drafts only with >= min_samples[s-1] samples and a majority of min_percent[s-1]."""

    min_samples: tuple[int, ...]
    min_percent: tuple[int, ...]


LAX = Thresholds((2, 2, 1, 1), (66, 50, 50, 50))  # the request's own context (and the static tier alone)
STRICT = Thresholds((4, 3, 2, 2), (75, 66, 66, 66))  # the dynamic tier: counts from other texts


class NgramCacheFileError(ValueError):
    """An n-gram cache file cannot be read or written; the message is one line for the user."""


class NgramCounts:
    """``common_ngram_cache``: n-gram (a tuple of 1-4 tokens) -> {next token: count}.

    Example::

        counts.update([7, 8, 7, 9], num_new=4)
        counts.get((7,)) -> {8: 1, 9: 1},   counts.get((8, 7)) -> {9: 1},   counts.get((9,)) -> None
    """

    def __init__(self) -> None:
        self.parts: dict[tuple[int, ...], dict[int, int]] = {}

    def __len__(self) -> int:
        return len(self.parts)

    def get(self, ngram: tuple[int, ...]) -> dict[int, int] | None:
        return self.parts.get(ngram)

    def update(self, tokens: Sequence[int], num_new: int) -> None:
        """Count the n-grams whose next token is one of the last ``num_new`` of ``tokens``."""
        num = len(tokens)
        for size in range(NGRAM_MIN, NGRAM_MAX + 1):
            for i in range(max(num - num_new, size), num):
                part = self.parts.setdefault(tuple(tokens[i - size : i]), {})
                part[tokens[i]] = part.get(tokens[i], 0) + 1

    def merge(self, other: NgramCounts) -> None:
        for ngram, other_part in other.parts.items():
            part = self.parts.setdefault(ngram, {})
            for tok, count in other_part.items():
                part[tok] = part.get(tok, 0) + count

    def keep_most_frequent(self, num: int) -> None:
        """Drop all but the ``num`` n-grams seen most often (ties: the earliest added)."""
        if len(self.parts) > num:
            totals = sorted(self.parts, key=lambda ngram: sum(self.parts[ngram].values()), reverse=True)
            for ngram in totals[num:]:
                del self.parts[ngram]

    def nbytes(self) -> int:
        """Approximate memory: the keys, the part dicts and their entries."""
        total = sys.getsizeof(self.parts)
        for ngram, part in self.parts.items():
            total += sys.getsizeof(ngram) + sys.getsizeof(part) + 56 * len(part)  # two small ints per entry
        return total


# -- drafting ---------------------------------------------------------------------------------------------


def pick_token(counts: NgramCounts, ngrams: Sequence[tuple[int, ...]], static_part: dict[int, int],
               thresholds: Thresholds) -> int | None:
    """The next token after the longest of ``ngrams`` (shortest first) whose counts pass ``thresholds``.

    A candidate's score is its count times 100 x its static count (1 when the static tier
    does not know it); the best score must also hold ``min_percent`` of the samples.
    """
    for ngram in reversed(ngrams):
        part = counts.get(ngram)
        if part is None:
            continue
        if static_part:
            best, best_score = None, 0
            for tok, count in part.items():
                score = count * (100 * static_part[tok] if tok in static_part else 1)
                if score > best_score:
                    best, best_score = tok, score
        else:
            best = max(part, key=part.__getitem__)  # the first of the most frequent, in C
        total = sum(part.values())
        size = len(ngram) - 1
        if total >= thresholds.min_samples[size] and 100 * part[best] >= thresholds.min_percent[size] * total:
            return best
    return None


def pick_static(static_part: dict[int, int]) -> int | None:
    """The static tier alone: its most frequent next token, under the LAX thresholds for 2-grams."""
    if not static_part:
        return None
    best = max(static_part, key=static_part.__getitem__)
    total = sum(static_part.values())
    size = NGRAM_STATIC - 1
    if total < LAX.min_samples[size] or 100 * static_part[best] < LAX.min_percent[size] * total:
        return None
    return best


def draft_tokens(tokens: Sequence[int], max_tokens: int, context: NgramCounts, dynamic: NgramCounts,
                 static: NgramCounts) -> list[int]:
    """``common_ngram_cache_draft``: up to ``max_tokens`` tokens after ``tokens``, each from the first
    tier convinced (context with LAX, dynamic with STRICT, static alone), drafting on its own output."""
    if len(tokens) < NGRAM_STATIC:
        return []
    seq = [int(t) for t in tokens[-NGRAM_MAX:]]
    draft: list[int] = []
    while len(draft) < max_tokens:
        static_part = static.get(tuple(seq[-NGRAM_STATIC:])) or {}
        ngrams = [tuple(seq[-size:]) for size in range(NGRAM_MIN, min(NGRAM_MAX, len(seq)) + 1)]
        tok = pick_token(context, ngrams, static_part, LAX)
        if tok is None:
            tok = pick_token(dynamic, ngrams, static_part, STRICT)
        if tok is None:
            tok = pick_static(static_part)
        if tok is None:
            break
        draft.append(tok)
        seq.append(tok)
    return draft


# -- files ------------------------------------------------------------------------------------------------


def save_counts(counts: NgramCounts, path: str | Path) -> None:
    """Write ``counts`` in llama.cpp's layout; atomically, so a crash never leaves half a file."""
    path = Path(path)
    flat: list[int] = []
    for ngram, part in counts.parts.items():
        flat.extend(ngram)
        flat.extend([PAD] * (NGRAM_MAX - len(ngram)))
        flat.append(len(part))
        for tok, count in part.items():
            flat.extend((tok, min(count, INT32_MAX)))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        np.asarray(flat, dtype="<i4").tofile(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise NgramCacheFileError(f"cannot write the n-gram cache file {path}: {exc.strerror}") from None


def load_counts(path: str | Path, vocab_size: int | None = None) -> NgramCounts:
    """Read a file ``save_counts`` (or llama.cpp) wrote; NgramCacheFileError when it is unreadable or corrupt."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise NgramCacheFileError(f"cannot read the n-gram cache file {path}: {exc.strerror}") from None
    if len(raw) % 4:
        raise NgramCacheFileError(f"{path} is not an n-gram cache file: {len(raw)} bytes is not a whole "
                                  "number of int32 values")
    data = np.frombuffer(raw, dtype="<i4").tolist()
    counts = NgramCounts()
    i, record = 0, 0
    while i < len(data):
        problem = _check_record(data, i, vocab_size)
        if problem:
            raise NgramCacheFileError(f"{path} is not an n-gram cache file: record {record} {problem}")
        num = data[i + NGRAM_MAX]
        ngram = tuple(t for t in data[i : i + NGRAM_MAX] if t != PAD)
        pairs = data[i + NGRAM_MAX + 1 : i + NGRAM_MAX + 1 + 2 * num]
        part = counts.parts.setdefault(ngram, {})
        for tok, count in zip(pairs[::2], pairs[1::2], strict=True):
            part[tok] = part.get(tok, 0) + count
        i += NGRAM_MAX + 1 + 2 * num
        record += 1
    return counts


def _check_record(data: list[int], i: int, vocab_size: int | None) -> str | None:
    """What is wrong with the record starting at data[i], or None."""
    if i + NGRAM_MAX + 1 > len(data):
        return "is cut short"
    ngram, num = data[i : i + NGRAM_MAX], data[i + NGRAM_MAX]
    size = NGRAM_MAX - ngram.count(PAD)
    if size < NGRAM_MIN or any(t == PAD for t in ngram[:size]) or any(t < 0 for t in ngram[:size]):
        return f"has an invalid n-gram {ngram}"
    if num < 1 or i + NGRAM_MAX + 1 + 2 * num > len(data):
        return "is cut short" if num >= 1 else f"has {num} next tokens"
    pairs = data[i + NGRAM_MAX + 1 : i + NGRAM_MAX + 1 + 2 * num]
    if any(c < 1 for c in pairs[1::2]) or any(t < 0 for t in pairs[::2]):
        return "has a negative token or a count below 1"
    if vocab_size is not None and max(max(ngram[:size]), max(pairs[::2])) >= vocab_size:
        return f"holds a token id beyond this model's vocabulary ({vocab_size} tokens)"
    return None


class NgramCacheStore:
    """The tiers shared by every request of an engine: dynamic (learned) and static (read-only).

    path:        the dynamic tier's file: read here when it exists, written by ``save``.
    static_path: a static tier's file, read here (it must exist).
    Both are checked now, so a bad path fails at start-up rather than after a long session.
    """

    def __init__(self, path: str | None = None, static_path: str | None = None,
                 vocab_size: int | None = None, max_ngrams: int = MAX_DYNAMIC_NGRAMS) -> None:
        self.path = Path(path).expanduser() if path else None
        self.max_ngrams = max_ngrams
        self.dynamic = NgramCounts()
        self.static = load_counts(Path(static_path).expanduser(), vocab_size) if static_path else NgramCounts()
        if self.path is not None:
            if self.path.exists():
                self.dynamic = load_counts(self.path, vocab_size)
            if not self.path.parent.is_dir():
                raise NgramCacheFileError(f"cannot create the n-gram cache file {self.path}: "
                                          f"no folder {self.path.parent}")
            if not os.access(self.path.parent, os.W_OK):  # save() writes a new file there and renames it
                raise NgramCacheFileError(f"cannot write the n-gram cache file {self.path}: "
                                          f"folder {self.path.parent} is read-only")

    def add(self, counts: NgramCounts) -> None:
        """A finished request's context counts join the dynamic tier (llama.cpp's lookup does so at its end)."""
        self.dynamic.merge(counts)
        if len(self.dynamic) > self.max_ngrams:  # shrink with room to spare, so sorting stays rare
            self.dynamic.keep_most_frequent(self.max_ngrams * 3 // 4)

    def save(self) -> None:
        if self.path is not None:
            save_counts(self.dynamic, self.path)

    def clear(self) -> None:
        """Forget what earlier requests taught the dynamic tier (the static tier is not learned)."""
        self.dynamic = NgramCounts()

    def nbytes(self) -> int:
        return self.dynamic.nbytes() + self.static.nbytes()


class NgramCacheDrafter(IndexingDrafter):
    """``ngram-cache``: draft from this request's n-gram counts, then the engine's shared tiers.

    store: the engine's ``NgramCacheStore`` (a private, file-less one if None); at ``end`` the
           request's counts are merged into its dynamic tier.
    """

    name = "ngram-cache"

    def __init__(self, store: NgramCacheStore | None = None) -> None:
        super().__init__()
        self.store = store if store is not None else NgramCacheStore()
        self.context = NgramCounts()

    @classmethod
    def from_config(cls, spec: SpecConfig, store: NgramCacheStore | None = None) -> NgramCacheDrafter:
        """``store``: the engine's shared tiers."""
        return cls(store)

    @classmethod
    def shared_state(cls, setup: DraftSetup) -> SharedState:
        spec, target = setup.spec, setup.target
        store = NgramCacheStore(spec.ngram_cache_file, spec.ngram_cache_static,
                                target.vocab_size if target is not None else None)
        return SharedState(store, forget=store.clear, close=store.save, nbytes=store.nbytes)

    @classmethod
    def from_shared(cls, spec: SpecConfig, shared: NgramCacheStore, target: ModelRunner | None) -> NgramCacheDrafter:
        return cls.from_config(spec, store=shared)

    def _index(self, new_ids: Sequence[int]) -> None:
        # the n-grams that end in a new token start at most NGRAM_MAX tokens before it
        tail = self.seen.tokens[-(len(new_ids) + NGRAM_MAX) :].tolist()
        self.context.update(tail, len(new_ids))

    def _reset_index(self) -> None:
        self.context = NgramCounts()

    def propose(self, context: Sequence[int], max_tokens: int) -> DraftProposal:
        self._sync(context)
        draft = draft_tokens(self.seen.tokens, max_tokens, self.context, self.store.dynamic, self.store.static)
        return DraftProposal(draft) if draft else EMPTY

    def end(self, context: Sequence[int]) -> None:
        self._sync(context)
        self.store.add(self.context)
        self._restart([])
