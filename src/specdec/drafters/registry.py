"""SpecType -> drafter class, and the state drafters share across requests."""

from __future__ import annotations

from collections.abc import Sequence

from specdec.config import SpecConfig, SpecType
from specdec.datastore import Datastore, tokenizer_identity
from specdec.drafters.adaptive import AdaptiveDrafter
from specdec.drafters.base import ChainedDrafter, Drafter
from specdec.drafters.cross_vocab import CrossVocab, CrossVocabDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.draft_self import DraftSelfDrafter
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.frequent_vocab import DraftVocab, restrict_draft_vocab, special_ids, store_counts, vocab_counts
from specdec.drafters.heads import load_eagle_head, load_mtp_head
from specdec.drafters.layerskip import LayerSkipDrafter, SkipSearch
from specdec.drafters.mtp import MtpDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.ngram_cache import NgramCacheDrafter, NgramCacheStore
from specdec.drafters.ngram_map import NgramMapDrafter, NgramMapK4VDrafter
from specdec.drafters.ngram_mod import NgramHashPool, NgramModDrafter
from specdec.drafters.retokenize import TokenizerPair
from specdec.drafters.retrieval import RetrievalDrafter
from specdec.drafters.suffix import SuffixCache, SuffixDrafter
from specdec.drafters.vocab_map import VocabMap
from specdec.errors import ModelLoadError
from specdec.log import get_logger
from specdec.runners.base import ModelRunner
from specdec.runners.load import load_runner
from specdec.text import load_tokenizer

logger = get_logger(__name__)

# One class per spec type, each set up by its ``from_config``; ``DraftResources._build`` hands the
# ones that read engine-wide state (a shared cache, a loaded model) what they read.
DRAFTERS: dict[SpecType, type[Drafter]] = {
    SpecType.NGRAM: NgramDrafter,
    SpecType.NGRAM_MAP_K: NgramMapDrafter,
    SpecType.NGRAM_MAP_K4V: NgramMapK4VDrafter,
    SpecType.NGRAM_MOD: NgramModDrafter,
    SpecType.NGRAM_CACHE: NgramCacheDrafter,
    SpecType.SUFFIX: SuffixDrafter,
    SpecType.DRAFT_SELF: DraftSelfDrafter,
    SpecType.DRAFT_MODEL: DraftModelDrafter,
    SpecType.EAGLE3: EagleDrafter,
    SpecType.DRAFT_LAYERSKIP: LayerSkipDrafter,
    SpecType.DRAFT_MTP: MtpDrafter,
    SpecType.RETRIEVAL: RetrievalDrafter,
    SpecType.ADAPTIVE: AdaptiveDrafter,
}

# What --spec-type adaptive asks each step: the cheap drafters, by name (add a SpecType here to
# add it to the set), then the neural ones that the user gave a model for (``adaptive_members``).
ADAPTIVE_MEMBERS: tuple[SpecType, ...] = (SpecType.NGRAM, SpecType.NGRAM_MAP_K, SpecType.SUFFIX)


def adaptive_members(spec: SpecConfig) -> tuple[SpecType, ...]:
    """The members of an adaptive drafter: ``ADAPTIVE_MEMBERS``, plus retrieval with --spec-datastore,
    draft-model with --draft-model (FR-Spec's cut head with --spec-draft-vocab-size), eagle3 with
    --spec-model and draft-layerskip with --spec-layerskip-layers or --spec-layerskip-exit (opt-in: a
    layer-skipping draft costs a large share of a pass). Each is priced by its measured drafting time."""
    lookup = (SpecType.RETRIEVAL,) if spec.datastore else ()
    neural = ((SpecType.DRAFT_MODEL,) if spec.draft_model else ()) + ((SpecType.EAGLE3,) if spec.spec_model else ())
    neural += (SpecType.DRAFT_LAYERSKIP,) if spec.adaptive_layerskip else ()
    return ADAPTIVE_MEMBERS + lookup + neural


def drafting_types(spec: SpecConfig) -> tuple[SpecType, ...]:
    """Every drafter ``spec`` may build: its types, "adaptive" spelled out as its members."""
    out: list[SpecType] = []
    for t in spec.types:
        out += [t, *adaptive_members(spec)] if t is SpecType.ADAPTIVE else [t]
    return tuple(dict.fromkeys(t for t in out if t is not SpecType.NONE))


class DraftResources:
    """The state drafters share across the requests of one engine: the suffix cache, the n-gram pool and
    counts, the draft model, the EAGLE head, the layer-skip search (so its skip set is found once per
    model), the target's MTP module. ``new_drafter`` hands each drafter the parts it reads (``_build``);
    ``close`` saves what must outlive the process (the ngram-cache file).

    target_model: what the target was loaded from (``load_runner``'s model): draft-mtp reads the MTP
    module shipped in that checkpoint."""

    def __init__(
        self,
        spec: SpecConfig,
        target: ModelRunner,
        tokenizer,
        max_num_seqs: int = 1,
        dtype: str = "float32",
        device: str | None = None,
        target_model: str | None = None,
    ) -> None:
        self.spec = spec
        types = drafting_types(spec)
        self.suffix_cache = SuffixCache() if SpecType.SUFFIX in types else None
        self.ngram_mod_pool = NgramHashPool(spec.ngram_mod_n_match) if SpecType.NGRAM_MOD in types else None
        vocab_size = target.vocab_size if target is not None else None
        self.ngram_cache = NgramCacheStore(spec.ngram_cache_file, spec.ngram_cache_static, vocab_size) \
            if SpecType.NGRAM_CACHE in types else None
        self.draft_runner: ModelRunner | None = None
        self.cross_vocab: CrossVocab | None = None  # set when the draft model's tokenizer differs
        if SpecType.DRAFT_MODEL in types:
            self.draft_runner, folder = load_runner(
                spec.draft_model, dtype=dtype, device=device,
                max_seq_len=target.max_seq_len, num_slots=max_num_seqs,
            )
            self.cross_vocab = cross_vocab_for(spec, target, self.draft_runner, tokenizer, folder)
        self.draft_vocab = draft_vocab_for(spec, self.draft_runner, tokenizer, target, self.cross_vocab) \
            if SpecType.DRAFT_MODEL in types else None
        self.datastore = load_datastore(spec.datastore, target, tokenizer) if SpecType.RETRIEVAL in types else None
        self.target = target
        self.eagle_head = load_eagle_head(spec.spec_model, target, tokenizer, spec.parallel_drafting) \
            if SpecType.EAGLE3 in types else None
        self.layerskip = SkipSearch.from_spec(spec, target) if SpecType.DRAFT_LAYERSKIP in types else None
        # draft-mtp: the target checkpoint's module, or one trained for it (`specdec train mtp`, --spec-model)
        self.mtp_head = load_mtp_head(spec.spec_model or target_model, target) if SpecType.DRAFT_MTP in types \
            else None

    def new_drafter(self, types: Sequence[SpecType] | None = None) -> Drafter | None:
        """A fresh drafter for one request (None when speculation is off).

        types: a request's own choice among the loaded methods, chained in the order given
        (() = plain decoding; None = all of ``spec.types``). Raises ValueError for a method
        this engine did not load.
        """
        types = self.loaded(types)
        if not types:
            return None
        drafters = [self._build(t) for t in types]
        return drafters[0] if len(drafters) == 1 else ChainedDrafter(drafters)

    def _build(self, kind: SpecType) -> Drafter:
        """A new drafter of ``kind``, handed the engine-wide objects it reads, each by name and type."""
        spec = self.spec
        match kind:
            case SpecType.NGRAM_MOD:
                return NgramModDrafter.from_config(spec, pool=self.ngram_mod_pool)
            case SpecType.NGRAM_CACHE:
                return NgramCacheDrafter.from_config(spec, store=self.ngram_cache)
            case SpecType.SUFFIX:
                return SuffixDrafter.from_config(spec, cache=self.suffix_cache)
            case SpecType.DRAFT_MODEL if self.cross_vocab is not None:
                return CrossVocabDrafter.from_config(spec, runner=self.draft_runner, cross_vocab=self.cross_vocab)
            case SpecType.DRAFT_MODEL:
                return DraftModelDrafter.from_config(spec, runner=self.draft_runner, target=self.target,
                                                     vocab=self.draft_vocab)
            case SpecType.RETRIEVAL:
                return RetrievalDrafter.from_config(spec, store=self.datastore,
                                                    tree=self.target is not None and self.target.supports_trees)
            case SpecType.EAGLE3:
                return EagleDrafter.from_config(spec, head=self.eagle_head, target=self.target)
            case SpecType.DRAFT_LAYERSKIP:
                return LayerSkipDrafter.from_config(spec, target=self.target, search=self.layerskip)
            case SpecType.DRAFT_MTP:
                return MtpDrafter.from_config(spec, mtp_head=self.mtp_head, target=self.target)
            case SpecType.ADAPTIVE:
                members = [self._build(t) for t in adaptive_members(spec)]
                return AdaptiveDrafter.from_config(spec, members=members, target=self.target)
        return DRAFTERS[kind].from_config(spec)  # the rest read the context alone

    def loaded(self, types: Sequence[SpecType] | None = None) -> tuple[SpecType, ...]:
        """``types`` less "none" (None = the configured methods); ValueError if one was not loaded here.

        A --spec-type adaptive engine has its members loaded too: a request may name one of them alone.
        """
        if types is None:
            return tuple(t for t in self.spec.types if t is not SpecType.NONE)
        mine = drafting_types(self.spec)
        if unknown := [t.value for t in types if t not in mine and t is not SpecType.NONE]:
            raise ValueError(f"drafter {', '.join(unknown)} is not loaded on this server; "
                             f"choose from: {', '.join(t.value for t in mine + (SpecType.NONE,))}")
        return tuple(t for t in types if t is not SpecType.NONE)

    def forget(self) -> None:
        """Empty what drafters learned from earlier requests (the suffix cache, the n-gram pool and counts):
        the next request starts cold."""
        if self.suffix_cache is not None:
            self.suffix_cache.clear()
        if self.ngram_mod_pool is not None:
            self.ngram_mod_pool.reset()
        if self.ngram_cache is not None:
            self.ngram_cache.clear()

    def close(self) -> None:
        """Save the learned n-gram counts to --spec-ngram-cache-file (NgramCacheFileError when it cannot)."""
        if self.ngram_cache is not None:
            self.ngram_cache.save()


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
    return CrossVocab(TokenizerPair(tokenizer, draft_tok), vocab, spec.draft_vocab)


def draft_vocab_for(spec: SpecConfig, draft: ModelRunner, tokenizer, target: ModelRunner,
                    cross_vocab: CrossVocab | None) -> DraftVocab | None:
    """--spec-draft-vocab-size N: the draft's LM head cut to the N tokens most frequent in the offline
    corpus (or in --spec-datastore's), special tokens kept (``frequent_vocab``); None without the flag."""
    if spec.draft_vocab_size is None:
        return None
    if cross_vocab is not None or tokenizer is None:
        raise ModelLoadError("--spec-draft-vocab-size ranks the target's tokens: it needs a draft model with the "
                             "target's tokenizer (and the tokenizer loaded)")
    # a --spec-datastore (say of the model's own answers) ranks the tokens when given; else the offline corpus
    counts = store_counts(load_datastore(spec.datastore, target, tokenizer), draft.vocab_size) if spec.datastore \
        else vocab_counts(tokenizer, draft.vocab_size)
    return restrict_draft_vocab(draft, spec.draft_vocab_size, counts, special_ids(tokenizer, target.eos_token_ids))


def load_datastore(path: str, target: ModelRunner, tokenizer) -> Datastore:
    """--spec-datastore, checked against the target's tokenizer (its vocabulary size alone when no
    tokenizer is loaded, as for token-id tests); DatastoreError (one line) when it does not fit."""
    store = Datastore.load(path)
    store.check_tokenizer(tokenizer_identity(tokenizer) if tokenizer is not None else None, target.vocab_size,
                          where=path)
    logger.warning("specdec: retrieval datastore %s: %s tokens from %s", path, f"{store.num_tokens:,}",
                   store.sources or "token ids")
    return store
