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

Parallel drafting (P-EAGLE, ``parallel=True``, a head trained with ``--parallel K``):
the catch-up step also runs the head's K - 1 mask entries after the root, so one
head pass gives the distributions of all K drafted positions (``EagleHead``'s
docstring). The tree is built from them as from sequential steps, except that a
node's children are drawn from its depth's distribution, whatever its token: the
same chain or best-first tree, each node carrying the q it was drawn from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from specdec.config import SamplingParams, SpecConfig
from specdec.drafters.base import EMPTY, Drafter, DraftProposal, DraftSetup, SharedState
from specdec.drafters.dynamic_tree import DraftNode, build_tree, greedy_children, sampled_children
from specdec.drafters.heads import load_eagle_head
from specdec.model.eagle_checkpoint import check_parallel
from specdec.model.eagle_head import EagleHead, HeadCache
from specdec.runners.base import ModelRunner
from specdec.sampling import make_generator, probs_from_logits


class EagleDrafter(Drafter):
    name = "eagle3"

    def __init__(self, head: EagleHead, target: ModelRunner, topk: int = 4, num_steps: int = 4,
                 num_draft_tokens: int = 7, parallel: bool = False) -> None:
        if min(topk, num_steps, num_draft_tokens) < 1:
            raise ValueError("eagle3 needs topk, num_steps and num_draft_tokens >= 1")
        check_parallel(head, parallel)
        self.head, self.target = head, target
        # parallel: the K drafted positions of one pass (the tree is at most that deep); else 0
        self.num_parallel = head.config.parallel_tokens if parallel else 0
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
        return cls(head, target, spec.eagle_topk, spec.num_steps, spec.num_draft_tokens, spec.parallel_drafting)

    @classmethod
    def shared_state(cls, setup: DraftSetup) -> SharedState:
        spec = setup.spec
        return SharedState(load_eagle_head(spec.spec_model, setup.target, setup.tokenizer, spec.parallel_drafting))

    @classmethod
    def from_shared(cls, spec: SpecConfig, shared: EagleHead, target: ModelRunner | None) -> EagleDrafter:
        return cls.from_config(spec, head=shared, target=target)

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
            seed = sampling.draft_seed  # independent of the target's and other choices' draws
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
            if self.num_parallel:
                return self._draft_parallel(context, max_tokens)
            self._catch_up(context)
            return self._draft(len(context) - 1, max_tokens)

    # -- the head's real entries -----------------------------------------------------------------
    def _catch_up(self, context: Sequence[int], num_mask: int = 0) -> torch.Tensor:
        """Run the entries of positions num_real + 1 .. root (features g_{p-1}, token x_p), then
        ``num_mask`` P-EAGLE mask entries at root + 1 ..; returns the outputs of the root and the
        mask entries [1 + num_mask, H]. Only the real entries stay: mask rows are overwritten later."""
        if not self.num_pending and not num_mask:
            return self.root_out.unsqueeze(0)
        m, start = self.num_pending, self.num_real
        n = m + num_mask
        positions = torch.arange(start + 1, start + 1 + n, device=self.device)
        self.cache.reserve(start + n + self.num_draft_tokens + 1)
        visible = torch.ones(n, start + n, dtype=torch.bool, device=self.device)
        visible[:, start:] = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        rows = torch.arange(start, start + n, device=self.device)
        hidden, embeds = self.head.mask_inputs((num_mask,)) if num_mask else (None, None)
        if m:
            ids = torch.tensor(context[start + 1 : start + 1 + m], device=self.device)
            real = self.head.project(torch.cat(self.pending).float()), self._embed(ids)
            hidden = real[0] if hidden is None else torch.cat([real[0], hidden])
            embeds = real[1] if embeds is None else torch.cat([real[1], embeds])
        out = self.head.step(hidden, embeds, positions, self.cache, rows, visible)
        if m:
            self.root_out = out[m - 1]
        self.num_real += m
        self.pending, self.num_pending = [], 0
        return torch.cat([self.root_out.unsqueeze(0), out[m:]])

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
        return self._proposal(nodes)

    def _draft_parallel(self, context: Sequence[int], max_tokens: int) -> DraftProposal:
        """One head pass over the new real entries and the K - 1 mask entries -> the K positions' q;
        node children at depth d are drawn from q_d (module docstring)."""
        budget = min(self.num_draft_tokens, max_tokens)
        depth = min(self.num_parallel, self.num_steps, budget)
        qs = self._q(self._catch_up(context, depth - 1))  # [depth, Vd]: q of drafted tokens 1..depth
        pick = greedy_children if self.params.greedy else sampled_children(self.generator)
        nodes = build_tree(qs[0], lambda new, nodes: qs[[nodes[n - 1].depth for n in new]], pick, self.topk,
                           depth, budget)
        return self._proposal(nodes) if nodes else EMPTY

    def _proposal(self, nodes: list[DraftNode]) -> DraftProposal:
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
