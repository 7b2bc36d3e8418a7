"""eagle3: an EAGLE-3 head drafts a dynamic tree from the target's own hidden states.

The head's cache holds one *real* entry per committed position p >= 1: the
target's states of token p - 1 (projected by ``fc``) with the embedding of token
p. The engine hands the drafter the target's states of every token it caches
(``observe``: the prompt after prefill, the kept path after each verify), so
before each draft the drafter runs the entries it is missing, up to the root, in
one batched step; the root's entry predicts the first drafted tokens. Drafted
nodes are run on top of the real entries (each sees the real context and its own
ancestors) and forgotten afterwards: only real entries stay.

Greedy requests build the tree from the head's probabilities (``dynamic_tree``);
sampled requests draw it from the head's q under the request's sampling settings
and hand q to the verifier, which keeps the target's distribution exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from specdec.config import SamplingParams, SpecConfig
from specdec.drafters.base import EMPTY, Drafter, DraftProposal
from specdec.drafters.dynamic_tree import DraftNode, build_tree, greedy_children, sampled_children
from specdec.model.eagle_head import EagleHead, HeadCache
from specdec.runners.base import ModelRunner
from specdec.sampling import make_generator, probs_from_logits


class EagleDrafter(Drafter):
    name = "eagle3"

    def __init__(self, head: EagleHead, target: ModelRunner, topk: int = 4, num_steps: int = 4,
                 num_draft_tokens: int = 7) -> None:
        if min(topk, num_steps, num_draft_tokens) < 1:
            raise ValueError("eagle3 needs topk, num_steps and num_draft_tokens >= 1")
        self.head, self.target = head, target
        self.topk, self.num_steps, self.num_draft_tokens = topk, num_steps, num_draft_tokens
        self.hidden_layers = head.config.feature_layers
        self.device = head.d2t.device
        self.cache = HeadCache(head.config, self.device)
        self.params = SamplingParams()
        self.generator: torch.Generator | None = None
        self._reset()

    @classmethod
    def from_config(cls, spec: SpecConfig, head: EagleHead | None = None,
                    target: ModelRunner | None = None) -> EagleDrafter:
        """``head``: the engine's loaded EAGLE head; ``target``: the target runner (its embeddings)."""
        if head is None or target is None:
            raise ValueError("eagle3 needs a loaded head and the target runner (see DraftResources)")
        return cls(head, target, spec.eagle_topk, spec.num_steps, spec.num_draft_tokens)

    def _reset(self) -> None:
        self.num_real = 0  # head cache rows holding real entries: positions 1..num_real
        self.pending: list[torch.Tensor] = []  # target features of tokens num_real.. not yet run
        self.num_pending = 0
        self.root_out: torch.Tensor | None = None  # the head's output at the newest real entry

    # -- lifecycle -----------------------------------------------------------------------------
    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        self._reset()
        self.params = sampling
        if not sampling.greedy:
            seed = None if sampling.seed is None else sampling.seed + 1  # independent of the target's draws
            self.generator = make_generator(seed, "cpu")

    def observe(self, target_hidden: Mapping[int, torch.Tensor]) -> None:
        features = torch.cat([target_hidden[i] for i in self.hidden_layers], dim=-1).to(self.device)
        self.pending.append(features)
        self.num_pending += features.shape[0]

    def propose(self, context: Sequence[int], max_tokens: int) -> DraftProposal:
        # Features must cover every committed token but the root; otherwise (a runner that gave
        # none) there is nothing to draft from.
        if max_tokens <= 0 or self.num_real + self.num_pending != len(context) - 1 or len(context) < 2:
            return EMPTY
        if len(context) + self.num_steps >= self.head.max_positions:
            return EMPTY  # past the head's rope table
        with torch.inference_mode():
            self._catch_up(context)
            return self._draft(len(context) - 1, max_tokens)

    # -- the head's real entries -----------------------------------------------------------------
    def _catch_up(self, context: Sequence[int]) -> None:
        """Run the entries of positions num_real + 1 .. root (features g_{p-1}, token x_p)."""
        if not self.num_pending:
            return
        features = torch.cat(self.pending)
        m, start = features.shape[0], self.num_real
        ids = torch.tensor(context[start + 1 : start + 1 + m], device=self.device)
        positions = torch.arange(start + 1, start + 1 + m, device=self.device)
        self.cache.reserve(start + m + self.num_draft_tokens + 1)
        visible = torch.ones(m, start + m, dtype=torch.bool, device=self.device)
        visible[:, start:] = torch.ones(m, m, dtype=torch.bool, device=self.device).tril()
        rows = torch.arange(start, start + m, device=self.device)
        out = self.head.step(self.head.project(features.float()), self._embed(ids), positions, self.cache, rows,
                             visible)
        self.root_out = out[-1]
        self.num_real += m
        self.pending, self.num_pending = [], 0

    def _embed(self, target_ids: torch.Tensor) -> torch.Tensor:
        return self.target.embed(target_ids).to(self.device)

    # -- drafting --------------------------------------------------------------------------------
    def _q(self, out: torch.Tensor) -> torch.Tensor:
        """Head outputs [n, H] -> [n, Vd] probabilities the tree is built from."""
        logits = self.head.logits(out).float()
        if self.params.greedy:
            return torch.softmax(logits, dim=-1)
        return probs_from_logits(logits, self.params)

    def _draft(self, root_pos: int, max_tokens: int) -> DraftProposal:
        budget = min(self.num_draft_tokens, max_tokens)
        self.cache.reserve(self.num_real + budget + 1)
        pick = greedy_children if self.params.greedy else sampled_children(self.generator)
        expand = _Expansion(self, root_pos)
        nodes = build_tree(self._q(self.root_out.unsqueeze(0))[0], expand, pick, self.topk,
                           min(self.num_steps, budget), budget)
        if not nodes:
            return EMPTY
        token_ids = self.head.draft_to_target(torch.tensor([n.token for n in nodes], device=self.device)).tolist()
        probs = None if self.params.greedy else self._full_vocab([n.q for n in nodes])
        return DraftProposal.from_tree(token_ids, [n.parent for n in nodes], probs=probs)

    def _full_vocab(self, qs: list[torch.Tensor | None]) -> torch.Tensor:
        """Draft-vocabulary q's -> [N, V] over the target's vocabulary (zero outside the draft one)."""
        out = torch.zeros(len(qs), self.head.config.target_vocab_size, device=self.device)
        targets = self.head.draft_to_target(torch.arange(self.head.config.draft_vocab_size, device=self.device))
        out[:, targets] = torch.stack(qs).to(self.device)  # type: ignore[arg-type] - sampled nodes carry q
        return out


class _Expansion:
    """Runs the head on newly taken tree nodes (``build_tree``'s expand): each node reads its
    parent's output and its own token at depth-offset positions, and attends to the real entries
    and to its expanded ancestors, whose rows follow the real ones in the head's cache."""

    def __init__(self, drafter: EagleDrafter, root_pos: int) -> None:
        self.d, self.root_pos = drafter, root_pos
        self.outs: dict[int, torch.Tensor] = {0: drafter.root_out}  # node -> the head's output there
        self.rows: dict[int, int] = {}  # expanded node -> its cache row

    def __call__(self, new: list[int], nodes: list[DraftNode]) -> torch.Tensor:
        d = self.d
        base = d.num_real + len(self.rows)
        for j, n in enumerate(new):
            self.rows[n] = base + j
        visible = torch.zeros(len(new), base + len(new), dtype=torch.bool, device=d.device)
        visible[:, : d.num_real] = True
        for j, n in enumerate(new):
            while n > 0:  # the node and its ancestors (all expanded before it)
                visible[j, self.rows[n]] = True
                n = nodes[n - 1].parent
        tokens = d.head.draft_to_target(torch.tensor([nodes[n - 1].token for n in new], device=d.device))
        hidden = torch.stack([self.outs[nodes[n - 1].parent] for n in new])
        positions = torch.tensor([self.root_pos + nodes[n - 1].depth for n in new], device=d.device)
        rows = torch.tensor([self.rows[n] for n in new], device=d.device)
        out = d.head.step(hidden, d._embed(tokens), positions, d.cache, rows, visible)
        for j, n in enumerate(new):
            self.outs[n] = out[j]
        return d._q(out)
