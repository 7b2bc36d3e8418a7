"""The one interface every drafting method implements.

Life of a drafter within one request (one sequence)::

    drafter.bind_slot(slot)                                # the target's cache slot of the request
    drafter.begin(prompt_ids, sampling)
    drafter.observe(target_hidden)                         # only drafters with hidden_layers: the prompt's
    loop:
        proposal = drafter.propose(context, max_tokens)   # context: every committed token
        ... target verifies ...
        drafter.observe(target_hidden)                     # ... and the kept path's target states
        drafter.accept(context, num_accepted)             # context now holds the new tokens
    drafter.end(context)                                   # request finished

``context[-1]`` is the *root*: the newest committed token, which the target has
not run yet. A proposal drafts tokens that follow the root.

Drafters never decide what is kept: the verifier does, so a buggy drafter can
only cost speed, never change the output.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from specdec.config import SamplingParams, SpecConfig
from specdec.monitor import WindowSums
from specdec.tree import DraftTree, is_chain


@dataclass
class DraftProposal:
    """Drafted tokens that follow the root.

    token_ids: N drafted tokens. As a chain, token i follows token i-1.
    parents:   None for a chain; for a tree, parents[i] is the index of token i's
               parent in [root, *token_ids] (0 = the root), always < i + 1.
    probs:     [N, V] draft distribution q that token i was drawn from, or None for a
               deterministic drafter (q is one-hot at the proposed token). Siblings
               share a parent, and in a tree they must be distinct tokens.
    origins:   None when ``drafter`` proposed every token; else each token's drafter (a tree
               merged from several drafters' proposals, see ``drafters.adaptive``).
    """

    token_ids: list[int]
    parents: list[int] | None = None
    probs: torch.Tensor | None = None
    drafter: str = ""  # the name of the drafter that proposed it (set by a chain; else the engine's)
    origins: list[str] | None = None

    @classmethod
    def from_tree(cls, token_ids: list[int], parents: list[int]) -> DraftProposal:
        """A tree-shaped proposal, stored as a chain (``parents`` None) when it is one."""
        return cls(token_ids, None if is_chain([-1, *parents]) else parents)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def is_chain(self) -> bool:
        return self.parents is None or is_chain([-1, *self.parents])

    def truncate(self, n: int) -> DraftProposal:
        """The first n nodes: parents precede children, so a prefix of a tree is a tree."""
        if len(self) <= n:
            return self
        parents = None if self.parents is None else self.parents[:n]
        probs = None if self.probs is None else self.probs[:n]
        origins = None if self.origins is None else self.origins[:n]
        return DraftProposal(self.token_ids[:n], parents, probs, self.drafter, origins)

    def first_path(self) -> DraftProposal:
        """The chain through each node's first child (for runners that verify chains only)."""
        if self.is_chain:
            return self
        tree = self.to_tree(0)
        path = tree.walk(lambda node: tree.children[node][0] if tree.children[node] else None)
        keep = [node - 1 for node in path[1:]]
        probs = None if self.probs is None else self.probs[keep]
        origins = None if self.origins is None else [self.origins[i] for i in keep]
        return DraftProposal([self.token_ids[i] for i in keep], probs=probs, drafter=self.drafter, origins=origins)

    def origin_of(self, index: int) -> str:
        """The drafter of token ``index``."""
        return self.drafter if self.origins is None else self.origins[index]

    @property
    def depth(self) -> int:
        """Tokens on the longest path (the length of a chain)."""
        if self.is_chain:
            return len(self)
        return max(self.to_tree(0).depths)

    def to_tree(self, root: int) -> DraftTree:
        if self.parents is None:
            return DraftTree.chain(root, self.token_ids)
        return DraftTree([root, *self.token_ids], [-1, *self.parents])


EMPTY = DraftProposal([])


class Drafter(ABC):
    """Proposes tokens for one sequence; holds that sequence's drafting state."""

    name: str = "drafter"
    # Target layers whose hidden states the drafter reads (``ModelRunner.run`` indexing); the
    # engine then asks the runner for them and calls ``observe``. Empty: the drafter reads tokens only.
    hidden_layers: tuple[int, ...] = ()

    @classmethod
    def from_config(cls, spec: SpecConfig, **shared: object) -> Drafter:
        """A drafter for one request, set up from the speculation settings.

        ``shared`` holds the engine-wide objects the registry offers every drafter
        (``cache``: the SuffixCache; ``ngram_mod``: the n-gram hash pool; ``ngram_cache``:
        the n-gram counts; ``runner``: the draft model's runner; ``target``: the target's runner;
        ``layerskip``: the layer-skip search); each drafter takes what
        it needs and ignores the rest.
        """
        raise TypeError(f"{cls.__name__} cannot be built from a SpecConfig")

    def bind_slot(self, slot: int) -> None:
        """The target's KV cache slot of this request, given by the engine before ``begin``. Only a
        drafter that drafts with the target itself reads it (draft-layerskip, which must leave the
        slot's length as it found it)."""

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        """Start a request whose committed tokens so far are ``prompt_ids``."""

    def observe(self, target_hidden: Mapping[int, torch.Tensor]) -> None:
        """The target's hidden states of the next tokens it cached, in order: layer -> [n, H].

        Called after the prefill (every prompt token but the last) and after each verify (the
        root and the accepted tokens), before ``accept``: together they cover every committed
        token but the newest. Only called when ``hidden_layers`` is not empty.
        """

    @abstractmethod
    def propose(self, context: Sequence[int], max_tokens: int) -> DraftProposal:
        """Draft at most ``max_tokens`` tokens after ``context[-1]`` (may be empty)."""

    def accept(self, context: Sequence[int], num_accepted: int) -> None:
        """``num_accepted`` drafted tokens were kept; ``context`` holds all committed tokens."""

    def end(self, context: Sequence[int]) -> None:
        """The request finished with ``context`` (e.g. add it to a cross-request cache)."""

    def windows(self) -> dict[str, WindowSums]:
        """Recent acceptance of each drafter this one chooses among (the adaptive drafter's members)."""
        return {}

    def catch_up_seconds(self, context: Sequence[int]) -> float:
        """What the next ``propose`` would spend before drafting: a draft model's pass over the
        context it has not seen (the whole prompt, at a request's first draft). 0 when negligible
        or unknown; the adaptive drafter weighs it against what the request's rest could save."""
        return 0.0

    def planned_alpha(self, alpha: float) -> float | None:
        """The acceptance the engine's batch planner should expect of the next draft, given the
        sequence monitor's ``alpha``; None: nothing will be proposed, so plan no rows for it."""
        return alpha

    # -- catching up with the context, for drafters that index the tokens they have seen ----------

    def _sync(self, context: Sequence[int]) -> None:
        """Bring the drafter's state up to ``context``: index only what it adds, or start over.

        ``context`` normally extends what was seen (the tokens committed since the last
        call are new). When it is shorter, or disagrees at the last seen token, a
        different sequence started without ``begin``: the drafter restarts from it.

        Example: having seen [5, 6, 7], ``_sync([5, 6, 7, 8])`` calls ``_extend([8])``;
        ``_sync([9, 9])`` calls ``_restart([9, 9])``.
        """
        num_seen, last_seen = self._seen()
        if len(context) < num_seen or (num_seen and context[num_seen - 1] != last_seen):
            self._restart(context)
        else:
            self._extend(context[num_seen:])

    def _seen(self) -> tuple[int, int | None]:
        """(number of tokens seen, the last of them or None): the hook ``_sync`` compares."""
        return 0, None

    def _extend(self, new_ids: Sequence[int]) -> None:
        """Index tokens that follow the ones seen."""

    def _restart(self, context: Sequence[int]) -> None:
        """Forget the sequence seen and index ``context`` as a new one."""


class ChainedDrafter(Drafter):
    """llama.cpp's comma list: ask each drafter in turn; the first non-empty proposal wins."""

    def __init__(self, drafters: Sequence[Drafter]) -> None:
        if not drafters:
            raise ValueError("ChainedDrafter needs at least one drafter")
        self.drafters = list(drafters)
        self.name = ",".join(d.name for d in self.drafters)
        self.hidden_layers = tuple(sorted({i for d in self.drafters for i in d.hidden_layers}))
        self.last_used: int | None = None

    def bind_slot(self, slot: int) -> None:
        for d in self.drafters:
            d.bind_slot(slot)

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        for d in self.drafters:
            d.begin(prompt_ids, sampling)

    def observe(self, target_hidden: Mapping[int, torch.Tensor]) -> None:
        for d in self.drafters:  # every member: one that did not propose still follows the context
            if d.hidden_layers:
                d.observe(target_hidden)

    def propose(self, context: Sequence[int], max_tokens: int) -> DraftProposal:
        for i, d in enumerate(self.drafters):
            proposal = d.propose(context, max_tokens)
            if len(proposal):
                self.last_used = i
                proposal.drafter = proposal.drafter or d.name
                return proposal
        self.last_used = None
        return EMPTY

    def accept(self, context: Sequence[int], num_accepted: int) -> None:
        for i, d in enumerate(self.drafters):
            d.accept(context, num_accepted if i == self.last_used else 0)

    def end(self, context: Sequence[int]) -> None:
        for d in self.drafters:
            d.end(context)
