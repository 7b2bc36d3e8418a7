"""Draft trees: candidate continuations verified in one target pass.

A tree is stored flat, in topological order. Node 0 is the *root*: the last
committed token, whose KV is not yet in the cache. Nodes 1..N are drafted
tokens; ``parents[i]`` is the index of node i's parent (``parents[0] == -1``).

Example: root r with two continuations "a b" and "c"::

    tokens  = [r, a, b, c]
    parents = [-1, 0, 1, 0]
    depths  = [0, 1, 2, 1]      -> rope positions = cache_len + depth
    paths   = [[0, 1, 2], [0, 3]]

A chain of K drafted tokens is the tree with ``parents = [-1, 0, 1, ..., K-1]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


def is_chain(parents: Sequence[int]) -> bool:
    """Whether ``parents`` (root first, ``parents[0] == -1``) make one chain: node i's parent is i - 1.

    Example: [-1, 0, 1] -> True; [-1, 0, 0] (two children of the root) -> False.
    """
    return all(p == i - 1 for i, p in enumerate(parents))


@dataclass
class DraftTree:
    tokens: list[int]
    parents: list[int]
    depths: list[int] = field(init=False)
    children: list[list[int]] = field(init=False)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents) or not self.tokens:
            raise ValueError("tokens and parents must be non-empty and of equal length")
        if self.parents[0] != -1:
            raise ValueError("node 0 must be the root (parent -1)")
        self.depths = [0] * len(self.tokens)
        self.children = [[] for _ in self.tokens]
        for i in range(1, len(self.tokens)):
            p = self.parents[i]
            if not 0 <= p < i:
                raise ValueError(f"parent of node {i} must precede it, got {p}")
            self.depths[i] = self.depths[p] + 1
            self.children[p].append(i)

    @classmethod
    def chain(cls, root: int, draft_ids: list[int]) -> DraftTree:
        return cls([root, *draft_ids], [-1, *range(len(draft_ids))])

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return is_chain(self.parents)

    def child_with(self, node: int, token: int) -> int | None:
        """The first child of ``node`` holding ``token``, or None."""
        return next((c for c in self.children[node] if self.tokens[c] == token), None)

    def walk(self, choose: Callable[[int], int | None]) -> list[int]:
        """Node indices from the root down, moving to ``choose(node)`` until it returns None.

        Example: for the tree of the module docstring, choosing "the child holding
        the true next token" with truth [a, b, x] walks [0, 1, 2]; with [c, ...], [0, 3].
        """
        node, path = 0, [0]
        while (nxt := choose(node)) is not None:
            node = nxt
            path.append(node)
        return path

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to ``node`` inclusive."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]
