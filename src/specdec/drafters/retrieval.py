"""retrieval: REST (He et al., NAACL 2024): drafts from a datastore of text the model did not write.

Each step the context's longest suffix (at most ``max_match`` tokens, at least ``min_match``)
that occurs in the datastore (``specdec.datastore``: a suffix array over a tokenized corpus)
is looked up, and the continuations that follow its occurrences are drafted as a trie of
the most frequent ones, verified as one tree. Unlike suffix decoding it reads a fixed
corpus, not the request's own history, so it drafts from the first token of an answer.

Deterministic (q one-hot): the trie is a function of the context and the datastore, so any
cut by count or length is lossless (verify.py's rule binds sampled drafts only).

Drafting cost: a binary search over match lengths (monotone: if the last m tokens occur,
so do the last m - 1), each a binary search over the suffix array, then one sub-range
search per trie node. ``scripts/retrieval_cost.py`` measures it in microseconds per step.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass

from specdec.config import SpecConfig
from specdec.datastore import Datastore, tokenizer_identity
from specdec.drafters.base import EMPTY, Drafter, DraftProposal, DraftSetup, SharedState
from specdec.log import get_logger
from specdec.runners.base import ModelRunner

logger = get_logger(__name__)


@dataclass(frozen=True)
class Match:
    """The longest suffix of the context found in the store: its length and range of ``sa``."""

    length: int
    lo: int
    hi: int

    @property
    def count(self) -> int:
        return self.hi - self.lo


def longest_match(store: Datastore, tail: Sequence[int], min_match: int, max_match: int) -> Match | None:
    """The longest suffix of ``tail`` of min_match..max_match tokens that occurs in ``store``, or None.

    Example: store "a b c a b d", tail [x, a, b]: [x, a, b] does not occur, [a, b] does (twice):
    Match(2, lo, lo + 2).
    """
    tail = list(tail[-max_match:])
    if len(tail) < min_match or not store.occurs(tail[-min_match:]):
        return None
    lo, hi = min_match, len(tail)  # lo occurs; find the largest length that does
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if store.occurs(tail[-mid:]):
            lo = mid
        else:
            hi = mid - 1
    start, end = store.find(tail[-lo:])
    return Match(lo, start, end)


def continuation_trie(store: Datastore, match: Match, budget: int, min_prob: float, max_depth: int,
                      ) -> tuple[list[int], list[int]]:
    """The ``budget`` most frequent continuations of ``match`` as a trie, best first: (token_ids, parents)
    with parents indexing [root, *token_ids]. A node's probability is its count over the match's count;
    nodes below ``min_prob`` or deeper than ``max_depth`` are left out. Best first, so any prefix of the
    result is the likeliest trie of that size (the engine may truncate it).

    Worked example: the match [a, b] occurs 4 times, followed by "c d", "c d", "c e", "f" (each then
    a document's end):

        counts: c 3/4, f 1/4; under c: d 2/4, e 1/4
        budget 3, min_prob 0.2 -> pops c (.75), d (.5), then f and e tie at .25: f, pushed first
        token_ids [c, d, f], parents [0, 1, 0]
        budget 4 -> also e: [c, d, f, e], parents [0, 1, 0, 1]
        min_prob 0.3 -> f and e are left out: [c, d], parents [0, 1]
    """
    token_ids: list[int] = []
    parents: list[int] = []
    order = itertools.count()  # tie-break: first pushed, first taken
    heap: list[tuple[int, int, int, int, int, int, int]] = []

    def push_children(lo: int, hi: int, depth: int, parent: int) -> None:
        if depth >= max_depth:
            return
        for token, a, b in store.next_tokens(lo, hi, match.length + depth):
            if (b - a) >= min_prob * match.count:
                heapq.heappush(heap, (-(b - a), next(order), token, a, b, depth + 1, parent))

    push_children(match.lo, match.hi, 0, 0)
    while heap and len(token_ids) < budget:
        _, _, token, a, b, depth, parent = heapq.heappop(heap)
        token_ids.append(token)
        parents.append(parent)
        push_children(a, b, depth, len(token_ids))
    return token_ids, parents


class RetrievalDrafter(Drafter):
    """``retrieval``: the trie of the datastore's most frequent continuations of the longest suffix match.

    store:      the engine's loaded ``Datastore`` (shared by every request; read only).
    max_tokens: most tokens proposed per step (the engine's budget caps it further).
    min_match:  shortest suffix matched (default 2: one token's continuations are too many to rank).
    max_match:  longest suffix tried (default 16, REST's).
    min_prob:   leave out continuations seen after less than this share of the matches (default 0.05).
    tree:       False drafts the likeliest chain only (for runners that verify chains).
    """

    name = "retrieval"
    lookup = True  # stateless between steps: the store is fixed and the match is found from the context

    def __init__(self, store: Datastore, max_tokens: int = 16, min_match: int = 2, max_match: int = 16,
                 min_prob: float = 0.05, tree: bool = True) -> None:
        if not 1 <= min_match <= max_match < store.depth or max_tokens < 1 or not 0 <= min_prob <= 1:
            raise ValueError(f"retrieval needs 1 <= min match <= max match < the store's depth {store.depth}, "
                             f"max tokens >= 1 and 0 <= min prob <= 1; got {min_match}, {max_match}, "
                             f"{max_tokens}, {min_prob}")
        self.store = store
        self.max_tokens, self.min_match, self.max_match = max_tokens, min_match, max_match
        self.min_prob, self.tree = min_prob, tree

    @classmethod
    def from_config(cls, spec: SpecConfig, store: Datastore | None = None, tree: bool = True) -> RetrievalDrafter:
        if store is None:
            raise ValueError("retrieval needs a loaded datastore (--spec-datastore; see DraftResources)")
        return cls(store, max_tokens=spec.draft_n_max, tree=tree)

    @classmethod
    def shared_state(cls, setup: DraftSetup) -> SharedState:
        return SharedState(load_datastore(setup.spec.datastore, setup.target, setup.tokenizer))

    @classmethod
    def from_shared(cls, spec: SpecConfig, shared: Datastore, target: ModelRunner | None) -> RetrievalDrafter:
        return cls.from_config(spec, store=shared, tree=target is not None and target.supports_trees)

    def propose(self, context: Sequence[int], max_tokens: int) -> DraftProposal:
        budget = min(max_tokens, self.max_tokens)
        if budget <= 0:
            return EMPTY
        match = longest_match(self.store, context[-self.max_match:], self.min_match, self.max_match)
        if match is None:
            return EMPTY
        depth = self.store.depth - match.length  # the suffix order is exact on ``depth`` tokens
        if self.tree:
            token_ids, parents = continuation_trie(self.store, match, budget, self.min_prob, depth)
        else:
            token_ids, parents = self._chain(match, budget, depth)
        return DraftProposal.from_tree(token_ids, parents) if token_ids else EMPTY

    def _chain(self, match: Match, budget: int, max_depth: int) -> tuple[list[int], list[int]]:
        """The likeliest child at each depth (ties: the smaller token id), down to ``min_prob``."""
        token_ids: list[int] = []
        lo, hi = match.lo, match.hi
        while len(token_ids) < min(budget, max_depth):
            options = self.store.next_tokens(lo, hi, match.length + len(token_ids))
            if not options:
                break
            token, a, b = max(options, key=lambda o: (o[2] - o[1], -o[0]))
            if b - a < self.min_prob * match.count:
                break
            token_ids.append(token)
            lo, hi = a, b
        return token_ids, list(range(len(token_ids)))


def load_datastore(path: str, target: ModelRunner, tokenizer) -> Datastore:
    """--spec-datastore, checked against the target's tokenizer (its vocabulary size alone when no
    tokenizer is loaded, as for token-id tests); DatastoreError (one line) when it does not fit.
    Read once while the file is unchanged: retrieval and --spec-draft-vocab-size share it."""
    try:
        stat = os.stat(path)
        store = _read_datastore(os.path.realpath(path), stat.st_mtime_ns, stat.st_size)
    except OSError:
        store = Datastore.load(path)  # (its one-line error)
    store.check_tokenizer(tokenizer_identity(tokenizer) if tokenizer is not None else None, target.vocab_size,
                          where=path)
    return store


@functools.lru_cache(maxsize=1)
def _read_datastore(path: str, mtime_ns: int, size: int) -> Datastore:
    store = Datastore.load(path)
    logger.warning("specdec: retrieval datastore %s: %s tokens from %s", path, f"{store.num_tokens:,}",
                   store.sources or "token ids")
    return store
