"""``--spec-type adaptive``: ask several drafters, verify the draft worth most per second.

No drafter wins everywhere (n-gram look-up on code edits, suffix trees on
translation, a draft model on open text), and which one is right changes within
one answer. Each step this drafter asks its members, then builds one draft from
their proposals:

1. Every proposal is merged into one trie: a token two drafters agree on is one
   node, supported by both (``OfferTrie``).
2. A node is kept with probability 1 - prod(1 - alpha_d) over its supporters
   (siblings share at most 1), where alpha_d is drafter d's recent per-token
   acceptance on this sequence. Its *reach* (the product down its path) is what
   it adds to the expected committed tokens.
3. The draft is the n best-reach nodes (a subtree, since reach falls along a
   path) for the n that maximises expected tokens per second of the verify
   pass, ``(1 + sum of reach) / c(n + 1)`` with c the measured ``PassCost``.

So one drafter's proposal is picked when the others add little, and a tree of
several when their disagreement is worth verifying. Every member is scored on
every step against what the target committed, verified or not (a proposal that
agrees with the committed tokens for m tokens and then differs had m accepted
and 1 rejected; one that agrees all along was never contradicted), and a member
whose recent alpha falls below ``min_acceptance`` (once pass costs are measured: below
what a row and the member's drafting cost, ``_floor``), whose draft seconds cost more
than its tokens save, or whose drafts verified alone realized less than plain
decoding (timed steps), is not asked until its back-off ends (``SpecMonitor``).
What members realized is pooled across an engine's requests (``Ledger``): a member
that did not pay starts the next request off.

A look-up member's probe is a dry run: its proposal is scored against what the
target commits next and never verified. Its q is one-hot, so the target's draw
equals its token x with probability p(x), the verifier's chance of keeping x:
the dry run measures what a verified probe would, without a pass's extra rows
(at temperature 1 and batch 4 a row costs a fifth of a pass and probes were
most of what adaptive lost). A sampled request's look-up members start so, as
probes, unless they were on when the last sampled request ended (``Ledger``):
nothing of theirs is verified before dry runs have kept tokens (unless
``min_acceptance`` is 0, which never switches a member off). A probe that finds
nothing looks again as soon as its dry runs stay cheap beside the pass.

Losslessness: the verifier decides, as for any drafter. Deterministic proposals
(q one-hot) merge freely: siblings are distinct tokens, and recursive rejection
over one-hot q is sampling without replacement. A sampled proposal (a draft
model's or an EAGLE head's q) is never merged with others when the target
samples, since its q would not describe the merged node; under greedy
verification q is unused. Nor is it priced by its trie: whether and how much of
it is verified follows from its member's alpha, the budget and the pass costs
(``planned_length``), fixed before it drew a token (verify.py's rule).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate

import torch

from specdec.budget import expected_tokens
from specdec.config import SamplingParams, SpecConfig
from specdec.drafters.base import EMPTY, Drafter, DraftProposal, DraftSetup, SharedState
from specdec.monitor import Mode, SlidingSums, SpecMonitor, WindowSums
from specdec.pass_cost import PassCost, acceptance_floor
from specdec.runners.base import ModelRunner

# The share of a step's pass a look-up member's dry runs may cost while its probes find nothing
# (``AdaptiveDrafter._probe_wait``).
DRY_SHARE = 0.003


@dataclass(frozen=True)
class Offer:
    """One member's proposal this step, and its recent acceptance."""

    drafter: str
    alpha: float
    proposal: DraftProposal


@dataclass
class OfferTrie:
    """Proposals merged: node 0 is the root; shared prefixes are shared nodes (parents before children)."""

    tokens: list[int] = field(default_factory=lambda: [-1])
    parents: list[int] = field(default_factory=lambda: [-1])
    owners: list[str] = field(default_factory=lambda: [""])  # the first (best) drafter proposing the node
    reach: list[float] = field(default_factory=lambda: [1.0])  # chance the node is kept
    sources: list[tuple[int, int]] = field(default_factory=lambda: [(-1, -1)])  # (offer, its node index)
    _miss: list[float] = field(default_factory=lambda: [1.0])  # prod(1 - alpha) over the node's supporters
    _children: list[dict[int, int]] = field(default_factory=lambda: [{}])

    @classmethod
    def merge(cls, offers: Sequence[Offer]) -> OfferTrie:
        """Offers in the order given (best first: its nodes come first and own shared ones).

        Example: ngram [5, 6, 7] (alpha 0.8) and suffix [5, 9] (alpha 0.5) ->
        tokens [5, 6, 7, 9] under the root, parents [0, 1, 2, 1]; node 5 is supported by
        both, so it is kept with probability 1 - 0.2 * 0.5 = 0.9.
        """
        trie = cls()
        for o, offer in enumerate(offers):
            p = offer.proposal
            where = [0]  # proposal node (root first) -> trie node
            for i, tok in enumerate(p.token_ids):
                parent = where[i if p.parents is None else p.parents[i]]
                where.append(trie._add(parent, tok, offer, (o, i)))
        trie._compute_reach()
        return trie

    def _add(self, parent: int, token: int, offer: Offer, source: tuple[int, int]) -> int:
        node = self._children[parent].get(token)
        if node is None:
            node = len(self.tokens)
            self._children[parent][token] = node
            self.tokens.append(token)
            self.parents.append(parent)
            self.owners.append(offer.drafter)
            self.sources.append(source)
            self.reach.append(0.0)
            self._miss.append(1.0)
            self._children.append({})
        self._miss[node] *= 1.0 - offer.alpha
        return node

    def _compute_reach(self) -> None:
        for node in range(len(self.tokens)):
            kept = [1.0 - self._miss[c] for c in self._children[node].values()]
            scale = 1.0 / max(1.0, sum(kept))  # siblings are exclusive: at most one is kept
            for c, k in zip(self._children[node].values(), kept, strict=True):
                self.reach[c] = self.reach[node] * k * scale

    def __len__(self) -> int:
        return len(self.tokens) - 1

    def best(self, max_nodes: int, cost: PassCost | None) -> tuple[list[int], float]:
        """The nodes to verify and their expected tokens per second of the pass.

        The n most likely nodes for the best n <= max_nodes (none when plain decoding is
        faster). Before pass costs are measured: all max_nodes of them, rated by expected
        tokens alone. For deterministic proposals only (a sampled one: ``planned_length``).
        """
        order = sorted(range(1, len(self.tokens)), key=lambda node: (-self.reach[node], node))[:max_nodes]
        if not measured(cost):
            return sorted(order), 1.0 + sum(self.reach[node] for node in order)
        best_n, best_rate = _best_length(list(accumulate((self.reach[node] for node in order), initial=1.0))[1:], cost)
        return sorted(order[:best_n]), best_rate

    def proposal(self, nodes: list[int]) -> DraftProposal:
        """The chosen nodes (sorted, so parents first) as one deterministic proposal with each token's drafter."""
        if not nodes:
            return EMPTY
        index = {node: i + 1 for i, node in enumerate(nodes)}  # trie node -> proposal node (root 0)
        owners = [self.owners[n] for n in nodes]
        names = list(dict.fromkeys(owners))
        return DraftProposal.from_tree([self.tokens[n] for n in nodes], [index.get(self.parents[n], 0) for n in nodes],
                                       drafter="+".join(names), origins=owners if len(names) > 1 else None)


def measured(cost: PassCost | None) -> bool:
    """Whether ``cost`` prices every width yet (it needs two measured widths)."""
    return cost is not None and cost.measured


def choose(offers: Sequence[Offer], max_tokens: int, cost: PassCost | None, greedy: bool) -> DraftProposal:
    """The draft from these offers (best alpha first) with most expected tokens per second; EMPTY
    when plain decoding is worth more. Sampled offers stay alone unless verification is greedy.

    A sampled offer is priced and cut by ``planned_length`` (its alpha, ``max_tokens`` and the pass
    costs: all known before it drew a token), never by its trie: its length and an EAGLE tree's shape
    follow its own sampled tokens, so a rate read from them made whether x1 is verified depend on x1
    (verify.py's rule; a chain that p-min stopped after x1 was dropped where a longer one was kept).
    Deterministic offers are functions of the context, so their trie may decide freely."""
    offers = sorted(offers, key=lambda o: -o.alpha)
    if greedy:
        offers = [Offer(o.drafter, o.alpha, _without_probs(o.proposal)) for o in offers]
    best, best_rate = EMPTY, float("-inf")
    mergeable = [o for o in offers if o.proposal.probs is None]
    if mergeable:
        trie = OfferTrie.merge(mergeable)
        nodes, best_rate = trie.best(max_tokens, cost)
        best = trie.proposal(nodes) if nodes else EMPTY
        best_rate = best_rate if nodes else float("-inf")
    for o in offers:
        if o.proposal.probs is None:
            continue
        n, rate = planned_length(o.alpha, max_tokens, cost)
        if n and rate > best_rate:
            # The first n nodes: a prefix in node order, and a node's index never depends on its
            # own token (a chain's trivially; an EAGLE tree takes nodes by rank, see dynamic_tree).
            best, best_rate = replace(o.proposal.truncate(n), drafter=o.drafter, origins=None), rate
    return best


def planned_length(alpha: float, max_tokens: int, cost: PassCost | None) -> tuple[int, float]:
    """(n, rate) for a sampled member: the n <= max_tokens maximising expected tokens per second
    of a chain kept with ``alpha`` per token (0: plain decoding is faster), and that rate; all
    max_tokens, rated by expected tokens, before pass costs are measured. An EAGLE tree is priced
    as the chain of its size (low, for a tree): the price must not read the tree's drawn shape.

    Example: alpha 0.5, costs c(1) = 1, c(2) = 1.2, c(3) = 1.6: n = 1 (1.5 / 1.2 = 1.25 > 1 and
    > 1.75 / 1.6)."""
    if not measured(cost):
        return max_tokens, expected_tokens(alpha, max_tokens)
    return _best_length([expected_tokens(alpha, n) for n in range(1, max_tokens + 1)], cost)


def _best_length(expected: Sequence[float], cost: PassCost) -> tuple[int, float]:
    """The n (0: plain decoding) whose expected committed tokens ``expected[n - 1]`` per second of
    an (n + 1)-row pass is highest, and that rate (a trie's best nodes and a sampled member alike)."""
    best_n, best_rate = 0, 1.0 / cost.estimate(1)
    for n, tokens in enumerate(expected, start=1):
        rate = tokens / cost.estimate(n + 1)
        if rate > best_rate:
            best_n, best_rate = n, rate
    return best_n, best_rate


def _running_mean(mean: float | None, value: float, weight: float = 0.3) -> float:
    """A recent mean that starts at the first value (from 0 it priced a member's first asks at a
    fraction of their cost)."""
    return value if mean is None else mean + weight * (value - mean)


def _without_probs(p: DraftProposal) -> DraftProposal:
    return p if p.probs is None else replace(p, probs=None)


def replay(proposal: DraftProposal, committed: Sequence[int]) -> tuple[int, int]:
    """(accepted, tested) of a proposal against the tokens the target committed after the root.

    Example: [5, 6, 7] vs committed [5, 6, 9] -> (2, 3); vs [5, 6] -> (2, 2) (7 untested).
    """
    tree = proposal.to_tree(-1)
    path = tree.walk(lambda node: tree.child_with(node, committed[tree.depths[node]])
                     if tree.depths[node] < len(committed) else None)
    accepted = len(path) - 1
    rejected = accepted < len(committed) and bool(tree.children[path[-1]])
    return accepted, accepted + int(rejected)


@dataclass
class Ledger:
    """What each member's drafts verified alone realized (timed samples, ``AdaptiveDrafter.accept``),
    pooled across an engine's requests, and each member's back-off when its last request ended.

    A fresh adaptive drafter serves each request and its members' monitors start on, so a draft model
    that does not pay on this machine's text (Qwen2.5-Coder 0.5B for the 1.5B on Zen 4's chat
    prompts: 0.8x plain) was asked again in every request until three timed drafts switched it off,
    and again after each back-off. A member whose pooled speedup is below 1x starts a request off,
    with the back-off it had (a probe that fails again doubles it; one that pays turns it on). After
    ``fresh_after`` requests in a row that timed a member nothing, its samples go: a member kept off by
    what it realized gets a fresh look, as late for one timed 3 times as for one timed 16 (dropping a
    sample every 4th such request gave the 0.5B draft, timed 3-5 times per prompt catch-up, a new catch-up
    every 4-8 requests: 0.3-0.8 s of drafting in each of four Spec-Bench groups of 3 requests)."""

    window: int = 16
    fresh_after: int = 64
    timed: dict[str, SlidingSums] = field(default_factory=dict)
    backoff: dict[str, int] = field(default_factory=dict)
    untimed: dict[str, int] = field(default_factory=dict)  # requests in a row that timed nothing, by member
    live: int = 1  # sequences the last decode pass carried, whose dry runs share a step (``count_step``)
    sampled_on: dict[str, bool] = field(default_factory=dict)  # look-up members on when a sampled request ended

    _step: int = -1  # the decode pass the accepts being counted follow
    _accepts: int = 0

    def count_step(self, step: int) -> None:
        """One sequence's ``accept`` after decode pass ``step`` (its target's ``PassCost.passes``): ``live``
        becomes how many accepted after the pass before. Counted, not requests begun minus ended: a request
        that fails in the server never ends its drafter."""
        if step != self._step:
            if self._step >= 0:
                self.live = max(1, self._accepts)
            self._step, self._accepts = step, 0
        self._accepts += 1

    def record(self, name: str, sample: WindowSums) -> None:
        self.timed.setdefault(name, SlidingSums(self.window)).append(sample)
        self.untimed[name] = 0

    def age(self, name: str) -> None:
        """A request ended without timing ``name``: the ``fresh_after``-th in a row empties its samples."""
        self.untimed[name] = self.untimed.get(name, 0) + 1
        if name in self.timed and self.untimed[name] >= self.fresh_after:
            self.timed[name].clear()
            self.untimed[name] = 0

    def speedup(self, name: str, min_samples: int) -> float | None:
        """The member's pooled speedup over its last ``window`` timed drafts; None below ``min_samples``."""
        timed = self.timed.get(name)
        return timed.sums.speedup if timed is not None and len(timed) >= min_samples else None


@dataclass
class Member:
    drafter: Drafter
    monitor: SpecMonitor
    draft_seconds: float | None = None  # recent seconds per propose (a running mean from its first ask)
    dry_seconds: float | None = None  # recent seconds per dry run (``AdaptiveDrafter._probe_wait``)
    token_seconds: float | None = None  # a model member's recent seconds per drafted token (an empty ask: one;
    # before its first ask: ``Drafter.token_seconds``, a draft model's timed pass)
    drafted_share: float | None = None  # recent share of its asks that drafted anything (None: not asked yet)
    offered: DraftProposal | None = None  # this step's proposal (None: not asked, or nothing)
    asked: bool = False
    sampled: bool = False  # its last proposal carried q (a model drafting for a sampled request)
    dry: DraftProposal | None = None  # a probe's dry run, made at context length ``dry_at``
    dry_at: int = 0
    owed: float = 0.0  # seconds of prompt catch-up not yet charged to the ledger (``AdaptiveDrafter.accept``)

    @property
    def lookup(self) -> bool:
        """A look-up member (``Drafter.lookup``: an ``IndexingDrafter``, retrieval): its q is one-hot, so its
        probes are dry runs, and it catches up on the context at its next propose, so a step it sat out
        needs no ``accept``."""
        return self.drafter.lookup

    @property
    def dry_probe(self) -> bool:
        """A look-up member probing: its next draft is a dry run (``AdaptiveDrafter._dry_run``)."""
        return self.monitor.mode is Mode.PROBE and self.lookup

    @property
    def verified(self) -> bool:
        """Whether its drafts go to the target now: on, or probing a model member (a draft with q
        scores differently against the committed tokens than the verifier keeps it)."""
        return self.monitor.mode is Mode.ON or (self.monitor.mode is Mode.PROBE and not self.lookup)


class AdaptiveDrafter(Drafter):
    """Asks its members each step and verifies the best pick or merge of their proposals."""

    name = "adaptive"
    switches_itself = True

    def __init__(self, members: Sequence[Drafter], cost: PassCost | None = None, min_acceptance: float = 0.4,
                 window: int = 16, ledger: Ledger | None = None) -> None:
        if not members:
            raise ValueError("the adaptive drafter needs at least one member")
        self.members = [Member(d, SpecMonitor(min_acceptance, window)) for d in members]
        self.min_acceptance = min_acceptance
        self.cost = cost
        self.ledger = ledger if ledger is not None else Ledger()
        self.hidden_layers = tuple(sorted({i for d in members for i in d.hidden_layers}))
        self.greedy = True
        self._root_at: int | None = None  # context length at the last propose
        self._ends_at = 1 << 30  # context length at which the request's token budget runs out
        self._prompt_len = 0
        self._step: tuple[float, DraftProposal] | None = None  # this step's drafting seconds and its draft
        self._timed: set[str] = set()  # members timed in this request (``Ledger.age``)

    @classmethod
    def shared_state(cls, setup: DraftSetup) -> SharedState:
        # not forgotten with the suffix cache (``DraftResources.forget``: the bench's cold cells): like
        # the pass costs, what a member's drafts cost against plain decoding is this machine's to keep
        return SharedState(Ledger())

    @classmethod
    def from_config(cls, spec: SpecConfig, members: Sequence[Drafter] = (),
                    target: ModelRunner | None = None, ledger: Ledger | None = None) -> AdaptiveDrafter:
        """``members``: the drafters to choose among (the registry builds them); ``target``: whose
        measured pass cost prices the drafts; ``ledger``: what members realized in earlier requests."""
        return cls(members, None if target is None else target.pass_cost, spec.min_acceptance, ledger=ledger)

    def bind_slot(self, slot: int) -> None:
        for m in self.members:
            m.drafter.bind_slot(slot)

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        self.greedy = sampling.greedy
        self._ends_at = len(prompt_ids) + sampling.max_new_tokens
        self._prompt_len = len(prompt_ids)
        for m in self.members:
            m.sampled, m.dry = False, None
            if not sampling.greedy and m.monitor.min_acceptance > 0:  # (at 0 nothing is ever switched off)
                if not m.lookup:
                    m.monitor.judge_first_draft()
                elif not self.ledger.sampled_on.get(m.drafter.name, False):
                    m.monitor.start_probe()
            speedup = self.ledger.speedup(m.drafter.name, m.monitor.min_samples)
            if speedup is not None and speedup < 1.0 and m.monitor.min_acceptance > 0:
                m.monitor.start_off(self.ledger.backoff.get(m.drafter.name, m.monitor.base_backoff))
            m.drafter.begin(prompt_ids, sampling)
            if m.dry_probe:
                self._dry_run(m, prompt_ids)

    def observe(self, target_hidden: Mapping[int, torch.Tensor]) -> None:
        for m in self.members:  # every member follows the context, whoever proposed
            if m.drafter.hidden_layers:
                m.drafter.observe(target_hidden)

    def propose(self, context: Sequence[int], max_tokens: int) -> DraftProposal:
        self._root_at = len(context)
        drafting = 0.0
        offers = []
        catch_ups = [m.drafter.catch_up_seconds(context) for m in self.members]
        free = [m for m, c in zip(self.members, catch_ups, strict=True) if c == 0.0]  # need no catch-up
        for m, catch_up in zip(self.members, catch_ups, strict=True):
            if m.token_seconds is None and not m.lookup:  # priced before its first ask where its drafter knows
                m.token_seconds = m.drafter.token_seconds()
            k = self._ask_length(m, m.monitor.draft_cap(max_tokens), context, catch_up, free)
            # A sampled member is asked for what ``choose`` will keep of it, known before it draws.
            k = planned_length(m.monitor.alpha, k, self.cost)[0] if m.sampled else k
            m.offered, m.asked = None, k > 0
            if not m.asked:
                continue
            t0 = time.perf_counter()
            proposal = m.drafter.propose(context, k)
            spent = max(0.0, time.perf_counter() - t0 - catch_up)  # a prompt's catch-up is priced apart
            # ...and owed as priced, if paid: a draft model within its budget of the context's end returns
            # before catching up, and the price still stands after such a propose
            m.owed += max(0.0, catch_up - m.drafter.catch_up_seconds(context)) if catch_up else 0.0
            drafting += spent
            m.draft_seconds = _running_mean(m.draft_seconds, spent)
            m.token_seconds = _running_mean(m.token_seconds, spent / max(1, len(proposal)))
            m.drafted_share = _running_mean(m.drafted_share, float(len(proposal) > 0))
            m.sampled = proposal.probs is not None and not self.greedy
            if len(proposal):
                m.offered = proposal
                offers.append(Offer(m.drafter.name, m.monitor.alpha, proposal))
        draft = choose(offers, max_tokens, self.cost, self.greedy)
        self._step = (drafting, draft)
        return draft

    def planned_alpha(self, alpha: float) -> float | None:
        """The best alpha among the members whose drafts it would verify (a probing model member's
        is the probe's; a look-up member's probe is a dry run and plans no rows), not the sequence's
        ``alpha``: with every member off it proposes nothing, and a batch planned rows for it at the
        sequence monitor's probe alpha (at batch 16, T=1: a fifth of the passes carried such rows).
        Nor capped by it: a member's alpha replays its whole proposal against what the target committed,
        the sequence's counts only the tokens a budget let through, so short budgets kept it at the
        first positions' acceptance and the budgets short (Qwen2.5-Coder-1.5B, T=0.7, six chat groups:
        tau 1.23-1.26 capped, 1.32-1.41 not, decode 1.14x -> 1.21x plain; T=1 batch 1 a tie)."""
        alphas = [m.monitor.alpha for m in self.members if m.verified]
        return max(alphas) if alphas else None

    def _ask_length(self, m: Member, k: int, context: Sequence[int], catch_up: float, free: Sequence[Member],
                    ) -> int:
        """How many tokens to ask ``m`` for (0: not asked): all ``k`` before pass costs are measured or
        while it probes (its alpha is what the probe measures); else the n <= k whose expected tokens per second,
        drafting included, beat plain decoding most, 0 when none does. A look-up member's ask costs
        what its asks have cost, whatever n; a model member's costs n of its drafted tokens, so it
        drafts only as deep as pays (a 0.5B draft for a 1.5B target: 1-2 tokens, not 4). A member that
        must first catch up on the context (a draft model's pass over the whole prompt) is asked only
        where the rest of the request could repay that: on Qwen2.5-Coder-1.5B a 0.5B draft spent 4-5 s
        on a RAG prompt to draft 1-2 of its 18 tokens. The rest is expected to be as long as what the
        answer has made so far (capped by its budget), and against what the members in ``free`` (those that
        need no catch-up) already draft."""
        if not m.verified or k == 0:
            return 0
        probe = m.monitor.mode is Mode.PROBE
        if catch_up > 0.0 and self.cost is not None and not self.cost.measured:
            return 0  # a prompt pass waits for the target's costs (a step or two), which price what it buys back
        if not measured(self.cost) or (probe and catch_up == 0.0):
            return k
        plain = self.cost.estimate(1)
        best, n = self._best_rate(m, k, plain)
        # at best every remaining token comes at the best rate: the most a catch-up could buy back. How many
        # remain is unknown (most answers stop well before their budget): expect as many again as the answer
        # has made, so a draft model's pass over the prompt waits until the answer shows it can repay it
        # (on 17- and 31-token answers a 0.5B draft's prompt pass cost more than its drafts saved: 0.75-0.85x)
        made = max(1, len(context) - self._prompt_len)  # (at least the next token remains)
        # ...and no faster than its drafts realized in earlier requests, when known: a probe is priced at
        # the probe's hopeful alpha, and three 0.4-0.9 s prompt passes of the 0.5B draft in 64-token math
        # answers, each let through by it, cost what its 1.1-1.3x steps saved
        # ...and against what the members that need no catch-up already draft, not plain decoding: on code
        # edits, where suffix drafting makes 2.7 tokens a pass, a 0.5B draft was let through to spend 1.0 s
        # of prompt passes on three answers
        if catch_up > 0.0:
            realized = self.ledger.speedup(m.drafter.name, m.monitor.min_samples)
            repays = best if realized is None else min(best, realized / plain)
            others = [self._best_rate(o, k, plain)[0] for o in free if o.verified]
            now = max([1.0 / plain, *others])
            if catch_up >= min(self._ends_at - len(context), made) * (1.0 / now - 1.0 / repays):
                return 0
        if probe:
            return k
        return 0 if best <= 1.0 / plain else k if m.lookup else n

    def _best_rate(self, m: Member, k: int, plain: float) -> tuple[float, int]:
        """The most tokens per second asking ``m`` for n <= k tokens is expected to give (drafting included),
        and that n. An ask that drafts nothing still pays its drafting (a draft model stopping on low
        confidence pays its pass: Qwen2.5-Coder 0.5B on translation drafted 12 tokens over ~56 asks), so a
        model member's expected tokens and verify width are weighed by the share of its asks that drafted."""
        cost, alpha = self.cost, m.monitor.alpha
        share = 1.0 if m.lookup or m.drafted_share is None else m.drafted_share

        def rate(n: int) -> float:
            # (before its first ask: what its drafter says a token costs, else free; its first ask prices it)
            drafting = (m.draft_seconds or 0.0) if m.lookup or m.token_seconds is None else n * m.token_seconds
            return (1.0 + share * (expected_tokens(alpha, n) - 1.0)) \
                / (share * cost.estimate(n + 1) + (1.0 - share) * plain + drafting)

        return max((rate(n), n) for n in range(1, k + 1))

    def _floor(self, m: Member) -> float:
        """The acceptance below which member ``m`` is switched off: ``acceptance_floor`` with its drafting
        seconds a token, which are none for a look-up (at T=0.7 suffix keeps ~0.4 of its first tokens on chat
        text, at the fixed 0.4 floor, and with a 3-row verify at ~1.05x a 1-row one those drafts paid 1.19x
        alone, while inside adaptive it was kept off: 0.98x on math), and what a model member's drafts took
        (the engine prices a sequence's drafter the same way)."""
        return acceptance_floor(self.min_acceptance, self.cost, 0.0 if m.lookup else m.token_seconds or 0.0)

    def accept(self, context: Sequence[int], num_accepted: int) -> None:
        committed = context[self._root_at :] if self._root_at is not None else ()
        if self.cost is not None:
            self.ledger.count_step(self.cost.passes)
        drafting, draft = self._step if self._step is not None else (0.0, EMPTY)
        self._step = None
        for m in self.members:
            offered, at = (m.offered, None) if m.offered is not None else (m.dry, m.dry_at)
            if offered is not None:
                accepted, tested = replay(offered, committed if at is None else context[at:])
                m.drafter.accept(context, accepted)  # what its own proposal would have had kept
                sample = WindowSums(1, len(offered), accepted, tested, accepted + 1)
                if at is None and len(draft) and draft.drafter == m.drafter.name and measured(self.cost):
                    # its draft verified alone: the step's realized speed, which the monitor judges
                    # (below 1x: off, as for low alpha). Its drafting (every member's asks; a prompt's
                    # catch-up priced apart) and the verify pass at its measured cost, against plain
                    # passes for the tokens committed: a 0.5B draft for the 1.5B target was priced at
                    # ~1.16x plain on chat where its steps realized ~1.0x (tau below what alpha
                    # promised, drafting above its per-token price)
                    sample.timed_steps, sample.seconds = 1, drafting + self.cost.estimate(len(draft) + 1)
                    sample.plain_seconds = (num_accepted + 1) * self.cost.estimate(1)
                    self._charge(m, replace(sample))
                m.monitor.min_acceptance = self._floor(m)
                m.monitor.observe(sample, dry=at is not None)
            else:
                if not m.lookup:  # (indexing every token for look-up members that sat out cost ~1% at batch 4)
                    m.drafter.accept(context, 0)
                # held: not asked, or the engine gave adaptive no budget this step (``planned_alpha``
                # says no rows while every member is off: their back-offs must still run out)
                m.monitor.observe(None, held=not m.asked)
            m.offered, m.asked, m.dry = None, False, None
            if m.dry_probe:
                self._dry_run(m, context)
        self._root_at = None

    def _dry_run(self, m: Member, context: Sequence[int]) -> None:
        """A probing look-up member's draft from ``context``, scored at the next ``accept``; one that
        finds nothing waits ``_probe_wait`` steps before the next."""
        t0 = time.perf_counter()
        m.dry, m.dry_at = m.drafter.propose(context, m.monitor.probe_tokens), len(context)
        m.dry_seconds = _running_mean(m.dry_seconds, time.perf_counter() - t0)
        if not len(m.dry):
            m.dry = None
            m.monitor.skip_probe(self._probe_wait(m))

    def _probe_wait(self, m: Member) -> int:
        """Steps between a look-up member's dry runs while they find nothing: as many as keep them within
        ``DRY_SHARE`` of the step's pass (every live sequence's dry runs against a pass as wide as them; the
        base back-off before that pass is timed), at most 4x the base back-off.

        Qwen2.5-Coder-1.5B's ~37 ms pass and suffix's ~0.1 ms dry run: none, it probes every step. SmolLM2-135M
        at batch 4, T=1, creative text: three members' dry runs every step (~0.1 ms each beside a ~8 ms pass of
        4 rows) cost ~2.5% of the run; waits of ~14 steps keep them near 1% (``scripts/step_work.py``)."""
        live = self.ledger.live
        step = None if self.cost is None else self.cost.estimate(live)  # (timed at plain steps: no draft needed)
        if step is None or m.dry_seconds is None:
            return m.monitor.base_backoff
        share = live * m.dry_seconds / step
        return min(4 * m.monitor.base_backoff, math.ceil(share / DRY_SHARE) - 1)

    def _charge(self, m: Member, sample: WindowSums) -> None:
        """Record a member's timed draft in the ledger with the catch-up it paid since its last one.

        The monitor judges a request's drafts without it (paid is paid: what counts now is whether the next
        drafts pay), but the ledger decides whether the next request pays it again: a 0.5B draft's ~0.2 s
        passes over MT-bench prompts bought 1-token drafts that realized 1.25-1.37x alone, and a request
        or two later adaptive had spent 1.2 s of drafting for 8 tokens."""
        sample.seconds += m.owed
        m.owed = 0.0
        self.ledger.record(m.drafter.name, sample)
        self._timed.add(m.drafter.name)

    def end(self, context: Sequence[int]) -> None:
        for m in self.members:
            m.drafter.end(context)
            if m.owed > 0.0:  # a catch-up that no timed draft followed: all cost
                self._charge(m, WindowSums(timed_steps=1))
            self.ledger.backoff[m.drafter.name] = m.monitor.backoff
            if not self.greedy and m.lookup:
                self.ledger.sampled_on[m.drafter.name] = m.monitor.mode is Mode.ON
            if m.drafter.name not in self._timed:
                self.ledger.age(m.drafter.name)

    def windows(self) -> dict[str, WindowSums]:
        return {m.drafter.name: m.monitor.sums for m in self.members}
