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

The look-up drafters (the n-gram family, suffix, draft-self) derive from
``IndexingDrafter``, which mirrors the committed tokens and hands each only the
new ones to index.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from specdec.config import SamplingParams, SpecConfig
from specdec.monitor import WindowSums
from specdec.runners.base import ModelRunner
from specdec.tree import DraftTree, is_chain


@dataclass(frozen=True)
class DraftProposal:
    """Drafted tokens that follow the root; frozen: a step that changes one builds a new one
    (``dataclasses.replace``), so a proposal a drafter returned is never altered behind it.

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
    def from_tree(cls, token_ids: list[int], parents: list[int], *, probs: torch.Tensor | None = None,
                  drafter: str = "", origins: list[str] | None = None) -> DraftProposal:
        """A tree-shaped proposal, stored as a chain (``parents`` None) when it is one."""
        return cls(token_ids=token_ids, parents=None if is_chain([-1, *parents]) else parents, probs=probs,
                   drafter=drafter, origins=origins)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def is_chain(self) -> bool:
        return self.parents is None or is_chain([-1, *self.parents])

    def truncate(self, n: int) -> DraftProposal:
        """The first n nodes: parents precede children, so a prefix of a tree is a tree."""
        if len(self) <= n:
            return self
        return replace(self, token_ids=self.token_ids[:n],
                       parents=None if self.parents is None else self.parents[:n],
                       probs=None if self.probs is None else self.probs[:n],
                       origins=None if self.origins is None else self.origins[:n])

    def first_path(self) -> DraftProposal:
        """The chain through each node's first child (for runners that verify chains only)."""
        if self.is_chain:
            return self
        tree = self.to_tree(0)
        path = tree.walk(lambda node: tree.children[node][0] if tree.children[node] else None)
        keep = [node - 1 for node in path[1:]]
        return replace(self, token_ids=[self.token_ids[i] for i in keep], parents=None,
                       probs=None if self.probs is None else self.probs[keep],
                       origins=None if self.origins is None else [self.origins[i] for i in keep])

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


EMPTY = DraftProposal(token_ids=[])


@dataclass(frozen=True)
class DraftSetup:
    """What an engine's shared drafter state is built from (``Drafter.shared_state``); the arguments
    of ``registry.DraftResources``."""

    spec: SpecConfig
    target: ModelRunner | None  # None only in tests of drafters that read the context alone
    tokenizer: Any  # the target's (None when the engine runs on token ids)
    max_num_seqs: int = 1
    dtype: str = "float32"
    device: str | None = None
    target_model: str | None = None
    kv_cache_dtype: str = "auto"  # a draft model's, as the target's (runners.load.KV_CACHE_DTYPES)


def _nothing() -> None:
    pass


@dataclass(frozen=True)
class SharedState:
    """Engine-wide state one kind of drafter reads (a cache learned across requests, a loaded model):
    built once per engine by the kind's ``Drafter.shared_state`` and handed to each new drafter of the
    kind (``Drafter.from_shared``). The hooks say what the engine does with it besides."""

    value: Any
    forget: Callable[[], None] = _nothing  # empty what earlier requests taught it: the next starts cold
    forget_prefixes: Callable[[], None] = _nothing  # drop the prompts its own KV cache keeps (a draft model's)
    close: Callable[[], None] = _nothing  # save what must outlive the process
    nbytes: Callable[[], int] | None = None  # memory held, where known (the bench reports it)


class Drafter(ABC):
    """Proposes tokens for one sequence; holds that sequence's drafting state."""

    name: str = "drafter"
    # Target layers whose hidden states the drafter reads (``ModelRunner.run`` indexing); the
    # engine then asks the runner for them and calls ``observe``. Empty: the drafter reads tokens only.
    hidden_layers: tuple[int, ...] = ()
    # A look-up drafter: its drafts are a function of the context (q one-hot) and it catches up on the
    # context at its next propose, so a step it sat out needs no ``accept`` (the n-gram family, suffix,
    # draft-self, retrieval). The adaptive drafter dry-runs such a member's probes instead of verifying them.
    lookup: bool = False
    # A drafter that switches its own proposals on and off (adaptive: a monitor per member, dry-run probes,
    # floors priced by what a row costs). The engine's sequence monitor then keeps its window without
    # switching: a second switch with a fixed 0.4 floor and its one-miss probes held adaptive off at T=0.7.
    switches_itself: bool = False

    @classmethod
    def from_config(cls, spec: SpecConfig) -> Drafter:
        """A drafter for one request, set up from the speculation settings.

        A drafter that reads engine-wide state takes it as typed keyword arguments after ``spec``
        (``SuffixDrafter.from_config(spec, cache=...)``); its class declares that state
        (``shared_state``), which ``registry.DraftResources`` builds once and hands over (``from_shared``).
        """
        raise TypeError(f"{cls.__name__} cannot be built from a SpecConfig")

    @classmethod
    def shared_state(cls, setup: DraftSetup) -> SharedState | None:
        """The state every drafter of this kind shares across an engine's requests, built once per
        engine by ``registry.DraftResources``; None (the default): each reads its context alone."""
        return None

    @classmethod
    def from_shared(cls, spec: SpecConfig, shared: Any, target: ModelRunner | None) -> Drafter:
        """A drafter for one request, handed ``shared_state``'s value (None without one) and the
        engine's target; a kind with shared state overrides it to pass that on to ``from_config``."""
        return cls.from_config(spec)

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

    def token_seconds(self) -> float | None:
        """What drafting one token costs, where it is known before any was drafted (a draft model: its timed
        1-token pass); None: unknown, and the adaptive drafter prices the member by what its asks take."""
        return None

    def planned_alpha(self, alpha: float) -> float | None:
        """The acceptance the engine's batch planner should expect of the next draft, given the
        sequence monitor's ``alpha``; None: nothing will be proposed, so plan no rows for it."""
        return alpha


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
                return proposal if proposal.drafter else replace(proposal, drafter=d.name)
        self.last_used = None
        return EMPTY

    def accept(self, context: Sequence[int], num_accepted: int) -> None:
        for i, d in enumerate(self.drafters):
            d.accept(context, num_accepted if i == self.last_used else 0)

    def end(self, context: Sequence[int]) -> None:
        for d in self.drafters:
            d.end(context)

    def windows(self) -> dict[str, WindowSums]:
        return {name: w for d in self.drafters for name, w in d.windows().items()}

    def catch_up_seconds(self, context: Sequence[int]) -> float:
        # the next propose may ask every member in turn, so each may have to catch up first
        return sum(d.catch_up_seconds(context) for d in self.drafters)

    def token_seconds(self) -> float | None:
        # what its members' drafted tokens cost, where every one of them knows
        known = [d.token_seconds() for d in self.drafters]
        return None if None in known else max(known)

    def planned_alpha(self, alpha: float) -> float | None:
        # None only when no member will propose: then the chain proposes nothing either
        plans = [d.planned_alpha(alpha) for d in self.drafters]
        return None if all(p is None for p in plans) else alpha


# -- drafters that index the tokens they have seen ------------------------------------------------


class TokenBuffer:
    """An append-only int64 numpy mirror of one request's committed tokens.

    An ``IndexingDrafter`` extends it with only the tokens added since its last ``_sync``,
    so it never converts the whole (growing) context list each step.

    Example::

        buf = TokenBuffer()
        buf.extend([5, 6, 7])
        buf.extend([8])
        buf.tokens  -> array([5, 6, 7, 8])
        buf.last    -> 8
    """

    def __init__(self, capacity: int = 1024) -> None:
        self._data = np.empty(max(capacity, 16), dtype=np.int64)
        self._len = 0

    def __len__(self) -> int:
        return self._len

    @property
    def tokens(self) -> np.ndarray:
        """[len] view of the tokens (valid until the next extend)."""
        return self._data[: self._len]

    @property
    def last(self) -> int | None:
        """The newest token, or None when empty."""
        return int(self._data[self._len - 1]) if self._len else None

    def reset(self) -> None:
        self._len = 0

    def extend(self, new_ids: Sequence[int]) -> None:
        n = self._len
        new = np.asarray(new_ids, dtype=np.int64)
        end = n + len(new)
        if end > len(self._data):
            grown = np.empty(max(end, 2 * len(self._data)), dtype=np.int64)
            grown[:n] = self._data[:n]
            self._data = grown
        self._data[n:end] = new
        self._len = end


class IndexingDrafter(Drafter):
    """A drafter that drafts from an index of the committed tokens it has seen (the n-gram,
    suffix and self-history look-ups).

    It owns the mirror of the context, ``seen``, and keeps it and the index up to date:
    ``begin`` starts a sequence, ``accept`` and every ``_sync`` (which ``propose`` calls
    first) add only the tokens committed since. A subclass says how to index:

    - ``_index(new_ids)``: index tokens just appended to ``seen``;
    - ``_reset_index()``: drop the index of the previous sequence (``seen`` already holds the
      new one's first tokens, which ``_index`` gets next).
    """

    lookup = True

    def __init__(self) -> None:
        self.seen = TokenBuffer()

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        self._restart(prompt_ids)

    def accept(self, context: Sequence[int], num_accepted: int) -> None:
        self._sync(context)

    def _sync(self, context: Sequence[int]) -> None:
        """Bring ``seen`` and the index up to ``context``: index only what it adds, or start over.

        ``context`` normally extends what was seen (the tokens committed since the last
        call are new). When it is shorter, or disagrees at the last seen token, a
        different sequence started without ``begin``: the drafter restarts from it.

        Example: having seen [5, 6, 7], ``_sync([5, 6, 7, 8])`` calls ``_index([8])``;
        ``_sync([9, 9])`` calls ``_reset_index()`` then ``_index([9, 9])``.
        """
        num_seen, last_seen = len(self.seen), self.seen.last
        if len(context) < num_seen or (num_seen and context[num_seen - 1] != last_seen):
            self._restart(context)
        else:
            new_ids = context[num_seen:]
            self.seen.extend(new_ids)
            self._index(new_ids)

    def _restart(self, context: Sequence[int]) -> None:
        """Forget the sequence seen and index ``context`` as a new one."""
        self.seen.reset()
        self.seen.extend(context)
        self._reset_index()
        self._index(context)

    def _index(self, new_ids: Sequence[int]) -> None:
        """Index ``new_ids``, the tokens just appended to ``seen``."""

    def _reset_index(self) -> None:
        """Drop the previous sequence's index; ``seen`` holds the new sequence's first tokens."""
