"""SpecType -> drafter class, and the state drafters share across requests.

Each drafter class declares the engine-wide state it reads (``Drafter.shared_state``: a cache learned
across requests, a loaded model); ``DraftResources`` builds it once per engine for the kinds it may
draft with and hands it to every new drafter of that kind (``Drafter.from_shared``).
"""

from __future__ import annotations

from collections.abc import Sequence

from specdec.config import SpecConfig, SpecType
from specdec.drafters.adaptive import AdaptiveDrafter
from specdec.drafters.base import ChainedDrafter, Drafter, DraftSetup, SharedState
from specdec.drafters.cross_vocab import CrossVocabDrafter
from specdec.drafters.draft_self import DraftSelfDrafter
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.layerskip import LayerSkipDrafter
from specdec.drafters.mtp import MtpDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.ngram_cache import NgramCacheDrafter
from specdec.drafters.ngram_map import NgramMapDrafter, NgramMapK4VDrafter
from specdec.drafters.ngram_mod import NgramModDrafter
from specdec.drafters.retrieval import RetrievalDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.runners.base import ModelRunner

# One class per spec type, each set up by its ``from_config``. Shared state is loaded in this order
# (the draft model before the datastore, each logging a line).
DRAFTERS: dict[SpecType, type[Drafter]] = {
    SpecType.NGRAM: NgramDrafter,
    SpecType.NGRAM_MAP_K: NgramMapDrafter,
    SpecType.NGRAM_MAP_K4V: NgramMapK4VDrafter,
    SpecType.NGRAM_MOD: NgramModDrafter,
    SpecType.NGRAM_CACHE: NgramCacheDrafter,
    SpecType.SUFFIX: SuffixDrafter,
    SpecType.DRAFT_SELF: DraftSelfDrafter,
    # the draft model: a DraftModelDrafter when it has the target's tokenizer (cross_vocab.py decides at load)
    SpecType.DRAFT_MODEL: CrossVocabDrafter,
    SpecType.RETRIEVAL: RetrievalDrafter,
    SpecType.EAGLE3: EagleDrafter,
    SpecType.DRAFT_LAYERSKIP: LayerSkipDrafter,
    SpecType.DRAFT_MTP: MtpDrafter,
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
    """The state drafters share across the requests of one engine, built once from each drafting
    class's ``shared_state`` (the suffix cache, the n-gram pool and counts, the draft model, the EAGLE
    head, the layer-skip search, the target's MTP module, the datastore). ``new_drafter`` hands each
    drafter its kind's state; ``forget`` and ``close`` call every state's hooks.

    target_model: what the target was loaded from (``load_runner``'s model): draft-mtp reads the MTP
    module shipped in that checkpoint. plan_drafts: False (``LLM(plan_drafts=False)``) builds adaptive
    without the target's measured pass cost, so no choice of member or length follows wall-clock time
    (the engine's plan is off then too): a server test of adaptive's windows once saw no member asked
    when the machine was busy."""

    def __init__(
        self,
        spec: SpecConfig,
        target: ModelRunner,
        tokenizer,
        max_num_seqs: int = 1,
        dtype: str = "float32",
        device: str | None = None,
        target_model: str | None = None,
        plan_drafts: bool = True,
        kv_cache_dtype: str = "auto",
    ) -> None:
        self.spec = spec
        self.target = target
        self.plan_drafts = plan_drafts
        setup = DraftSetup(spec, target, tokenizer, max_num_seqs=max_num_seqs, dtype=dtype, device=device,
                           target_model=target_model, kv_cache_dtype=kv_cache_dtype)
        types = drafting_types(spec)
        states = ((kind, cls.shared_state(setup)) for kind, cls in DRAFTERS.items() if kind in types)
        self.shared: dict[SpecType, SharedState] = {kind: state for kind, state in states if state is not None}

    def state(self, kind: SpecType):
        """What drafters of ``kind`` share on this engine (None: nothing, or ``kind`` not loaded)."""
        shared = self.shared.get(kind)
        return None if shared is None else shared.value

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
        """A new drafter of ``kind``, handed its kind's shared state."""
        if kind is SpecType.ADAPTIVE:  # built from its members, as a chain is
            members = [self._build(t) for t in adaptive_members(self.spec)]
            return AdaptiveDrafter.from_config(self.spec, members=members,
                                               target=self.target if self.plan_drafts else None,
                                               ledger=self.state(SpecType.ADAPTIVE))
        return DRAFTERS[kind].from_shared(self.spec, self.state(kind), self.target)

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
        for shared in self.shared.values():
            shared.forget()

    def forget_prefixes(self) -> None:
        """Drop the prompts the drafters' own KV caches keep (a draft model's freed slots)."""
        for shared in self.shared.values():
            shared.forget_prefixes()

    def close(self) -> None:
        """Save what must outlive the process: the learned n-gram counts to --spec-ngram-cache-file
        (NgramCacheFileError when it cannot)."""
        for shared in self.shared.values():
            shared.close()

    def nbytes(self) -> int | None:
        """Memory of the state drafters share across requests, where known (None: per-request only)."""
        known = [shared.nbytes() for shared in self.shared.values() if shared.nbytes is not None]
        return sum(known) if known else None
