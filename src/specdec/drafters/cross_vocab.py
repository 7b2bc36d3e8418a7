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
  the last re-encoded token is cut (it may merge with what follows) unless it is the twin of the
  draft's last token (both tokenizers end a token there: no draft pass is spent on what follows),
  and the draft ends before a special token. The proposal carries no q (``probs`` None): the
  verifier treats it as a deterministic draft, one-hot at each token. That is exact under
  sampling because the draft is a function of the committed context alone (verify.py: the
  verifier is exact given any fixed tree, so cuts by its tokens are safe too). A draft *sampled*
  from the draft's q would be exact as well (its draws are independent of the verifier's), but
  accepted less often than its argmax; and it has no q in the target's vocabulary to accept with
  min(1, p/q), so argmax it is.
- **auto**: each engine measures both: the first steps alternate between them, then the
  method with the higher mean of accepted tokens per step is used, the other re-tried every
  ``PROBE_EVERY`` steps. The choice reads past steps only, never the tokens being verified.

Which of the two drafters a draft model runs is decided here, once per engine, when it is loaded
(``DraftModelState.load``): ``CrossVocabDrafter`` is therefore the class the registry names for
--spec-type draft-model (draft_model.py cannot import its own subclass), and it hands a draft model
with the target's tokenizer to ``DraftModelDrafter``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specdec.config import DRAFT_VOCAB_METHODS as METHODS
from specdec.config import SamplingParams, SpecConfig
from specdec.drafters.base import EMPTY, DraftProposal, DraftSetup, SharedState
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.frequent_vocab import DraftVocab, restrict_draft_vocab, special_ids, store_counts, vocab_counts
from specdec.drafters.retokenize import DraftContext, TokenizerPair
from specdec.drafters.retrieval import load_datastore
from specdec.drafters.vocab_map import VocabMap
from specdec.errors import ModelLoadError
from specdec.log import get_logger
from specdec.runners.base import ModelRunner
from specdec.runners.load import load_runner
from specdec.text import load_tokenizer

logger = get_logger(__name__)

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
    draft_tokenizer: object = None  # the draft's transformers tokenizer: ranks its own tokens for a cut head


@dataclass(frozen=True)
class DraftModelState:
    """The draft model an engine's draft-model drafters share: its runner (one KV slot per running
    sequence), the cut vocabulary it drafts from (--spec-draft-vocab-size) or, when its tokenizer is
    not the target's, the tokenizer pair and vocabulary map it drafts through."""

    runner: ModelRunner
    vocab: DraftVocab | None = None
    cross: CrossVocab | None = None

    @classmethod
    def load(cls, setup: DraftSetup) -> DraftModelState:
        spec, target = setup.spec, setup.target
        runner, folder = load_runner(spec.draft_model, dtype=setup.dtype, device=setup.device,
                                     max_seq_len=target.max_seq_len, num_slots=setup.max_num_seqs,
                                     kv_cache_dtype=setup.kv_cache_dtype)
        cross = cross_vocab_for(spec, target, runner, setup.tokenizer, folder)
        return cls(runner, draft_vocab_for(spec, runner, setup.tokenizer, target, cross), cross)

    def nbytes(self) -> int:
        return self.runner.weight_bytes() + self.runner.kv_bytes()


MIN_OVERLAP = 0.2  # below this share of the draft's tokens mapped, TLI rarely drafts what the target writes


def cross_vocab_for(spec: SpecConfig, target: ModelRunner, draft: ModelRunner, tokenizer,
                    draft_folder) -> CrossVocab | None:
    """None when the draft model shares the target's tokenizer (its ids mean the same text); else
    the tokenizer pair and vocabulary map it drafts through, reported in one line. ModelLoadError
    when no token maps (nothing in common to draft)."""
    draft_tok = load_tokenizer(draft_folder)
    if target.vocab_size == draft.vocab_size and tokenizer.get_vocab() == draft_tok.get_vocab():
        return None
    if spec.draft_p_split is not None:
        raise ModelLoadError("--spec-draft-p-split drafts trees with a draft model that shares the target's "
                             "tokenizer; this one has another (tli/slem draft chains): drop --spec-draft-p-split")
    if not (getattr(tokenizer, "is_fast", False) and getattr(draft_tok, "is_fast", False)):
        raise ModelLoadError("a draft model with another tokenizer needs fast (tokenizer.json) tokenizers on both "
                             "sides")
    if len(draft_tok) > draft.vocab_size:  # its ids would index past the draft model's embedding
        raise ModelLoadError(f"the draft model's tokenizer has {len(draft_tok):,} tokens but its vocabulary has "
                             f"{draft.vocab_size:,} rows: the tokenizer in {draft_folder} does not belong to it")
    vocab = VocabMap.build(tokenizer, draft_tok, target.vocab_size, draft.vocab_size)
    if vocab.num_mapped == 0:
        raise ModelLoadError(f"the draft model's vocabulary ({draft.vocab_size} tokens) shares no token with the "
                             f"target's ({target.vocab_size}): it cannot draft for it")
    logger.warning("specdec: %s (another tokenizer: drafting by %s)", vocab.summary(), spec.draft_vocab)
    if vocab.fraction < MIN_OVERLAP:
        logger.warning("specdec: warning: only %.0f%% of the draft model's tokens map to the target's: "
                       "it will be accepted rarely", 100 * vocab.fraction)
    return CrossVocab(TokenizerPair(tokenizer, draft_tok), vocab, spec.draft_vocab, draft_tokenizer=draft_tok)


def draft_vocab_for(spec: SpecConfig, draft: ModelRunner, tokenizer, target: ModelRunner,
                    cross_vocab: CrossVocab | None) -> DraftVocab | None:
    """--spec-draft-vocab-size N: the draft's LM head cut to the N tokens most frequent in the offline
    corpus (or in --spec-datastore's), special tokens kept (``frequent_vocab``); None without the flag.
    Across tokenizers the draft's own tokens are ranked, on the offline corpus under its tokenizer (a
    datastore holds target ids), and ``DraftVocab.ids`` are draft ids."""
    if spec.draft_vocab_size is None:
        return None
    if cross_vocab is not None:
        draft_tok = cross_vocab.draft_tokenizer
        return restrict_draft_vocab(draft, spec.draft_vocab_size, vocab_counts(draft_tok, draft.vocab_size),
                                    special_ids(draft_tok))
    if tokenizer is None:
        raise ModelLoadError("--spec-draft-vocab-size ranks the target's tokens: it needs the target's tokenizer "
                             "loaded")
    # a --spec-datastore (say of the model's own answers) ranks the tokens when given; else the offline corpus
    counts = store_counts(load_datastore(spec.datastore, target, tokenizer), draft.vocab_size) if spec.datastore \
        else vocab_counts(tokenizer, draft.vocab_size)
    return restrict_draft_vocab(draft, spec.draft_vocab_size, counts, special_ids(tokenizer, target.eos_token_ids))


class CrossVocabDrafter(DraftModelDrafter):
    """The draft model drafting across tokenizers by TLI or SLEM (see the module docstring)."""

    def __init__(self, runner: ModelRunner, cross: CrossVocab, p_min: float = 0.0,
                 vocab: DraftVocab | None = None) -> None:
        super().__init__(runner, p_min, vocab=vocab)  # vocab: a cut head's draft ids (--spec-draft-vocab-size)
        if cross.method not in METHODS:
            raise ValueError(f"unknown draft vocabulary method {cross.method!r}; choose from: {', '.join(METHODS)}")
        self.cross = cross
        self.mirror = DraftContext(cross.pair)
        d2t = cross.vocab.draft_to_target.to(runner.device)
        self.d2t = d2t
        self.twins = cross.vocab.draft_to_target.tolist()  # [V_draft] target twin ids, -1 where none
        self.mapped = torch.nonzero(d2t >= 0).flatten()  # [M] draft ids with a twin
        self.outside = torch.where(d2t >= 0, 0.0, float("-inf"))  # [V_draft] added to the draft's logits
        self.last_method: str | None = None

    @classmethod
    def from_config(
        cls, spec: SpecConfig, runner: ModelRunner | None = None, cross_vocab: CrossVocab | None = None,
        vocab: DraftVocab | None = None,
    ) -> CrossVocabDrafter:
        """``runner``: the loaded draft model; ``cross_vocab``: its tokenizer pair and vocabulary map;
        ``vocab``: the draft ids its cut head scores, if cut."""
        if runner is None or cross_vocab is None:
            raise ValueError("a cross-tokenizer draft model needs its runner and vocabulary map (see DraftResources)")
        return cls(runner, cross_vocab, p_min=spec.draft_p_min, vocab=vocab)

    @classmethod
    def shared_state(cls, setup: DraftSetup) -> SharedState:
        state = DraftModelState.load(setup)
        return SharedState(state, forget_prefixes=state.runner.forget_prefixes, nbytes=state.nbytes)

    @classmethod
    def from_shared(cls, spec: SpecConfig, shared: DraftModelState,
                    target: ModelRunner | None) -> DraftModelDrafter:
        """This drafter when the draft model's tokenizer is another; else a ``DraftModelDrafter``."""
        if shared.cross is None:
            return DraftModelDrafter.from_config(spec, runner=shared.runner, target=target, vocab=shared.vocab)
        return cls.from_config(spec, runner=shared.runner, cross_vocab=shared.cross, vocab=shared.vocab)

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        super().begin(prompt_ids, sampling)
        self.last_method = None

    def _reads(self, prompt_ids: Sequence[int]) -> Sequence[int]:
        self.mirror.reset()  # a new request's text
        return self.mirror.update(prompt_ids)

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
        """The draft's greedy text, re-encoded as target ids after each drafted token, until it writes
        ``max_tokens`` of them: the last is cut (it may merge with what follows) unless it is the twin of
        the draft's last token, so a draft token that is also a target token costs no pass beyond it."""
        drafted: list[int] = []
        tokens: list[int] = []
        for i in range(max_tokens + 1):
            token = self._top(logits)  # a cut head's row -> its draft id
            if token in self.cross.pair.draft_special or (
                    i > 0 and self.p_min > 0 and float(torch.softmax(logits.float(), dim=-1).max()) < self.p_min):
                break
            drafted.append(token)
            text = self.cross.pair.draft_text(draft_ids, drafted)
            tokens = self.cross.pair.target_continuation(context, text, last_twin=self.twins[token])
            if len(tokens) >= max_tokens or i == max_tokens:
                break
            logits = self._run([token])
        tokens = tokens[:max_tokens]
        if any(t >= self.cross.vocab.target_size for t in tokens):  # a tokenizer id past the model's logits
            tokens = tokens[: [t >= self.cross.vocab.target_size for t in tokens].index(True)]
        return DraftProposal(tokens) if tokens else EMPTY
