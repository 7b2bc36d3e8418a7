"""The one interface every drafting method implements.

Life of a drafter within one request (one sequence)::

    drafter.begin(prompt_ids, sampling)
    loop:
        proposal = drafter.propose(context, max_tokens)   # context: every committed token
        ... target verifies ...
        drafter.accept(context, num_accepted)             # context now holds the new tokens
    drafter.end(context)                                   # request finished

``context[-1]`` is the *root*: the newest committed token, which the target has
not run yet. A proposal drafts tokens that follow the root.

Drafters never decide what is kept: the verifier does, so a buggy drafter can
only cost speed, never change the output.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.config import SamplingParams
from specdec.tree import DraftTree


@dataclass
class DraftProposal:
    """Drafted tokens that follow the root.

    token_ids: N drafted tokens. As a chain, token i follows token i-1.
    parents:   None for a chain; for a tree, parents[i] is the index of token i's
               parent in [root, *token_ids] (0 = the root), always < i + 1.
    probs:     [N, V] draft distribution q that token i was drawn from, or None for a
               deterministic drafter (q is one-hot at the proposed token). Siblings
               share a parent, and in a tree they must be distinct tokens.
    """

    token_ids: list[int]
    parents: list[int] | None = None
    probs: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def is_chain(self) -> bool:
        return self.parents is None or all(p == i for i, p in enumerate(self.parents))

    def truncate(self, n: int) -> DraftProposal:
        """The first n nodes: parents precede children, so a prefix of a tree is a tree."""
        if len(self) <= n:
            return self
        parents = None if self.parents is None else self.parents[:n]
        probs = None if self.probs is None else self.probs[:n]
        return DraftProposal(self.token_ids[:n], parents, probs)

    def first_path(self) -> DraftProposal:
        """The chain through each node's first child (for runners that verify chains only)."""
        if self.is_chain:
            return self
        tree = self.to_tree(0)
        node, keep = 0, []
        while tree.children[node]:
            node = tree.children[node][0]
            keep.append(node - 1)
        probs = None if self.probs is None else self.probs[keep]
        return DraftProposal([self.token_ids[i] for i in keep], probs=probs)

    def to_tree(self, root: int) -> DraftTree:
        if self.parents is None:
            return DraftTree.chain(root, self.token_ids)
        return DraftTree([root, *self.token_ids], [-1, *self.parents])


EMPTY = DraftProposal([])


class Drafter(ABC):
    """Proposes tokens for one sequence; holds that sequence's drafting state."""

    name: str = "drafter"

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        """Start a request whose committed tokens so far are ``prompt_ids``."""

    @abstractmethod
    def propose(self, context: Sequence[int], max_tokens: int) -> DraftProposal:
        """Draft at most ``max_tokens`` tokens after ``context[-1]`` (may be empty)."""

    def accept(self, context: Sequence[int], num_accepted: int) -> None:
        """``num_accepted`` drafted tokens were kept; ``context`` holds all committed tokens."""

    def end(self, context: Sequence[int]) -> None:
        """The request finished with ``context`` (e.g. add it to a cross-request cache)."""


class ChainedDrafter(Drafter):
    """llama.cpp's comma list: ask each drafter in turn; the first non-empty proposal wins."""

    def __init__(self, drafters: Sequence[Drafter]) -> None:
        if not drafters:
            raise ValueError("ChainedDrafter needs at least one drafter")
        self.drafters = list(drafters)
        self.name = ",".join(d.name for d in self.drafters)
        self.last_used: int | None = None

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        for d in self.drafters:
            d.begin(prompt_ids, sampling)

    def propose(self, context: Sequence[int], max_tokens: int) -> DraftProposal:
        for i, d in enumerate(self.drafters):
            proposal = d.propose(context, max_tokens)
            if len(proposal):
                self.last_used = i
                return proposal
        self.last_used = None
        return EMPTY

    def accept(self, context: Sequence[int], num_accepted: int) -> None:
        for i, d in enumerate(self.drafters):
            d.accept(context, num_accepted if i == self.last_used else 0)

    def end(self, context: Sequence[int]) -> None:
        for d in self.drafters:
            d.end(context)
