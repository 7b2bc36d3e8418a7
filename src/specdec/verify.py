"""The verifier: the only place that decides which drafted tokens are kept.

Terms (as in vLLM's rejection sampler):
- accepted tokens: drafted tokens the target agrees with;
- recovered token: at the first rejection, a token drawn from the residual
  max(0, p - q) / sum(max(0, p - q)) (greedy: the target's argmax);
- bonus token: when every drafted token on the path is accepted, one more token
  drawn from the target's distribution after the last of them.

Every verify returns the accepted tokens plus exactly one recovered or bonus
token, so a step always makes progress. Verification is lossless: greedy output
equals plain greedy decoding, sampled output has the target's distribution.

Inputs use the tree layout of ``specdec.tree``: node 0 is the root (the newest
committed token), nodes 1..N are drafted tokens; ``target_logits[i]`` is the
target's prediction for the token after node i. A chain is the tree where node
i's parent is i - 1.

The rule every drafter, cut and merge must keep (else the output is biased however
exact this routine is): **whether a drafted node is verified may depend only on its
ancestors' tokens and on what was drawn before it in the order the verifier assumes
(earlier siblings), never on the node's own token or its descendants.** Put exactly:
given its ancestors, the event "node c is in the tree" must be independent of c's
token, so that c's token, given it is verified, is still a draw from the q it carries.
Worked counter-example (issue 22): a grammar cuts a sampled chain after an invalid x1,
and n-min 2 then drops the one-token draft. With q = (.5, .25, .25), p = (.2, .8, 0):
x1 = c (.25) is cut to [c] and dropped, and plain sampling gives a with .2; x1 = a (.5)
is accepted with .2 / .5. P(a) = .25 * .2 + .5 * .4 = .25, not .2. What holds the rule outside the drafters:
- engine (``Engine._draft``): n-min drops deterministic drafts only, and skips drafting
  when the room is below it; the padded-batch cut and the room come from cache lengths.
- grammar cuts (``grammar.GrammarMatcher.cut``): a draft with q keeps its first invalid
  token (rejected with probability 1 here) and drops only its descendants.
- runners without trees (``DraftProposal.first_path``): the first child at each node.
- monitors and the cost model read past steps only.
Each drafter that samples a draft says in its own docstring how it keeps the rule: the draft
model's p-min and trees (``drafters.draft_model``), EAGLE's trees (``drafters.dynamic_tree``),
adaptive's sampled members (``drafters.adaptive``).
Deterministic drafts (q one-hot, ``draft_probs`` None) are free of the rule: their
tokens are fixed by the context, and this routine is exact given any fixed tree with
distinct siblings, so any cut by their tokens (reach, length) is safe.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specdec.config import SamplingParams
from specdec.row_dist import TensorDist, TokenDist, row_dist
from specdec.tree import DraftTree


@dataclass
class VerifyResult:
    token_ids: list[int]  # accepted drafted tokens, then one recovered or bonus token
    path: list[int]  # tree nodes kept in the KV cache: the root, then the accepted nodes

    @property
    def num_accepted(self) -> int:
        return len(self.token_ids) - 1


def verify(
    tree: DraftTree,
    target_logits: torch.Tensor,
    params: SamplingParams,
    draft_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    summed: tuple[np.ndarray, np.ndarray] | None = None,
) -> VerifyResult:
    """target_logits: [N+1, V]; draft_probs: [N, V] q of each drafted node, None = one-hot; summed: the rows' softmax
    blocks as the LM head summed them (``runners.base.PassOutput.blocks``)."""
    if params.greedy:
        return verify_greedy(tree, target_logits)
    assert generator is not None, "sampling needs a generator"
    rows = RowProbs(target_logits, params, one_hot=draft_probs is None, summed=summed)
    return verify_sampling(tree, rows, draft_probs, generator)


class RowProbs:
    """The target's p at each node, each row made when the walk first reads it: rows past the first rejection
    are never needed (at T=0.7 with tau ~1.3, most of a 5-row verify's 152K-wide softmaxes: 0.80 -> 0.40 ms a
    step on Qwen2.5-Coder-1.5B, Zen 4, ``scripts/step_work.py``). A row is ``row_dist.row_dist`` of that row alone,
    as plain decoding makes it: on a CPU from 64-column softmax blocks (``BlockDist``; its probabilities written out
    against a sampled draft's q)."""

    def __init__(self, logits: torch.Tensor, params: SamplingParams, one_hot: bool = True,
                 summed: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        self.logits, self.params, self.one_hot, self.summed = logits, params, one_hot, summed

    def __getitem__(self, node: int) -> TokenDist:
        summed = None if self.summed is None else (self.summed[0][node], self.summed[1][node])
        return row_dist(self.logits[node], self.params, self.one_hot, summed)


def verify_greedy(tree: DraftTree, target_logits: torch.Tensor) -> VerifyResult:
    """Follow the child whose token is the target's argmax, as long as one exists.

    Example: chain r -> a -> b -> c with argmax [a, b, x, y]: a and b are
    accepted, c is rejected, the recovered token is x: tokens [a, b, x].
    """
    return verify_argmax(tree, target_logits.argmax(dim=-1).tolist())  # the one host sync


def verify_argmax(tree: DraftTree, best: list[int]) -> VerifyResult:
    """``verify_greedy`` given each node's argmax token (a runner's ``run(argmax=True)``)."""
    path = tree.walk(lambda node: tree.child_with(node, best[node]))
    return VerifyResult([tree.tokens[n] for n in path[1:]] + [best[path[-1]]], path)


def verify_sampling(
    tree: DraftTree,
    target_probs: torch.Tensor | RowProbs,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator,
) -> VerifyResult:
    """Recursive rejection sampling over the tree (SpecInfer's multi-draft rule).

    At node u with target distribution p, try u's children in order. Child c
    with token x, drawn from q_c, is accepted with probability min(1, p(x) / q_c(x));
    on acceptance move to c, on rejection set p <- norm(max(0, p - q_c)) and try
    the next child. When no child is accepted, sample from the current p (the
    recovered token; the bonus token at a leaf). A deterministic drafter's q_c is
    one-hot at x, so acceptance has probability p(x) and the residual is p with x
    removed: sampling without replacement, which keeps the marginal exactly p.
    target_probs: [N+1, V] probabilities, or a ``RowProbs``.
    """
    device = generator.device
    node, path = 0, [0]
    while True:
        p = TensorDist(target_probs[node]) if isinstance(target_probs, torch.Tensor) else target_probs[node]
        moved = False
        for c in tree.children[node]:
            x = tree.tokens[c]
            q = None if draft_probs is None else draft_probs[c - 1]
            q_x = 1.0 if q is None else float(q[x])
            p_x = p.prob(x)
            u = float(torch.rand(1, generator=generator, device=device))
            if q_x > 0 and u < _acceptance(p_x, q_x):
                node, moved = c, True
                path.append(c)
                break
            p = _residual(p, q, x)
        if not moved:
            token = p.draw(generator)
            return VerifyResult([tree.tokens[n] for n in path[1:]] + [token], path)


def _acceptance(p_x: float, q_x: float) -> float:
    """The chance to keep a drafted token x: min(1, p(x) / q(x)), p the target's and q the draft's."""
    return min(1.0, p_x / q_x)


def _residual(p: TokenDist, q: torch.Tensor | None, x: int) -> TokenDist:
    """norm(max(0, p - q)); q None means one-hot at x."""
    return p.without(x, q)
