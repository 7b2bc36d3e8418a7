"""draft-model across tokenizers: a draft model whose vocabulary differs from the target's, lossless.

The draft reads the committed text as its own tokenizer writes it (``retokenize.DraftContext``:
the target's ids decoded with special tokens kept, re-encoded incrementally; the same seam logic
for the prompt, a chat template's markers and the output) and drafts by one of two methods
(``--spec-draft-vocab``):

- **tli**, token-level intersection (Timor et al., ICML 2025; transformers'
  ``AssistantToTargetTranslator``, vLLM's heterogeneous vocabularies): the draft samples only
  among its tokens that have a target twin (``vocab_map.VocabMap``): its logits are masked to
  them before the same SamplingParams processing, so q is renormalised there. The proposal is
  the twins' target ids with q scattered into the target vocabulary ([n, V_target], zero
  outside): the verifier's min(1, p/q) and residual max(0, p - q) are then the usual exact rule,
  and a target token the draft cannot write is still reached through the residual. Greedy:
  the argmax inside the intersection.
- **slem**, string-level exact match: the draft writes in its own vocabulary, always greedily
  (its argmax), and the text is re-encoded by the target's tokenizer after the committed text;
  the last re-encoded token is cut (it may merge with what follows), and the draft ends before a
  special token. The proposal carries no q (``probs`` None): the verifier treats it as a
  deterministic draft, one-hot at each token. That is exact under sampling because the draft is
  a function of the committed context alone (verify.py: the verifier is exact given any fixed
  tree, so cuts by its tokens are safe too). A draft *sampled* from the draft's q would be exact
  as well (its draws are independent of the verifier's), but accepted less often than its argmax;
  and it has no q in the target's vocabulary to accept with min(1, p/q), so argmax it is.
- **auto**: each engine measures both: the first steps alternate between them, then the
  method with the higher mean of accepted tokens per step is used, the other re-tried every
  ``PROBE_EVERY`` steps. The choice reads past steps only, never the tokens being verified.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specdec.config import DRAFT_VOCAB_METHODS as METHODS
from specdec.config import SamplingParams, SpecConfig
from specdec.drafters.base import EMPTY, DraftProposal
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.retokenize import DraftContext, TokenizerPair
from specdec.drafters.vocab_map import VocabMap
from specdec.runners.base import ModelRunner

TRIAL_STEPS = 4  # steps each method is tried before auto compares them
PROBE_EVERY = 32  # auto re-tries the method it is not using every this many steps


@dataclass
class MethodScores:
    """Accepted tokens per step of each method, for auto (shared by one engine's requests)."""

    steps: dict[str, int] = field(default_factory=lambda: {"tli": 0, "slem": 0})
    accepted: dict[str, float] = field(default_factory=lambda: {"tli": 0.0, "slem": 0.0})
    decisions: int = 0

    def choose(self) -> str:
        """The method for the next step: each tried TRIAL_STEPS times, then the better one."""
        self.decisions += 1
        for m in ("tli", "slem"):
            if self.steps[m] < TRIAL_STEPS:
                return m
        best, other = sorted(("tli", "slem"), key=lambda m: -self.mean(m))
        return other if self.decisions % PROBE_EVERY == 0 else best

    def mean(self, method: str) -> float:
        return self.accepted[method] / max(self.steps[method], 1)

    def record(self, method: str, num_accepted: int) -> None:
        self.steps[method] += 1
        self.accepted[method] += num_accepted


@dataclass
class CrossVocab:
    """What a cross-tokenizer draft needs, built once per engine (``DraftResources``)."""

    pair: TokenizerPair
    vocab: VocabMap
    method: str = "auto"
    scores: MethodScores = field(default_factory=MethodScores)


class CrossVocabDrafter(DraftModelDrafter):
    """The draft model drafting across tokenizers by TLI or SLEM (see the module docstring)."""

    def __init__(self, runner: ModelRunner, cross: CrossVocab, p_min: float = 0.0) -> None:
        super().__init__(runner, p_min)
        if cross.method not in METHODS:
            raise ValueError(f"unknown draft vocabulary method {cross.method!r}; choose from: {', '.join(METHODS)}")
        self.cross = cross
        self.mirror = DraftContext(cross.pair)
        d2t = cross.vocab.draft_to_target.to(runner.device)
        self.d2t = d2t
        self.mapped = torch.nonzero(d2t >= 0).flatten()  # [M] draft ids with a twin
        self.outside = torch.where(d2t >= 0, 0.0, float("-inf"))  # [V_draft] added to the draft's logits
        self.last_method: str | None = None

    @classmethod
    def from_config(
        cls, spec: SpecConfig, runner: ModelRunner | None = None, cross_vocab: CrossVocab | None = None,
    ) -> CrossVocabDrafter:
        """``runner``: the loaded draft model; ``cross_vocab``: its tokenizer pair and vocabulary map."""
        if runner is None or cross_vocab is None:
            raise ValueError("a cross-tokenizer draft model needs its runner and vocabulary map (see DraftResources)")
        return cls(runner, cross_vocab, p_min=spec.draft_p_min)

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        super().begin(prompt_ids, sampling)
        self.mirror.reset()
        self.last_method = None

    def propose(self, context: Sequence[int], max_tokens: int) -> DraftProposal:
        self.last_method = None
        if max_tokens <= 0:
            return EMPTY
        draft_ids = self.mirror.update(context)
        if not draft_ids or len(draft_ids) + max_tokens + 2 >= self.runner.max_seq_len:
            return EMPTY
        method = self.cross.method if self.cross.method != "auto" else self.cross.scores.choose()
        logits = self._catch_up(draft_ids)
        proposal = self._tli(logits, max_tokens) if method == "tli" else self._slem(logits, draft_ids, context,
                                                                                     max_tokens)
        self.last_method = method if len(proposal) else None
        return proposal

    def accept(self, context: Sequence[int], num_accepted: int) -> None:
        if self.last_method is not None:
            self.cross.scores.record(self.last_method, num_accepted)
            self.last_method = None

    def _tli(self, logits: torch.Tensor, max_tokens: int) -> DraftProposal:
        """Draft inside the intersection; target ids, and q in the target's vocabulary."""
        drafted, q_rows = self._chain(logits, max_tokens, mask=self.outside)
        tokens = [int(self.d2t[t]) for t in drafted]
        return DraftProposal(tokens, probs=self._target_q(q_rows) if q_rows else None)

    def _target_q(self, q_rows: list[torch.Tensor]) -> torch.Tensor:
        """[n, V_draft] q -> [n, V_target]: each twin's mass at its target id (summed where two
        draft tokens share a twin), zero elsewhere."""
        q = torch.stack(q_rows)[:, self.mapped]  # [n, M]
        out = torch.zeros(q.shape[0], self.cross.vocab.target_size, dtype=q.dtype, device=q.device)
        return out.index_add_(1, self.d2t[self.mapped], q)

    def _slem(self, logits: torch.Tensor, draft_ids: list[int], context: Sequence[int],
              max_tokens: int) -> DraftProposal:
        """The draft's greedy text, re-encoded as target ids (one token more drafted: the last is cut)."""
        drafted: list[int] = []
        for i in range(max_tokens + 1):
            top_p, top = torch.softmax(logits.float(), dim=-1).max(dim=-1)
            token = int(top)
            if (i > 0 and float(top_p) < self.p_min) or token in self.cross.pair.draft_special:
                break
            drafted.append(token)
            if i < max_tokens:
                logits = self._run([token])
        if not drafted:
            return EMPTY
        text = self.cross.pair.draft_text(draft_ids, drafted)
        tokens = self.cross.pair.target_continuation(context, text)[:max_tokens]
        if any(t >= self.cross.vocab.target_size for t in tokens):  # a tokenizer id past the model's logits
            tokens = tokens[: [t >= self.cross.vocab.target_size for t in tokens].index(True)]
        return DraftProposal(tokens) if tokens else EMPTY
