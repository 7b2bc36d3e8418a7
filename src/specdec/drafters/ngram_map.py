"""Hash-map n-gram drafting: llama.cpp's ``ngram-map-k`` and ``ngram-map-k4v``.

Instead of scanning the context each step (``ngram``), these keep a dict from
every k-token *key* seen so far to where it was followed, updated as tokens
arrive: O(new tokens) per step and one dict lookup per proposal.

- ``ngram-map-k`` drafts the chain that followed the key's most recent occurrence.
- ``ngram-map-k4v`` tracks up to four *values* per key, told apart by the token
  that followed the key, and drafts them together as a tree whose node budget is
  shared in proportion to how often each value was seen.

Key size: llama.cpp reuses --spec-ngram-size-n (12) for the key. A hash key must
match exactly, so a 12-token key only fires on long verbatim repeats, which the
``ngram`` scan already finds; we default to k = 4, which still pins the context
down but also catches the short repeats a map is good at.

Like llama.cpp, both remember how many tokens were accepted the last time a key
drafted: the next draft from that key is at most that many plus one (a probe),
and a fully accepted draft lifts the limit again.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specdec.config import SamplingParams, SpecConfig
from specdec.drafters.base import EMPTY, DraftProposal, IndexingDrafter

DEFAULT_KEY_SIZE = 4


@dataclass(slots=True)
class ValueStats:
    """One value of a key: the token that followed it, how often, and where last."""

    count: int
    start: int  # position of that following token at its most recent occurrence


@dataclass(slots=True)
class KeyStats:
    """Every earlier occurrence of one key.

    count:  occurrences with at least one token after them.
    start:  position right after the most recent occurrence (where its continuation begins).
    values: next token -> ValueStats, at most ``num_values`` entries (ngram-map-k4v only).
    """

    count: int
    start: int
    values: dict[int, ValueStats] = field(default_factory=dict)


class NgramIndex:
    """Incremental map from each k-gram to the occurrences that have a continuation.

    ``update(tokens)`` indexes the positions added since the last call, where
    ``tokens`` is the whole (grown) sequence. A key is indexed once the token after
    it arrives, so the context's own last k tokens are never their own match.

    When a key already holds ``num_values`` values and a new next token appears, the
    value with the lowest (count, start) - rarest, then oldest - makes room for it.

    Example (k=2, num_values=4)::

        tokens = [7 8 1 7 8 2 7 8]
        index[(7, 8)] -> KeyStats(count=2, start=5,
                                  values={1: ValueStats(1, 2), 2: ValueStats(1, 5)})
        (the final 7 8 has no following token yet, so it is not counted)
    """

    def __init__(self, key_size: int, num_values: int = 0) -> None:
        if key_size < 1 or num_values < 0:
            raise ValueError("key_size must be >= 1 and num_values >= 0")
        self.key_size = key_size
        self.num_values = num_values
        self.keys: dict[tuple[int, ...], KeyStats] = {}
        self.num_indexed = 0  # tokens of the sequence seen so far

    def reset(self) -> None:
        self.keys.clear()
        self.num_indexed = 0

    def get(self, key: tuple[int, ...]) -> KeyStats | None:
        return self.keys.get(key)

    def update(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Index the occurrences completed by tokens[num_indexed:]."""
        k = self.key_size
        first = max(self.num_indexed, k)  # position of the first continuation token to index
        if first < len(tokens):
            window = np.asarray(tokens[first - k :]).tolist()  # Python ints hash fast
            for i in range(k, len(window)):
                self._add(tuple(window[i - k : i]), window[i], first + i - k)
        self.num_indexed = len(tokens)

    def _add(self, key: tuple[int, ...], next_token: int, start: int) -> None:
        stats = self.keys.get(key)
        if stats is None:
            stats = self.keys[key] = KeyStats(0, start)
        stats.count += 1
        stats.start = start
        if self.num_values == 0:
            return
        value = stats.values.get(next_token)
        if value is not None:
            value.count += 1
            value.start = start
            return
        if len(stats.values) >= self.num_values:
            weakest = min(stats.values, key=lambda t: (stats.values[t].count, stats.values[t].start))
            del stats.values[weakest]
        stats.values[next_token] = ValueStats(1, start)


def split_budget(counts: Sequence[int], available: Sequence[int], budget: int) -> list[int]:
    """Share ``budget`` draft nodes among branches seen ``counts`` times (D'Hondt method).

    Each node goes to the branch with the highest counts[i] / (nodes_i + 1) (ties to
    the earlier branch), never giving a branch more than available[i] nodes: a
    value seen twice as often gets about twice the depth.

    Example::

        split_budget([3, 1], [100, 100], 8) -> [6, 2]
        split_budget([3, 1], [2, 100], 8)   -> [2, 6]   (branch 0 runs out of context)
        split_budget([5, 1, 1, 1], [9] * 4, 3) -> [3, 0, 0, 0]
    """
    nodes = [0] * len(counts)
    heap = [(-c, i) for i, c in enumerate(counts) if available[i] > 0]
    heapq.heapify(heap)
    for _ in range(budget):
        if not heap:
            break
        _, i = heapq.heappop(heap)
        nodes[i] += 1
        if nodes[i] < available[i]:
            heapq.heappush(heap, (-counts[i] / (nodes[i] + 1), i))
    return nodes


def chains_to_proposal(chains: Sequence[Sequence[int]]) -> DraftProposal:
    """Merge token chains that all start after the root into one trie-shaped proposal.

    Shared prefixes become shared nodes, so siblings are always distinct tokens;
    a single chain stays a chain (parents=None).

    Example::

        chains_to_proposal([[5, 6, 7], [5, 9], [4]])
        -> token_ids [5, 6, 7, 9, 4], parents [0, 1, 2, 1, 0]
    """
    token_ids: list[int] = []
    parents: list[int] = []
    children: list[dict[int, int]] = [{}]  # children[node] = {token: node}; node 0 = root
    for chain in chains:
        node = 0
        for tok in chain:
            nxt = children[node].get(tok)
            if nxt is None:
                token_ids.append(tok)
                parents.append(node)
                children.append({})
                nxt = children[node][tok] = len(token_ids)
            node = nxt
    if not token_ids:
        return EMPTY
    return DraftProposal.from_tree(token_ids, parents)


class NgramMapDrafter(IndexingDrafter):
    """``ngram-map-k``: draft what followed the most recent occurrence of the last k tokens.

    key_size:   k, tokens in the lookup key (default 4; see the module docstring).
    max_tokens: most tokens proposed per step (--spec-ngram-size-m, default 48).
    min_hits:   the key must have occurred at least this often before (default 1).
    """

    name = "ngram-map-k"
    num_values = 0

    def __init__(self, key_size: int = DEFAULT_KEY_SIZE, max_tokens: int = 48, min_hits: int = 1) -> None:
        if max_tokens < 1 or min_hits < 1:
            raise ValueError("max_tokens and min_hits must be >= 1")
        super().__init__()
        self.key_size = key_size
        self.max_tokens = max_tokens
        self.min_hits = min_hits
        self.index = NgramIndex(key_size, self.num_values)
        self._caps: dict[tuple[int, ...], int] = {}  # key -> draft limit after a partial accept
        self._last: tuple[tuple[int, ...], int] | None = None  # (key, depth) of the last draft

    @classmethod
    def from_config(cls, spec: SpecConfig, key_size: int | None = None) -> NgramMapDrafter:
        """Key size defaults to min(--spec-ngram-size-n, 4)."""
        if key_size is None:
            key_size = min(spec.ngram_size_n, DEFAULT_KEY_SIZE)
        return cls(key_size=key_size, max_tokens=spec.ngram_size_m, min_hits=spec.ngram_min_hits)

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        self._last = None
        super().begin(prompt_ids, sampling)

    def _index(self, new_ids: Sequence[int]) -> None:
        self.index.update(self.seen.tokens)

    def _reset_index(self) -> None:
        self.index.reset()
        self._caps.clear()

    def propose(self, context: Sequence[int], max_tokens: int) -> DraftProposal:
        self._last = None
        self._sync(context)
        tokens = self.seen.tokens
        if len(tokens) < self.key_size:
            return EMPTY
        key = tuple(tokens[-self.key_size :].tolist())
        stats = self.index.get(key)
        if stats is None or stats.count < self.min_hits:
            return EMPTY
        budget = min(max_tokens, self.max_tokens, self._caps.get(key, self.max_tokens))
        proposal, depth = self._draft(tokens, stats, budget)
        if len(proposal):
            self._last = (key, depth)
        return proposal

    def _draft(self, tokens: np.ndarray, stats: KeyStats, budget: int) -> tuple[DraftProposal, int]:
        """The proposal for a found key, and its depth (longest path)."""
        draft = tokens[stats.start : stats.start + budget].tolist()
        return DraftProposal(draft), len(draft)

    def accept(self, context: Sequence[int], num_accepted: int) -> None:
        if self._last is not None:
            key, depth = self._last
            if num_accepted >= depth:
                self._caps.pop(key, None)
            else:
                self._caps[key] = num_accepted + 1
            self._last = None
        self._sync(context)


class NgramMapK4VDrafter(NgramMapDrafter):
    """``ngram-map-k4v``: up to four values per key, drafted together as a tree.

    Each value is the continuation of the key's most recent occurrence followed by
    that value's token; values are ordered by (count, recency) and share the node
    budget via ``split_budget``. One value gives a plain chain.

    Example (k=2)::

        context = [7 8 1 2 7 8 1 3 7 8 5 6 7 8], budget 4
        values of (7, 8): 1 seen twice (last at 6), 5 once (at 10)
        split_budget([2, 1], ..., 4) -> [3, 1]
        -> chains [1 3 7] and [5]: token_ids [1, 3, 7, 5], parents [0, 1, 2, 0]
    """

    name = "ngram-map-k4v"
    num_values = 4

    def _draft(self, tokens: np.ndarray, stats: KeyStats, budget: int) -> tuple[DraftProposal, int]:
        values = sorted(stats.values.values(), key=lambda v: (v.count, v.start), reverse=True)
        available = [len(tokens) - v.start for v in values]
        nodes = split_budget([v.count for v in values], available, budget)
        chains = [tokens[v.start : v.start + n].tolist() for v, n in zip(values, nodes, strict=True) if n]
        return chains_to_proposal(chains), max(nodes, default=0)
