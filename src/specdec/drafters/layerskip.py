"""draft-layerskip: the target drafts for itself with some of its decoder layers skipped.

Self-speculation without a second model. Training-free (SWIFT, Xia et al. 2024; Draft &
Verify, Zhang et al. 2023): the draft is the target run with a subset of its layers, a
skipped layer passing the residual through unchanged. Early exit (LayerSkip, Elhoushi et
al. 2024; transformers' ``assistant_early_exit``) is the subset "the first E layers", for
checkpoints trained to exit early. Either way the final norm and LM head are the model's own.

KV cache: the draft runs on the sequence's own slot of the target's cache
(``ModelRunner.run(..., layers=)``). The entries below the slot's length are the full
model's K/V of every committed token: the context the draft attends to is exact. The draft
tokens' K/V go after the length, for the layers run only, and the drafter truncates the slot
back to its length once the chain is drafted (O(1)); the verify pass then writes those
positions again for every layer. So the target's cache below its length is never touched
(``tests/test_layerskip.py`` pins it bit for bit). The layers before the first skipped one
compute exactly what the full pass computes (bit-identical on the fused kernels, also
pinned); reusing their K/V in the verify pass would save ``first_skipped / num_layers`` of
the root's and the draft tokens' rows, not done: a verify pass of k + 1 rows costs little
more than one row on a CPU, so the saving is small against a second code path.

Under sampling the chain is drawn from the draft's own q (the request's SamplingParams, as
draft-model does) and q goes to the verifier, which accepts with min(1, p / q): lossless
whatever the layers. --spec-draft-p-min stops the chain when the top probability of q for the
next token falls below it (SWIFT's confidence stop): decided before that token is drawn, from
its ancestors only, and never before the first token (verify.py's rule).

The skip set: pinned (--spec-layerskip-layers LIST, --spec-layerskip-exit E), or searched during
generation by ``SkipSearch``, shared by the requests of one engine (so cached per model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.config import SamplingParams, SpecConfig
from specdec.drafters.base import EMPTY, Drafter, DraftProposal, DraftSetup, SharedState
from specdec.monitor import WindowSums
from specdec.runners.base import ModelRunner, SeqInput
from specdec.sampling import make_generator, probs_from_logits, sample

RATIOS = (0.25, 0.4, 0.5, 0.6)  # shares of the layers skipped that the search starts from


@dataclass
class Trial:
    """Drafting steps one skip set had, summed over the requests that drafted with it."""

    skipped: tuple[int, ...]
    steps: int = 0
    drafted: int = 0
    accepted: int = 0


def label(skipped: tuple[int, ...]) -> str:
    """(8, 10, 12) -> 'skip 8,10,12' (how stats name a skip set)."""
    return "skip " + ",".join(map(str, skipped))


def initial_sets(num_layers: int) -> list[tuple[int, ...]]:
    """The sets the search tries first: every other layer of the middle half, then ``RATIOS`` of the
    layers spread evenly over all but the first and last layer (which matter most).

    Example: 12 layers -> (4, 6, 8), then (2, 6, 9), (2, 4, 6, 8, 10), (1, 3, 5, 6, 8, 10), ...
    """
    n, inner = num_layers, max(0, num_layers - 2)
    out = [tuple(range(n // 4 + 1, (3 * n) // 4, 2))]
    for ratio in RATIOS:
        k = min(inner, int(ratio * n + 0.5))
        out.append(tuple(1 + int((i + 0.5) * inner / k) for i in range(k)) if k else ())
    sets = [s for s in dict.fromkeys(out) if s and len(s) < n]
    return sets or [(n - 1,)]  # 2 or 3 layers: skip the last


def neighbours(skipped: tuple[int, ...], num_layers: int) -> list[tuple[int, ...]]:
    """One layer more skipped (the run inner layer nearest the middle) and one fewer (the skipped layer
    farthest from it): the greedy moves. Example: (4, 6) of 12 -> [(4, 5, 6), (6,)]."""
    middle = (num_layers - 1) / 2
    inner = [i for i in range(1, num_layers - 1) if i not in skipped]
    out = []
    if inner and len(skipped) + 1 < num_layers:
        grow = min(inner, key=lambda i: (abs(i - middle), i))
        out.append(tuple(sorted((*skipped, grow))))
    if len(skipped) > 1:
        drop = max(skipped, key=lambda i: (abs(i - middle), i))
        out.append(tuple(i for i in skipped if i != drop))
    return out


class SkipSearch:
    """Which layers the draft skips: pinned, or searched by measured acceptance x draft cost.

    Search: each candidate set drafts ``trial_steps`` steps (the initial sets in order, then the
    greedy ``neighbours`` of the best so far, while one beats it), scored by committed tokens per
    full-pass equivalent ``(accepted + steps) / (drafted * draft_cost + steps)``, where a draft
    token costs the share of the weights the draft reads (``draft_cost``) and the verify pass one
    pass. Then it keeps the best. The score reads accepted counts only, so the search is
    deterministic given them; it chooses the set of the next draft from past steps, never from
    the draft being verified (verify.py's rule).
    """

    def __init__(self, num_layers: int, layer_share: float, skipped: tuple[int, ...] | None = None,
                 exit_after: int | None = None, trial_steps: int = 8, max_rounds: int = 8) -> None:
        """layer_share: one layer's share of the weights a full pass reads (the rest: the LM head)."""
        if num_layers < 2:
            raise ValueError("draft-layerskip needs a model of 2 or more layers")
        if exit_after is not None:
            if not 1 <= exit_after < num_layers:
                raise ValueError(f"--spec-layerskip-exit must be in [1, {num_layers - 1}] for this model of "
                                 f"{num_layers} layers, got {exit_after}")
            skipped = tuple(range(exit_after, num_layers))
        if skipped is not None:
            skipped = tuple(sorted(set(skipped)))
            if any(not 0 <= i < num_layers for i in skipped):
                raise ValueError(f"--spec-layerskip-layers: this model has layers 0-{num_layers - 1}, got "
                                 f"{','.join(map(str, skipped))}")
            if len(skipped) >= num_layers:
                raise ValueError("--spec-layerskip-layers skips every layer: the draft must run at least one")
        self.num_layers, self.layer_share = num_layers, layer_share
        self.trial_steps, self.rounds_left = trial_steps, max_rounds
        self.pinned = skipped is not None
        self.trials: dict[tuple[int, ...], Trial] = {}
        self.expanded: set[tuple[int, ...]] = set()  # sets whose neighbours were queued
        self.queue = [] if skipped is not None else initial_sets(num_layers)
        self.current = skipped if skipped is not None else self.queue.pop(0)
        self.best = self.current

    @classmethod
    def from_spec(cls, spec: SpecConfig, target: ModelRunner) -> SkipSearch:
        """The search for ``target``'s layers as --spec-layerskip-layers / --spec-layerskip-exit ask."""
        if not target.supports_layer_skip:
            raise ValueError("draft-layerskip needs a native model (Llama, Qwen2/3, Gemma 3, SmolLM2, Mistral)")
        return cls(target.num_layers, layer_share(target), spec.layerskip_layers, spec.layerskip_exit)

    def layers_run(self, skipped: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_layers) if i not in skipped)

    def draft_cost(self, skipped: tuple[int, ...]) -> float:
        """A draft token's cost as a share of a full pass's (weights read)."""
        return 1.0 - len(skipped) * self.layer_share

    def rate(self, trial: Trial) -> float:
        """Committed tokens per full-pass equivalent of the trial's steps."""
        spent = trial.drafted * self.draft_cost(trial.skipped) + trial.steps
        return (trial.accepted + trial.steps) / spent if trial.steps else 0.0

    def record(self, skipped: tuple[int, ...], num_drafted: int, num_accepted: int) -> None:
        """One verified draft of ``skipped``; moves the search on when the current trial is done."""
        trial = self.trials.setdefault(skipped, Trial(skipped))
        trial.steps += 1
        trial.drafted += num_drafted
        trial.accepted += num_accepted
        if not self.pinned and skipped == self.current and trial.steps >= self.trial_steps:
            self._advance()

    def _advance(self) -> None:
        """The current trial is done: draft with the next queued set; with none left, adopt the best
        set tried and queue its untried neighbours, once per best and ``max_rounds`` times in all."""
        while not self.queue:
            self.best = max((t for t in self.trials.values() if t.steps >= self.trial_steps), key=self.rate).skipped
            if self.best in self.expanded or self.rounds_left == 0:
                self.current = self.best  # settled (until another set's rate passes it)
                return
            self.expanded.add(self.best)
            self.rounds_left -= 1
            self.queue = [s for s in neighbours(self.best, self.num_layers) if not self._tried(s)]
        self.current = self.queue.pop(0)

    def _tried(self, skipped: tuple[int, ...]) -> bool:
        return skipped in self.trials and self.trials[skipped].steps >= self.trial_steps


def layer_share(target: ModelRunner) -> float:
    """One decoder layer's share of the weights a pass reads (from the shapes: its q/k/v/o and MLP
    matrices against the layers' and the LM head's); 1 / num_layers when the shapes are unknown."""
    c = target.config
    if c is None:
        return 1.0 / target.num_layers
    attn = c.hidden_size * (2 * c.num_heads + 2 * c.num_kv_heads) * c.head_dim
    layer = attn + 3 * c.hidden_size * c.intermediate_size
    return layer / (c.num_layers * layer + c.vocab_size * c.hidden_size)


class LayerSkipDrafter(Drafter):
    """Drafts a chain with the target itself, the skip set's layers left out, on the request's slot."""

    name = "draft-layerskip"

    def __init__(self, target: ModelRunner, search: SkipSearch, p_min: float = 0.0) -> None:
        if not target.supports_layer_skip:
            raise ValueError("draft-layerskip needs a native model (Llama, Qwen2/3, Gemma 3, SmolLM2, Mistral)")
        self.target, self.search = target, search
        self.p_min = p_min  # --spec-draft-p-min: stop once the next token's top probability drops below
        self.slot = -1
        self.params = SamplingParams()
        self.generator: torch.Generator | None = None
        self._last: tuple[tuple[int, ...], int] | None = None  # the last proposal's skip set and length
        self.sums: dict[str, WindowSums] = {}  # this request's drafts by skip set

    @classmethod
    def from_config(cls, spec: SpecConfig, target: ModelRunner | None = None,
                    search: SkipSearch | None = None) -> LayerSkipDrafter:
        """``target``: the runner it drafts with; ``search``: the engine's shared search (else its own)."""
        if target is None:
            raise ValueError("draft-layerskip needs the target runner (see DraftResources)")
        return cls(target, search or SkipSearch.from_spec(spec, target), spec.draft_p_min)

    @classmethod
    def shared_state(cls, setup: DraftSetup) -> SharedState:
        return SharedState(SkipSearch.from_spec(setup.spec, setup.target))  # the skip set is found once per model

    @classmethod
    def from_shared(cls, spec: SpecConfig, shared: SkipSearch, target: ModelRunner | None) -> LayerSkipDrafter:
        return cls.from_config(spec, target=target, search=shared)

    def bind_slot(self, slot: int) -> None:
        self.slot = slot

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        self.params, self._last, self.sums = sampling, None, {}
        if not sampling.greedy:
            seed = sampling.draft_seed  # independent of the target's and other choices' draws
            self.generator = make_generator(seed, self.target.device)

    def propose(self, context: Sequence[int], max_tokens: int) -> DraftProposal:
        self._last = None
        if self.slot < 0 or max_tokens <= 0:
            return EMPTY
        length = self.target.lengths[self.slot]
        # the slot must hold every committed token but the root; the passes write max_tokens entries
        if length != len(context) - 1 or length + max_tokens > self.target.max_seq_len:
            return EMPTY
        skipped = self.search.current
        try:
            proposal = self._draft(context[-1], max_tokens, self.search.layers_run(skipped))
        finally:
            self.target.truncate(self.slot, length)  # the engine owns the slot's length
        self._last = (skipped, len(proposal))
        return proposal

    def _draft(self, root: int, max_tokens: int, layers: tuple[int, ...]) -> DraftProposal:
        logits = self._run(root, layers)  # [V]: the draft's prediction after the root
        tokens: list[int] = []
        q_rows: list[torch.Tensor] = []
        for i in range(max_tokens):
            if self.params.greedy:
                if self.p_min > 0 and i > 0 and float(torch.softmax(logits, dim=-1).max()) < self.p_min:
                    break
                token = int(logits.argmax())
            else:
                q = probs_from_logits(logits.unsqueeze(0), self.params)[0]
                if i > 0 and float(q.max()) < self.p_min:  # q of token i + 1: its ancestors' function
                    break
                token = int(sample(q.unsqueeze(0), self.generator)[0])
                q_rows.append(q)
            tokens.append(token)
            if i + 1 < max_tokens:
                logits = self._run(token, layers)
        return DraftProposal(tokens, probs=torch.stack(q_rows) if q_rows else None)

    def _run(self, token: int, layers: tuple[int, ...]) -> torch.Tensor:
        return self.target.run([SeqInput(self.slot, [token])], layers=layers).logits[0][-1].float()

    def accept(self, context: Sequence[int], num_accepted: int) -> None:
        if self._last is None:
            return
        skipped, num_drafted = self._last
        self._last = None
        self.search.record(skipped, num_drafted, num_accepted)
        tested = num_accepted + int(num_accepted < num_drafted)
        self.sums.setdefault(f"{self.name} {label(skipped)}", WindowSums()).add(
            WindowSums(steps=1, drafted=num_drafted, accepted=num_accepted, tested=tested,
                       committed=num_accepted + 1))

    def windows(self) -> dict[str, WindowSums]:
        """This request's acceptance by skip set (what stats and the server show)."""
        return dict(self.sums)
