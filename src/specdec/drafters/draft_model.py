"""draft-model: a second, smaller model with the target's tokenizer drafts a chain or a tree
(another tokenizer: ``cross_vocab.py``, chains only).

The draft model has its own runner and KV cache (one slot per running
sequence). Under sampling it samples from its own q, processed with the same
SamplingParams as the target's p, and hands q to the verifier, which then
accepts with min(1, p/q): lossless whatever the draft model is.

Trees (``--spec-draft-p-split P``, llama.cpp's ``llama-speculative -np N --draft-p-split P``;
SpecInfer): along the main chain (each node's first child), a position whose next candidates
have q above P also branches into them (at most ``branches`` branches in all, the main chain
counted); each branch is continued as a chain. Like llama.cpp the tree grows breadth-first
within the node budget (``max_tokens``): at each depth the main chain, then every branch
already open, then the new siblings get a node while the budget lasts.

Worked example (greedy, budget 6, branches 2, P 0.1): q after the root is {a: .6, b: .3, ...}:
b > .1 splits; depth 1 gives a, b (2 nodes), depth 2 a->c, b->d (4), depth 3 c->e, d->f (6).
Tokens [a, c, e, b, d, f], parents [0, 1, 2, 0, 4, 5]: the main chain first, then each branch.

Under sampling the siblings are drawn without replacement from q (Gumbel top-k, child i
carrying q without children 0..i-1: ``dynamic_tree.sampled_children``), which the verifier's
recursive rejection makes exact. The shape stays token-blind (verify.py's rule): a split is
decided from the sorted probabilities of q before anything is drawn, and a branch's length
follows the main chain (its earlier sibling's subtree), never its own tokens but through p-min;
and p-min stops a chain after token i on q_{i+1}, a function of tokens 1..i only.

The draft runs one token per pass, branch after branch: the main chain first, then each
branch from its split point (the cache truncated back to it); the next step's catch-up keeps
whatever prefix of the committed text the cache still holds.

Two ways to make the draft cheaper, neither touching what is kept:
- ``--spec-draft-vocab-size N`` (FR-Spec, ``frequent_vocab``): the draft's LM head holds only
  the N most frequent tokens; ``_run`` expands its [N] logits to the full vocabulary with -inf
  elsewhere, so q is renormalized over the subset and zero outside it.
- ``--spec-draft-prompt-tail M``: the draft reads only the last M tokens of the prompt (its
  positions start at the first of them), bounding its prefill on long prompts.

Its slot is taken and freed as the target's (``ModelRunner.allocate`` / ``free``): over quantized blocks a
freed slot keeps its tokens, and a request whose prompt starts with them (a conversation's next turn, a
shared system prompt) catches up on the rest only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.config import SamplingParams, SpecConfig
from specdec.drafters.base import EMPTY, Drafter, DraftProposal
from specdec.drafters.dynamic_tree import Child, greedy_children, sampled_children
from specdec.drafters.frequent_vocab import DraftVocab
from specdec.row_dist import row_dist
from specdec.runners.base import ModelRunner, SeqInput, shared_start
from specdec.sampling import make_generator, sample

STEP_CATCH_UP = 16  # tokens a draft catches up on after one verify step, at most (a draft's budget and the bonus)


class DraftModelDrafter(Drafter):
    name = "draft-model"

    def __init__(self, runner: ModelRunner, p_min: float = 0.0, p_split: float | None = None,
                 branches: int = 2, vocab: DraftVocab | None = None, prompt_tail: int | None = None) -> None:
        if p_split is not None and not (0.0 < p_split < 1.0 and branches >= 1):
            raise ValueError(f"draft trees need 0 < p split < 1 and branches >= 1, got {p_split}, {branches}")
        if prompt_tail is not None and prompt_tail < 1:
            raise ValueError(f"the draft's prompt tail must be >= 1 token, got {prompt_tail}")
        self.vocab = vocab  # --spec-draft-vocab-size: the runner's head scores these ids only
        self.prompt_tail = prompt_tail  # --spec-draft-prompt-tail: the draft reads the last M prompt tokens
        self.offset = 0  # context[offset:] is what the draft reads (0 unless the prompt was cut)
        self.runner = runner
        self.p_min = p_min  # --spec-draft-p-min: stop drafting once the top probability drops below
        self.p_split = p_split  # --spec-draft-p-split: branch where a later candidate's q is above; None: chains
        self.branches = branches  # --spec-draft-branches: most branches of a tree, the main chain counted
        self.slot = -1
        self.cached: list[int] = []  # tokens whose K/V the draft cache holds, in order
        self.params = SamplingParams()
        self.generator: torch.Generator | None = None

    @classmethod
    def from_config(
        cls, spec: SpecConfig, runner: ModelRunner | None = None, target: ModelRunner | None = None,
        vocab: DraftVocab | None = None,
    ) -> DraftModelDrafter:
        """``runner`` is the engine's loaded draft model; ``target`` (when given) tells whether trees can be
        verified (a target runner without trees verifies chains: the draft then drafts chains); ``vocab`` the
        ids its restricted head scores (``frequent_vocab.restrict_draft_vocab``), None for the whole vocabulary."""
        if runner is None:
            raise ValueError("draft-model needs a loaded draft model runner (see DraftResources)")
        trees = target is None or target.supports_trees
        return cls(runner, p_min=spec.draft_p_min, p_split=spec.draft_p_split if trees else None,
                   branches=spec.draft_branches, vocab=vocab, prompt_tail=spec.draft_prompt_tail)

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        self.offset = 0 if self.prompt_tail is None else max(0, len(prompt_ids) - self.prompt_tail)
        reads = self._reads(prompt_ids)[:-1]  # what the first catch-up caches (its last token is run, not kept)
        if self.slot >= 0:  # still held (begun again without an end): freed as an end frees it
            self.runner.free(self.slot, self.cached)
        # a freed slot that kept this prompt's start (a conversation's earlier turn) holds it
        self.slot = self.runner.allocate(reads)
        self.cached = list(reads[: self.runner.lengths[self.slot]])
        self.params = sampling
        if not sampling.greedy:
            seed = sampling.draft_seed  # independent of the target's and other choices' draws
            self.generator = make_generator(seed, self.runner.device)

    def propose(self, context: Sequence[int], max_tokens: int) -> DraftProposal:
        context = context[self.offset :] if self.offset else context  # what the draft reads
        if max_tokens <= 0 or len(context) + max_tokens + 1 >= self.runner.max_seq_len:
            return EMPTY
        logits = self._catch_up(context)  # the draft's prediction after the root (``_run``)
        if self.p_split is not None and self.branches > 1:
            return self._tree(len(context), logits, max_tokens)
        tokens, q_rows = self._chain(logits, max_tokens)
        return DraftProposal(tokens, probs=torch.stack(q_rows) if q_rows else None)

    def _chain(self, logits: torch.Tensor, max_tokens: int, mask: torch.Tensor | None = None,
               ) -> tuple[list[int], list[torch.Tensor]]:
        """Up to max_tokens draft tokens from ``logits`` on (argmax, or drawn from q), p-min stopping
        after the first, and their q rows when sampling. ``mask`` ([V], 0 or -inf) is added to every
        step's logits first (cross-tokenizer TLI: only tokens with a twin may be drafted)."""
        tokens: list[int] = []
        q_rows: list[torch.Tensor] = []
        for i in range(max_tokens):
            if self.params.greedy and mask is None:  # the draft's own rows: no full-vocabulary q to build
                if i > 0 and self.p_min > 0 and float(torch.softmax(logits.float(), dim=-1).max()) < self.p_min:
                    break
                token = self._top(logits)
            elif mask is None:  # sampled: q and the draw from the draft's own row (N columns under a cut head)
                dist = row_dist(logits, self.params)
                own = dist.probs()
                if i > 0 and float(own.max()) < self.p_min:
                    break
                token = self._id(dist.draw(self.generator))
                q_rows.append(own if self.vocab is None else self.vocab.spread(own))
            else:
                q = self._q(self._full(logits).float()[: len(mask)] + mask)
                if i > 0 and float(q.max()) < self.p_min:
                    break
                if self.params.greedy:
                    token = int(q.argmax())
                else:
                    token = int(sample(q.unsqueeze(0), self.generator)[0])
                    q_rows.append(q)
            tokens.append(token)
            if i + 1 < max_tokens:
                logits = self._run([token])
        return tokens, q_rows

    def _top(self, logits: torch.Tensor) -> int:
        """The draft's argmax as a target id, from its own row ([N] under a cut head: ids ascend, so the
        first of equal maxima is the one the expanded row's argmax would pick)."""
        return self._id(int(logits.argmax()))

    def _id(self, row: int) -> int:
        """The token of a logits row's index: itself, or under a cut head the id it scores."""
        return row if self.vocab is None else int(self.vocab.ids[row])

    def _full(self, logits: torch.Tensor) -> torch.Tensor:
        """[V] logits over the whole vocabulary: a cut head's row expanded (-inf outside its ids)."""
        return logits if self.vocab is None else self.vocab.expand(logits)

    def _q(self, logits: torch.Tensor) -> torch.Tensor:
        """[V] the draft's distribution: plain softmax under greedy (p-min, p-split read it), else q as ``row_dist``
        reads it (the chains' too, from their own rows)."""
        if self.params.greedy:
            return torch.softmax(logits.float(), dim=-1)
        return row_dist(logits.float(), self.params).probs()

    def _pick(self, q: torch.Tensor, k: int) -> list[Child]:
        """k children of one node: the top k (greedy) or k draws without replacement from q."""
        return greedy_children(q, k) if self.params.greedy else sampled_children(self.generator)(q, k)

    def _split_width(self, q: torch.Tensor, most: int) -> int:
        """1 + the candidates after the first whose q is above p-split, at most ``most``: from the
        sorted probabilities alone, before any token is drawn."""
        top = torch.topk(q, min(most, q.shape[-1])).values.tolist()
        return 1 + sum(1 for p in top[1:] if p > self.p_split)

    def _tree(self, root_len: int, logits: torch.Tensor, max_tokens: int) -> DraftProposal:
        """The main chain breadth-first with its splits planned, then each branch (module docstring)."""
        main: list[Child] = []
        branches: list[_Branch] = []
        count = 0
        while count < max_tokens:
            depth = len(main) + 1
            q = self._q(self._full(logits))
            if depth > 1 and float(q.max()) < self.p_min:
                break
            extend = [b for b in branches if b.end == depth - 1][: max_tokens - count - 1]
            room = max_tokens - count - 1 - len(extend)  # nodes left for new siblings at this depth
            width = self._split_width(q, 1 + min(self.branches - 1 - len(branches), room))
            children = self._pick(q, width)
            if not children:
                break
            main.append(children[0])
            count += 1 + len(extend) + len(children) - 1
            for b in extend:
                b.end = depth
            branches += [_Branch(depth, c, depth) for c in children[1:]]
            if count < max_tokens:
                logits = self._run([children[0].token])
        token_ids = [c.token for c in main]
        parents = list(range(len(main)))
        qs = [c.q for c in main]
        for b in branches:
            token_ids.append(b.first.token)
            parents.append(b.depth - 1)
            qs.append(b.first.q)
            self.cached = self.cached[: root_len + b.depth - 1]
            self.runner.truncate(self.slot, len(self.cached))
            logits = self._run([b.first.token])
            for depth in range(b.depth + 1, b.end + 1):
                q = self._q(self._full(logits))
                if float(q.max()) < self.p_min:
                    break
                child = self._pick(q, 1)[0]
                parents.append(len(token_ids))
                token_ids.append(child.token)
                qs.append(child.q)
                if depth < b.end:
                    logits = self._run([child.token])
        return DraftProposal.from_tree(token_ids, parents, probs=None if self.params.greedy else torch.stack(qs))

    def _reads(self, prompt_ids: Sequence[int]) -> Sequence[int]:
        """The draft's ids for the prompt, as its first catch-up reads them (the prompt tail's cut)."""
        return prompt_ids[self.offset :]

    def end(self, context: Sequence[int]) -> None:
        if self.slot >= 0:
            self.runner.free(self.slot, self.cached)  # its cache's tokens: a later prompt may start with them
            self.slot = -1

    def _catch_up(self, context: Sequence[int]) -> torch.Tensor:
        """Roll the draft cache back to its longest prefix of ``context``, then run the rest."""
        keep = min(shared_start(self.cached, context), len(context) - 1)  # (the root is run, not kept)
        self.cached = self.cached[:keep]
        self.runner.truncate(self.slot, keep)
        return self._run(list(context[keep:]))

    def catch_up_seconds(self, context: Sequence[int]) -> float:
        """The draft's pass over a context it has not cached (a prompt), priced by its runner's
        measured pass costs (``_run`` times every pass into them). A step's own catch-up (the
        accepted tokens and the bonus one) is part of drafting and is not counted here."""
        todo = len(context) - self.offset - len(self.cached)
        if todo <= STEP_CATCH_UP:
            return 0.0
        if not self.runner.pass_cost.measured:
            self._time_passes()
        return self.runner.pass_cost.estimate(todo) or 0.0

    def token_seconds(self) -> float | None:
        # a drafted token is one 1-token pass of the draft (timed by ``_time_passes`` or by drafting)
        return self.runner.pass_cost.estimate(1)

    def _time_passes(self) -> None:
        """Time a 1- and a 32-token pass of the draft (after an untimed one: the weights' first read) on
        its slot, then drop their cache entries: a process's first prompt would otherwise read as free to
        catch up on (nothing timed yet), and the adaptive drafter let a 0.5B draft spend 1.9 s on a
        741-token RAG prompt to draft 4 tokens."""
        if self.slot < 0:  # not begun: no slot to time on
            return
        start = self.runner.lengths[self.slot]
        if start + 34 >= self.runner.max_seq_len:
            return
        for i, width in enumerate((1, 1, 32)):
            out = self.runner.run([SeqInput(self.slot, [0] * width, all_logits=False)])
            self.runner.truncate(self.slot, start)
            if i and out.seconds:
                self.runner.pass_cost.observe(width, out.seconds)

    def _run(self, tokens: list[int]) -> torch.Tensor:
        out = self.runner.run([SeqInput(self.slot, tokens, all_logits=False)])
        self.cached.extend(tokens)
        if out.seconds:
            self.runner.pass_cost.observe(len(tokens), out.seconds)
        return out.logits[0][-1]  # [V], or [N] over ``vocab.ids`` under a cut head (``_full``)


@dataclass
class _Branch:
    """A sibling of the main chain's node at ``depth``, continued as a chain down to ``end``."""

    depth: int
    first: Child
    end: int
