"""llama.cpp's ``ngram-mod``: one fixed-size hash pool of n-grams shared by every sequence.

Each n-gram of ``n_match`` tokens is hashed (an LCG over its tokens, modulo the
pool size) to one slot, which stores the token that followed it most recently.
Drafting looks up the slot of the context's last n tokens, appends the stored
token, rolls the hash one token on, and repeats until a slot is empty::

    pool (n_match=2) after indexing [5 6 7 8 5 6]:
        slot(5 6) = 7, slot(6 7) = 8, slot(7 8) = 5, slot(8 5) = 6
    context [... 8 5 6]: slot(5 6) = 7, slot(6 7) = 8, slot(7 8) = 5, ... -> 7 8 5 6 7 ...

Memory and cost are constant (4M slots of int32, 16 MiB; O(1) per drafted token)
and the draft length is not fixed. The pool is shared by every request of an engine
(``DraftResources``), so one request drafts from what another wrote, as llama-server's
slots share theirs. Hash collisions and a stale slot only cost speed: the verifier
decides what is kept.

Like llama.cpp, a draft shorter than ``n_min`` is dropped, three drafts in a row
with less than half accepted empty the pool (its contents no longer predict this
text), and ``begin`` empties it once more than a quarter of its slots are used
(collisions would start to dominate). Unlike llama.cpp, which adds a sequence's new
n-grams in chunks of 32 tokens to save time, each committed token is indexed at once
(a few rolled hashes per step), so a repeat within the output is drafted from its
second occurrence on.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specdec.config import SpecConfig
from specdec.drafters.base import EMPTY, DraftProposal, DraftSetup, IndexingDrafter, SharedState
from specdec.runners.base import ModelRunner

POOL_SIZE = 4 * 1024 * 1024  # slots: llama.cpp's size, 16 MiB of int32
LCG_MULTIPLIER = 6364136223846793005  # Knuth's MMIX LCG, as llama.cpp's common_ngram_mod::idx
MASK64 = (1 << 64) - 1
SCALAR_ADD_MAX = 16  # up to this many new windows, rolling in Python beats numpy's setup
MAX_OCCUPANCY = 0.25  # begin() empties a pool fuller than this
LOW_ACCEPTANCE = 0.5  # a draft with fewer accepted than this share counts as a miss ...
MAX_LOW_STREAK = 3  # ... and this many misses in a row empty the pool


class NgramHashPool:
    """``common_ngram_mod``: hash of n tokens -> the token that followed them last (-1 = empty).

    Example (n=2)::

        pool.add(np.array([5, 6, 7, 8]))    # slots of (5 6) -> 7 and (6 7) -> 8
        pool.get([6, 7]) -> 8,  pool.get([7, 8]) -> -1
    """

    EMPTY = -1

    def __init__(self, n: int, size: int = POOL_SIZE) -> None:
        if n < 1 or size < 1:
            raise ValueError("the n-gram size and the pool size must be >= 1")
        self.n = n
        self.entries = np.full(size, self.EMPTY, dtype=np.int32)
        self.num_used = 0  # slots holding a token
        self._top = pow(LCG_MULTIPLIER, n - 1, 1 << 64)  # weight of a window's oldest token

    @property
    def size(self) -> int:
        return len(self.entries)

    @property
    def occupancy(self) -> float:
        return self.num_used / self.size

    def nbytes(self) -> int:
        return self.entries.nbytes

    def reset(self) -> None:
        self.entries.fill(self.EMPTY)
        self.num_used = 0

    def hash(self, tokens: Sequence[int]) -> int:
        """The 64-bit hash of n tokens: h = h * A + token over them, wrapping."""
        h = 0
        for tok in tokens:
            h = (h * LCG_MULTIPLIER + int(tok)) & MASK64
        return h

    def roll(self, h: int, oldest: int, newest: int) -> int:
        """The hash of the window moved on by one token: drop ``oldest``, append ``newest``."""
        return ((h - oldest * self._top) * LCG_MULTIPLIER + newest) & MASK64

    def get_hashed(self, h: int) -> int:
        return int(self.entries[h % self.size])

    def get(self, tokens: Sequence[int]) -> int:
        return self.get_hashed(self.hash(tokens))

    def add(self, tokens: np.ndarray) -> None:
        """Store, for every window tokens[i:i+n] with a token after it, that token (later wins)."""
        n, num = self.n, len(tokens) - self.n
        if num <= 0:
            return
        if num <= SCALAR_ADD_MAX:
            self._add_rolling(np.asarray(tokens)[-(n + num) :].tolist())
            return
        t = np.asarray(tokens, dtype=np.uint64)
        h = np.zeros(num, dtype=np.uint64)
        multiplier = np.uint64(LCG_MULTIPLIER)
        for j in range(n):  # n vector steps instead of a Python loop per window; uint64 wraps like C
            h = h * multiplier + t[j : j + num]
        slots = (h % np.uint64(self.size)).astype(np.int64)
        # Several windows may hit one slot: keep the latest, as llama.cpp's in-order writes do.
        slots_rev = slots[::-1]
        unique, first_rev = np.unique(slots_rev, return_index=True)
        values = t[n:][::-1][first_rev].astype(np.int32)
        self.num_used += int(np.count_nonzero(self.entries[unique] == self.EMPTY))
        self.entries[unique] = values

    def _add_rolling(self, tokens: list[int]) -> None:
        """``add`` for a few windows (a decoding step's): one hash, then rolled, in plain Python."""
        n = self.n
        h = self.hash(tokens[:n])
        for i in range(n, len(tokens)):
            slot = h % self.size
            self.num_used += int(self.entries[slot] == self.EMPTY)
            self.entries[slot] = tokens[i]
            h = self.roll(h, tokens[i - n], tokens[i])


class NgramModDrafter(IndexingDrafter):
    """``ngram-mod``: follow the shared hash pool from the context's last ``pool.n`` tokens.

    pool:  the engine's shared ``NgramHashPool`` (--spec-ngram-mod-n-match = its n).
    n_min: drop drafts shorter than this (--spec-ngram-mod-n-min, default 48).
    n_max: most tokens drafted (--spec-ngram-mod-n-max, default 64).

    The engine's per-step budget (--spec-draft-n-max, the batch budget, dynamic K) is
    usually below n_max; then n_min shrinks in the same proportion (48 of 64 -> 6 of 8),
    so a draft still has to reach the same share of its length to count.
    """

    name = "ngram-mod"

    def __init__(self, pool: NgramHashPool, n_min: int = 48, n_max: int = 64) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        super().__init__()
        self.pool = pool
        self.n_min = n_min
        self.n_max = n_max
        self._num_added = 0  # windows of this sequence already in the pool (llama.cpp's i_last)
        self._num_drafted = 0  # length of the last draft, for the acceptance streak
        self._low_streak = 0

    @classmethod
    def from_config(cls, spec: SpecConfig, pool: NgramHashPool | None = None) -> NgramModDrafter:
        """``pool``: the engine's shared pool (a private one if None)."""
        pool = pool if pool is not None else NgramHashPool(spec.ngram_mod_n_match)
        return cls(pool, n_min=spec.ngram_mod_n_min, n_max=spec.ngram_mod_n_max)

    @classmethod
    def shared_state(cls, setup: DraftSetup) -> SharedState:
        pool = NgramHashPool(setup.spec.ngram_mod_n_match)
        return SharedState(pool, forget=pool.reset, nbytes=pool.nbytes)

    @classmethod
    def from_shared(cls, spec: SpecConfig, shared: NgramHashPool, target: ModelRunner | None) -> NgramModDrafter:
        return cls.from_config(spec, pool=shared)

    def _index(self, new_ids: Sequence[int]) -> None:
        """Put the windows completed since the last add into the pool."""
        tokens = self.seen.tokens
        self.pool.add(tokens[self._num_added :])
        self._num_added = max(len(tokens) - self.pool.n, 0)

    def _reset_index(self) -> None:
        self._num_added = self._num_drafted = self._low_streak = 0

    def _restart(self, context: Sequence[int]) -> None:
        super()._restart(context)
        if self.pool.occupancy > MAX_OCCUPANCY:
            self.pool.reset()

    def propose(self, context: Sequence[int], max_tokens: int) -> DraftProposal:
        self._sync(context)
        self._num_drafted = 0
        n = self.pool.n
        tokens = self.seen.tokens
        budget = min(max_tokens, self.n_max)
        if len(tokens) < n or budget < 1:
            return EMPTY
        need = max(1, self.n_min * budget // self.n_max)
        window = tokens[-n:].tolist()
        h = self.pool.hash(window)
        draft: list[int] = []
        while len(draft) < budget:
            tok = self.pool.get_hashed(h)
            if tok == NgramHashPool.EMPTY:
                break
            draft.append(tok)
            window.append(tok)
            h = self.pool.roll(h, window[len(draft) - 1], tok)
        if len(draft) < need:
            return EMPTY
        self._num_drafted = len(draft)
        return DraftProposal(draft)

    def accept(self, context: Sequence[int], num_accepted: int) -> None:
        if self._num_drafted:
            if num_accepted < LOW_ACCEPTANCE * self._num_drafted:
                self._low_streak += 1
                if self._low_streak >= MAX_LOW_STREAK:
                    self.pool.reset()
                    self._low_streak = self._num_added = 0  # the next add re-indexes this whole sequence
            else:
                self._low_streak = 0
            self._num_drafted = 0
        self._sync(context)

    def end(self, context: Sequence[int]) -> None:
        self._sync(context)  # the last tokens join the pool for later requests
