"""draft-model: a second, smaller model with the target's tokenizer drafts a chain (another
tokenizer: ``cross_vocab.py``).

The draft model has its own runner and KV cache (one slot per running
sequence). Under sampling it samples from its own q, processed with the same
SamplingParams as the target's p, and hands q to the verifier, which then
accepts with min(1, p/q): lossless whatever the draft model is.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.config import SamplingParams, SpecConfig
from specdec.drafters.base import EMPTY, Drafter, DraftProposal
from specdec.runners.base import ModelRunner, SeqInput
from specdec.sampling import make_generator, probs_from_logits, sample


class DraftModelDrafter(Drafter):
    name = "draft-model"

    def __init__(self, runner: ModelRunner, p_min: float = 0.0) -> None:
        self.runner = runner
        self.p_min = p_min  # --spec-draft-p-min: stop drafting once the top probability drops below
        self.slot = -1
        self.cached: list[int] = []  # tokens whose K/V the draft cache holds, in order
        self.params = SamplingParams()
        self.generator: torch.Generator | None = None

    @classmethod
    def from_config(
        cls, spec: SpecConfig, runner: ModelRunner | None = None, **shared: object
    ) -> DraftModelDrafter:
        """``runner`` is the engine's loaded draft model; other ``shared`` objects are unused."""
        if runner is None:
            raise ValueError("draft-model needs a loaded draft model runner (see DraftResources)")
        return cls(runner, p_min=spec.draft_p_min)

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        if self.slot < 0:
            self.slot = self.runner.allocate()
        self.runner.truncate(self.slot, 0)
        self.cached = []
        self.params = sampling
        if not sampling.greedy:
            seed = None if sampling.seed is None else sampling.seed + 1  # independent of the target's
            self.generator = make_generator(seed, self.runner.device)

    def propose(self, context: Sequence[int], max_tokens: int) -> DraftProposal:
        if max_tokens <= 0 or len(context) + max_tokens + 1 >= self.runner.max_seq_len:
            return EMPTY
        logits = self._catch_up(context)  # [V]: the draft's prediction after the root
        tokens: list[int] = []
        q_rows: list[torch.Tensor] = []
        for i in range(max_tokens):
            if self.params.greedy:
                top_p, top = torch.softmax(logits.float(), dim=-1).max(dim=-1)
                if i > 0 and float(top_p) < self.p_min:
                    break
                token = int(top)
            else:
                q = probs_from_logits(logits.unsqueeze(0), self.params)[0]
                if i > 0 and float(q.max()) < self.p_min:
                    break
                token = int(sample(q.unsqueeze(0), self.generator)[0])
                q_rows.append(q)
            tokens.append(token)
            if i + 1 < max_tokens:
                logits = self._run([token])
        probs = torch.stack(q_rows) if q_rows else None
        return DraftProposal(tokens, probs=probs)

    def end(self, context: Sequence[int]) -> None:
        if self.slot >= 0:
            self.runner.free(self.slot)
            self.slot = -1

    def _catch_up(self, context: Sequence[int]) -> torch.Tensor:
        """Roll the draft cache back to its longest prefix of ``context``, then run the rest."""
        keep = 0
        limit = min(len(self.cached), len(context) - 1)
        while keep < limit and self.cached[keep] == context[keep]:
            keep += 1
        self.cached = self.cached[:keep]
        self.runner.truncate(self.slot, keep)
        return self._run(list(context[keep:]))

    def _run(self, tokens: list[int]) -> torch.Tensor:
        out = self.runner.run([SeqInput(self.slot, tokens, all_logits=False)])
        self.cached.extend(tokens)
        return out.logits[0][-1]
