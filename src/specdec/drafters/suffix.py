"""Suffix decoding: draft the most frequent continuations of the context's longest suffix match.

After SuffixDecoding (arXiv 2411.04975) and Snowflake Arctic Inference's suffix
decoding (also in vLLM). Two suffix tries are searched each step:

- a *local* trie over the current request's prompt and output, and
- a *global* trie (``SuffixCache``) over finished requests, shared across
  requests and bounded by FIFO eviction.

In each, we find the longest suffix of the context that occurred before, then
expand the continuations seen after it, most frequent first, while the estimated
probability (product of count ratios along the path) stays above ``min_prob``;
the trie with the higher expected acceptance (sum of node probabilities) wins.

Like Arctic, a draft is at most ``max_spec_factor`` times the match length, so a
one-token match cannot launch a long guess; twice it, not Arctic's and vLLM's once: on
Qwen2.5-Coder-1.5B, greedy, six Spec-Bench chat groups, tau 1.376 -> 1.423 and code edits
2.295 -> 2.410 (at T=0.7 a tie over two seed sets; docs/performance.md, thirty-seventh session).
"""

from __future__ import annotations

import heapq
import itertools
import sys
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from specdec.config import SpecConfig
from specdec.drafters.base import EMPTY, DraftProposal, DraftSetup, IndexingDrafter, SharedState
from specdec.runners.base import ModelRunner

SEP = -1  # ends a sequence in a trie's text; never a token id

# Where a walk stands: (node, 0) at a materialised node, or (None, pos) inside a
# leaf's virtual path, whose next token is text[pos].
Cursor = tuple["_Node | None", int]


class _Node:
    """A trie node. ``children`` is None for a leaf, whose continuation is read from the text."""

    __slots__ = ("count", "ref", "children")

    def __init__(self, count: int, ref: int, children: dict[int, _Node] | None = None) -> None:
        self.count = count  # occurrences of this node's path
        self.ref = ref  # text position right after the path's most recent occurrence
        self.children = children


@dataclass
class SuffixDraft:
    """A drafted trie: parents index into [root, *token_ids]; score = sum of node probabilities."""

    token_ids: list[int]
    parents: list[int]
    score: float
    match_len: int


class SuffixTrie:
    """Occurrence counts of every substring of up to ``max_depth`` tokens of a growing text.

    Built lazily, so memory is about one node per token rather than max_depth:
    a path seen once is a *leaf* that stores where its occurrence continues in
    the text (``ref``) instead of a chain of nodes; when a second occurrence
    reaches a leaf, the leaf grows real children one level at a time. Each new
    token extends the suffixes that are still on shared (materialised) paths,
    at most ``max_depth`` of them, and usually far fewer.

    Several sequences can share one trie: ``close()`` ends the current one (its
    last suffixes stop there), and ``remove_prefix`` evicts the oldest ones.

    Example (max_depth=3)::

        trie.extend([1, 2, 3, 1, 2, 4])
        trie.count([1, 2]) -> 2,   trie.count([2, 3]) -> 1,   trie.count([3, 2]) -> 0
        the node for [1, 2] has children {3: 1 time, 4: 1 time}; [2, 3] is a leaf whose
        single occurrence continues at text position 3 (token 1).
    """

    def __init__(self, max_depth: int = 24) -> None:
        if max_depth < 2:
            raise ValueError(f"max_depth must be >= 2, got {max_depth}")
        self.max_depth = max_depth
        self.root = _Node(0, 0, {})
        self._text = array("q")
        self._base = 0  # absolute position of _text[0]; earlier tokens were evicted
        self._pending: list[tuple[_Node, int]] = []  # (node, depth) of suffixes on shared paths

    @property
    def end(self) -> int:
        """Absolute position one past the last stored token."""
        return self._base + len(self._text)

    def token_at(self, pos: int) -> int:
        return self._text[pos - self._base]

    def tail(self, n: int) -> list[int]:
        """The last ``n`` stored tokens (SEP included if the text was just closed)."""
        return self._text[max(len(self._text) - n, 0) :].tolist()

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens to the current sequence, counting every new suffix occurrence."""
        for tok in tokens:
            pos = self.end
            self._text.append(tok)
            self.root.count += 1
            pending = []
            for node, depth in (*self._pending, (self.root, 0)):  # stays deepest first
                child = self._step(node, depth, tok, pos)
                if child is not None:
                    pending.append((child, depth + 1))
            self._pending = pending

    def _step(self, node: _Node, depth: int, tok: int, pos: int) -> _Node | None:
        """Extend a suffix whose path ends at materialised ``node`` by ``tok`` (at ``pos``).

        Returns the child if the suffix is still on a shared path below max_depth.
        """
        child = node.children.get(tok)
        if child is None:
            node.children[tok] = _Node(1, pos + 1)  # first occurrence: a leaf
            return None
        child.count += 1
        below_max = depth + 1 < self.max_depth
        if below_max and child.children is None:
            # A second occurrence reaches a leaf: give it the old occurrence's next
            # token as a real child (old <= pos, so that token is already stored).
            old = child.ref
            child.children = {}
            old_tok = self.token_at(old)
            if old_tok != SEP:
                child.children[old_tok] = _Node(1, old + 1)
        child.ref = pos + 1
        return child if below_max else None

    def close(self) -> None:
        """End the current sequence: nothing later continues its suffixes."""
        self._text.append(SEP)
        self._pending = []

    def remove_prefix(self, num: int) -> None:
        """Evict the oldest ``num`` stored positions: whole closed sequences, SEPs included.

        Evicting oldest-first keeps every remaining ``ref`` valid: a path's most
        recent occurrence is only evicted together with all its others.
        """
        if self._pending or num > len(self._text) or self._text[num - 1] != SEP:
            raise ValueError("remove_prefix needs whole closed sequences")
        stop = self._base + num
        for start in range(self._base, stop):
            if self.token_at(start) != SEP:
                self._remove_suffix(start)
        del self._text[:num]
        self._base = stop

    def _remove_suffix(self, start: int) -> None:
        """Uncount the suffix occurrence starting at ``start``."""
        node = self.root
        node.count -= 1
        for pos in range(start, start + self.max_depth):
            tok = self.token_at(pos)
            if tok == SEP:
                return
            child = node.children[tok]
            child.count -= 1
            if child.count == 0:  # that was its only occurrence: drop the whole branch
                del node.children[tok]
                return
            if child.children is None:
                return
            node = child

    def nbytes(self) -> int:
        """Approximate bytes of the trie: its nodes, their child dicts, and its token text."""
        total = self._text.itemsize * len(self._text)
        stack = [self.root]
        while stack:
            node = stack.pop()
            total += sys.getsizeof(node)
            if node.children is not None:
                total += sys.getsizeof(node.children)
                stack.extend(node.children.values())
        return total

    def _walk(self, pattern: Sequence[int]) -> tuple[_Node, int | None] | None:
        """Follow ``pattern`` from the root: (last node, virtual position or None), or None."""
        node = self.root
        for i, tok in enumerate(pattern):
            if node.children is None:  # inside a leaf: compare with its one occurrence
                pos = node.ref - self._base
                rest = pattern[i:]
                if self._text[pos : pos + len(rest)].tolist() != list(rest):
                    return None
                return node, node.ref + len(rest)
            node = node.children.get(tok)
            if node is None:
                return None
        return node, None

    def count(self, pattern: Sequence[int]) -> int:
        """Occurrences of ``pattern`` (1 <= len <= max_depth) in the stored sequences."""
        if not 1 <= len(pattern) <= self.max_depth:
            raise ValueError(f"pattern length must be in [1, {self.max_depth}]")
        found = self._walk(pattern)
        return 0 if found is None else found[0].count

    def _continues(self, cursor: Cursor) -> bool:
        node, pos = cursor
        if node is not None:
            return bool(node.children)
        return pos < self.end and self.token_at(pos) != SEP

    def longest_match(self, context_tail: Sequence[int]) -> tuple[int, Cursor | None]:
        """Longest suffix of ``context_tail`` (at most max_depth - 1 tokens) that continues.

        Binary search works because the property is monotone: if the last m tokens
        occurred followed by x, so did the last m - 1. Costs O(max_depth log max_depth).
        Returns (match length, cursor), or (0, None).
        """
        lo, hi = 0, min(self.max_depth - 1, len(context_tail))
        best = None
        while lo < hi:
            mid = (lo + hi + 1) // 2
            found = self._walk(context_tail[len(context_tail) - mid :])
            cursor = None
            if found is not None:
                node, pos = found
                cursor = (None, pos) if pos is not None else _after(node)
            if cursor is None or not self._continues(cursor):
                hi = mid - 1
            else:
                lo, best = mid, cursor
        return lo, best

    def longest_own_match(self) -> tuple[int, Cursor | None]:
        """``longest_match`` for the trie's own text tail, in O(1).

        The suffixes of the text still on shared paths are exactly those that
        occurred before; the deepest of them is the longest match. Each earlier
        occurrence left a child, unless only a closed sequence's end followed it.
        """
        for node, depth in self._pending:  # deepest first
            if node.children:
                return depth, (node, 0)
        return 0, None

    def _next(self, cursor: Cursor) -> list[tuple[int, float, int, Cursor]]:
        """(token, probability, recency, cursor after it) for each way ``cursor`` continues."""
        node, pos = cursor
        if node is None:
            if pos < self.end and (tok := self.token_at(pos)) != SEP:
                return [(tok, 1.0, pos, (None, pos + 1))]
            return []
        total = sum(c.count for c in node.children.values())
        return [(t, c.count / total, c.ref, _after(c)) for t, c in node.children.items()]

    def expand(
        self, cursor: Cursor, budget: int, min_prob: float, tree: bool, match_len: int = 0
    ) -> SuffixDraft:
        """Best-first expansion below ``cursor``: up to ``budget`` nodes of probability >= min_prob.

        A node's probability is the product of count ratios from the cursor; as a
        chain (tree=False) only the likeliest child is followed (ties: most recent).
        Past max_depth the draft follows the path's most recent occurrence.

        Example: after the match, children {a: 3, b: 1}; a's only child c (1 of 1)::

            tree=False, budget 3 -> [a, c],    probs 0.75, 0.75
            tree=True,  budget 3 -> [a, c, b], parents [0, 1, 0], probs 0.75, 0.75, 0.25
        """
        token_ids: list[int] = []
        parents: list[int] = []
        score = 0.0
        order = itertools.count()  # heap tie-break: first pushed, first taken
        heap: list[tuple[float, int, int, Cursor, int]] = []

        def push_children(at: Cursor, prob: float, parent: int) -> None:
            options = self._next(at)
            if not tree and options:
                options = [max(options, key=lambda o: (o[1], o[2]))]
            for tok, p, _, after in options:
                if prob * p >= min_prob:
                    heapq.heappush(heap, (-prob * p, next(order), tok, after, parent))

        push_children(cursor, 1.0, 0)
        while heap and len(token_ids) < budget:
            neg_prob, _, tok, after, parent = heapq.heappop(heap)
            token_ids.append(tok)
            parents.append(parent)
            score -= neg_prob
            push_children(after, -neg_prob, len(token_ids))
        return SuffixDraft(token_ids, parents, score, match_len)


def _after(node: _Node) -> Cursor:
    """The cursor just past ``node``: the node itself, or its leaf's virtual continuation."""
    return (node, 0) if node.children is not None else (None, node.ref)


class SuffixCache:
    """Finished requests, indexed in one ``SuffixTrie`` shared by every request's drafter.

    Bounded by ``max_sequences`` and ``max_tokens`` (tokens stored, separators not
    counted); when either is exceeded the oldest sequences are evicted (FIFO,
    which keeps the trie's references valid, see ``SuffixTrie.remove_prefix``).
    A sequence longer than ``max_tokens`` keeps only its last ``max_tokens``.
    """

    def __init__(self, max_depth: int = 24, max_sequences: int = 1024, max_tokens: int = 1 << 16) -> None:
        if max_sequences < 1 or max_tokens < 1:
            raise ValueError("max_sequences and max_tokens must be >= 1")
        self.trie = SuffixTrie(max_depth)
        self.max_sequences = max_sequences
        self.max_tokens = max_tokens
        self.num_tokens = 0
        self._lengths: deque[int] = deque()  # tokens of each stored sequence, oldest first

    def __len__(self) -> int:
        return len(self._lengths)

    def clear(self) -> None:
        """Forget every stored sequence."""
        self.trie = SuffixTrie(self.trie.max_depth)
        self.num_tokens = 0
        self._lengths.clear()

    def nbytes(self) -> int:
        """Approximate memory of the stored sequences (see ``SuffixTrie.nbytes``)."""
        return self.trie.nbytes()

    def add(self, tokens: Sequence[int]) -> None:
        tokens = list(tokens)[-self.max_tokens :]
        if not tokens:
            return
        self.trie.extend(tokens)
        self.trie.close()
        self._lengths.append(len(tokens))
        self.num_tokens += len(tokens)
        while len(self._lengths) > self.max_sequences or self.num_tokens > self.max_tokens:
            oldest = self._lengths.popleft()
            self.trie.remove_prefix(oldest + 1)  # + its separator
            self.num_tokens -= oldest


class SuffixDrafter(IndexingDrafter):
    """``suffix``: frequency-ranked continuations of the longest suffix match.

    cache:           shared ``SuffixCache`` of finished requests (a private one if None).
                     Each request adds its output plus the last max_depth - 1 prompt
                     tokens, which is all a later request needs to match the prompt's
                     end and copy the answer; whole prompts would crowd the cache.
    max_depth:       local trie depth: longest suffix matched is max_depth - 1
                     (default 24, Arctic's and vLLM's default).
    max_tokens:      most tokens proposed per step (default 32).
    min_prob:        stop expanding below this estimated probability (default 0.1, vLLM's).
    max_spec_factor: a draft is at most this many times the match length (default 2.0).
    tree:            propose a tree of alternatives instead of a chain (default False).
    """

    name = "suffix"

    def __init__(
        self,
        cache: SuffixCache | None = None,
        max_depth: int = 24,
        max_tokens: int = 32,
        min_prob: float = 0.1,
        max_spec_factor: float = 2.0,
        tree: bool = False,
    ) -> None:
        if max_tokens < 1 or not 0 <= min_prob <= 1 or max_spec_factor <= 0:
            raise ValueError("need max_tokens >= 1, 0 <= min_prob <= 1, max_spec_factor > 0")
        super().__init__()
        self.cache = cache if cache is not None else SuffixCache(max_depth)
        self.max_depth = max_depth
        self.max_tokens = max_tokens
        self.min_prob = min_prob
        self.max_spec_factor = max_spec_factor
        self.tree = tree
        self._local = SuffixTrie(max_depth)
        self._prompt_len = 0

    @classmethod
    def from_config(cls, spec: SpecConfig, cache: SuffixCache | None = None, tree: bool = False) -> SuffixDrafter:
        """``cache``: the engine's shared SuffixCache."""
        return cls(cache=cache, max_tokens=spec.draft_n_max, tree=tree)

    @classmethod
    def shared_state(cls, setup: DraftSetup) -> SharedState:
        cache = SuffixCache()  # one per engine: each request drafts from the ones that finished before it
        return SharedState(cache, forget=cache.clear, nbytes=cache.nbytes)

    @classmethod
    def from_shared(cls, spec: SpecConfig, shared: SuffixCache, target: ModelRunner | None) -> SuffixDrafter:
        return cls.from_config(spec, cache=shared)

    def _reset_index(self) -> None:
        # Also a new sequence seen without begin(): all of it counts as prompt.
        self._local = SuffixTrie(self.max_depth)
        self._prompt_len = len(self.seen)

    def _index(self, new_ids: Sequence[int]) -> None:
        self._local.extend(new_ids)

    def propose(self, context: Sequence[int], max_tokens: int) -> DraftProposal:
        self._sync(context)
        budget = min(max_tokens, self.max_tokens)
        shared = self.cache.trie
        matches = [
            (self._local, *self._local.longest_own_match()),
            (shared, *shared.longest_match(self._local.tail(shared.max_depth - 1))),
        ]
        best: SuffixDraft | None = None
        for trie, match_len, cursor in matches:
            if cursor is None:
                continue
            limit = min(budget, max(1, int(self.max_spec_factor * match_len)))
            draft = trie.expand(cursor, limit, self.min_prob, self.tree, match_len)
            # Ties go to the longer (more specific) match, then to the local trie.
            if draft.token_ids and (
                best is None or (draft.score, draft.match_len) > (best.score, best.match_len)
            ):
                best = draft
        if best is None:
            return EMPTY
        return DraftProposal.from_tree(best.token_ids, best.parents)

    def end(self, context: Sequence[int]) -> None:
        self._sync(context)
        start = max(self._prompt_len - (self.cache.trie.max_depth - 1), 0)
        self.cache.add(context[start:])
        self._restart([])
