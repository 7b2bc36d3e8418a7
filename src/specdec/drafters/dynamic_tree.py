"""EAGLE-2's dynamic draft tree: grow where the draft is confident, then keep the best N nodes.

Every drafted node has a *score*, the draft's probability of the path to it (the
product of the probabilities along it). Growing the tree is a best-first search
in rounds, one head pass per round::

    slots  <- the topk children of the root (each scored root-score x its probability)
    repeat num_steps times:
        take the topk best slots (within the budget of N nodes): they become nodes
        run the head on them (not in the last round): push their topk children
    fill what is left of the budget with the best remaining slots (leaves)

Children score at most their parent, so the nodes taken are the highest-scoring
paths the head has looked at, and a node's parent is always taken before it:
the node list is in topological order. topk = 1 gives a chain of num_steps tokens.

Worked example (greedy, topk 2, num_steps 2, N 3): root probabilities
{a: .6, b: .3, c: .1}: round 1 takes a (.6) and b (.3) and expands them; a's
children {d: .9, e: .05} score .54 and .03, b's {f: .5, g: .4} .15 and .12;
round 2 would take d (.54) and f (.15) but only one node is left: d. Tree:
a, b, d with parents root, root, a.

Sampling (lossless with the draft's q): a node's children are drawn *without
replacement* from q (Gumbel top-k), child i carrying q with children 0..i-1
removed and renormalised: the verifier's recursive rejection with those q's is
exact (SpecInfer / recursive speculative decoding). For that, whether a slot
becomes a node must not depend on its own token: a sampled slot is scored with
the i-th largest probability of q (not the drawn token's), so the shape of the
tree depends only on tokens drawn before (ancestors, earlier siblings and their
subtrees), and children of one node are always taken in draw order. So the first n
nodes, for any n (a budget's truncation), are a token-blind prefix as well.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class DraftNode:
    token: int  # draft-vocabulary id
    parent: int  # index in [root, *nodes]: 0 = the root
    depth: int  # 1 for the root's children
    score: float  # path score (see the module docstring)
    q: torch.Tensor | None = None  # [Vd] the distribution it was drawn from (sampling only)


@dataclass
class Child:
    token: int
    score: float  # the slot's probability factor
    q: torch.Tensor | None = None


def greedy_children(q: torch.Tensor, k: int) -> list[Child]:
    """The k most probable tokens of q [Vd] (probability > 0), best first."""
    probs, ids = torch.topk(q, min(k, q.shape[-1]))
    return [Child(int(t), float(p)) for t, p in zip(ids.tolist(), probs.tolist(), strict=True) if p > 0]


def sampled_children(generator: torch.Generator) -> Callable[[torch.Tensor, int], list[Child]]:
    """k draws without replacement from q (Gumbel top-k); child i scored by the i-th largest
    probability of q and carrying q without children 0..i-1, renormalised."""

    def pick(q: torch.Tensor, k: int) -> list[Child]:
        q = q.float()
        k = min(k, int((q > 0).sum()))
        if k == 0:
            return []
        u = torch.rand(q.shape, generator=generator, device=generator.device).to(q.device)
        keys = torch.log(q) - torch.log(-torch.log(u.clamp(1e-20, 1.0)))
        drawn = torch.topk(keys, k).indices.tolist()
        rank_scores = torch.topk(q, k).values.tolist()
        out, rest = [], q.clone()
        for token, score in zip(drawn, rank_scores, strict=True):
            out.append(Child(token, score, rest / rest.sum()))
            rest = rest.clone()
            rest[token] = 0.0
        return out

    return pick


def build_tree(
    root_q: torch.Tensor,
    expand: Callable[[list[int], list[DraftNode]], torch.Tensor],
    pick: Callable[[torch.Tensor, int], list[Child]],
    topk: int,
    num_steps: int,
    num_tokens: int,
) -> list[DraftNode]:
    """Nodes of the dynamic tree, parents first (module docstring).

    root_q: [Vd] the head's distribution after the root; expand(new, nodes) runs the head on the
    nodes ``new`` (1-based indices into ``nodes``, the list built so far) -> [n, Vd] their q.
    """
    nodes: list[DraftNode] = []
    heap: list[tuple[float, int, int, Child]] = []  # (-score, push order, parent index, child)
    order = 0

    def push(parent: int, parent_score: float, q: torch.Tensor) -> None:
        nonlocal order
        for child in pick(q, topk):
            heapq.heappush(heap, (-parent_score * child.score, order, parent, child))
            order += 1

    def take(n: int) -> list[int]:
        new = []
        while heap and len(new) < n:
            neg, _, parent, child = heapq.heappop(heap)
            depth = 1 if parent == 0 else nodes[parent - 1].depth + 1
            nodes.append(DraftNode(child.token, parent, depth, -neg, child.q))
            new.append(len(nodes))
        return new

    push(0, 1.0, root_q)
    for step in range(num_steps):
        new = take(min(topk, num_tokens - len(nodes)))
        if not new:
            break
        if step + 1 < num_steps:
            for index, q in zip(new, expand(new, nodes), strict=True):
                push(index, nodes[index - 1].score, q)
    take(num_tokens - len(nodes))
    return nodes
