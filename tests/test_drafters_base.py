"""The drafter interface: DraftProposal, ChainedDrafter, IndexingDrafter's sync, and the registry."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import FrozenInstanceError

import pytest
import torch

from specdec.config import SamplingParams, SpecConfig, SpecType
from specdec.drafters.adaptive import AdaptiveDrafter
from specdec.drafters.base import EMPTY, ChainedDrafter, Drafter, DraftProposal, IndexingDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.draft_self import DraftSelfDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.ngram_cache import NgramCacheDrafter, load_counts
from specdec.drafters.ngram_map import NgramMapDrafter, NgramMapK4VDrafter
from specdec.drafters.ngram_mod import NgramHashPool, NgramModDrafter
from specdec.drafters.registry import DRAFTERS, DraftResources
from specdec.drafters.suffix import SuffixDrafter

SAMPLING = SamplingParams()


# -- DraftProposal -------------------------------------------------------------------------------


def test_proposal_from_tree_stores_a_chain_as_a_chain():
    chain = DraftProposal.from_tree([5, 6, 7], [0, 1, 2])
    assert chain.parents is None and chain.is_chain
    tree = DraftProposal.from_tree([5, 8, 6], [0, 0, 1])
    assert tree.parents == [0, 0, 1] and not tree.is_chain
    assert DraftProposal([5, 6], [0, 1]).is_chain  # explicit chain parents still read as a chain


def test_first_path_follows_first_children():
    probs = torch.rand(4, 10)
    # root -> 5 -> 6, root -> 8, 5 -> 9: first children are 5 then 6
    tree = DraftProposal([5, 8, 6, 9], [0, 0, 1, 1], probs)
    path = tree.first_path()
    assert path.token_ids == [5, 6] and path.parents is None
    assert torch.equal(path.probs, probs[[0, 2]])
    chain = DraftProposal([1, 2])
    assert chain.first_path() is chain


def test_truncate_keeps_a_tree_prefix():
    tree = DraftProposal([5, 8, 6, 9], [0, 0, 1, 1])
    assert tree.truncate(3) == DraftProposal([5, 8, 6], [0, 0, 1])
    assert tree.truncate(9) is tree


def test_a_proposal_is_frozen_and_copies_keep_its_fields():
    probs = torch.rand(3, 10)
    tree = DraftProposal.from_tree([5, 8, 6], [0, 0, 1], probs=probs, drafter="a+b", origins=["a", "b", "a"])
    with pytest.raises(FrozenInstanceError):
        tree.drafter = "c"  # type: ignore[misc]
    cut = tree.truncate(2)
    assert (cut.token_ids, cut.parents, cut.drafter, cut.origins) == ([5, 8], [0, 0], "a+b", ["a", "b"])
    assert torch.equal(cut.probs, probs[:2])
    path = tree.first_path()
    assert (path.token_ids, path.parents, path.drafter, path.origins) == ([5, 6], None, "a+b", ["a", "a"])
    assert tree.token_ids == [5, 8, 6] and tree.drafter == "a+b"  # the original is unchanged


# -- ChainedDrafter ------------------------------------------------------------------------------


class Fixed(Drafter):
    def __init__(self, draft: list[int]) -> None:
        self.draft, self.accepted = draft, []

    def propose(self, context, max_tokens):
        return DraftProposal(self.draft[:max_tokens]) if self.draft else EMPTY

    def accept(self, context, num_accepted):
        self.accepted.append(num_accepted)


class Stored(Drafter):
    """Returns the same proposal object every step."""

    name = "stored"

    def __init__(self, proposal: DraftProposal) -> None:
        self.proposal = proposal

    def propose(self, context, max_tokens):
        return self.proposal


def test_chained_drafter_takes_the_first_non_empty_proposal():
    empty, first, second = Fixed([]), Fixed([1, 2]), Fixed([3])
    chained = ChainedDrafter([empty, first, second])
    assert chained.propose([0], 4).token_ids == [1, 2] and chained.last_used == 1
    assert chained.propose([0], 4).drafter == "drafter"  # named after the member that proposed it
    stored = Stored(DraftProposal([4, 5]))
    assert ChainedDrafter([empty, stored]).propose([0], 4).drafter == "stored"
    assert stored.proposal.drafter == ""  # a new proposal: the member's own is left as it was
    chained.accept([0, 1, 2], 2)
    assert (empty.accepted, first.accepted, second.accepted) == ([0], [2], [0])
    with pytest.raises(ValueError):
        ChainedDrafter([])


# -- IndexingDrafter._sync: catch up with the context, or restart --------------------------------


class Recorder(IndexingDrafter):
    """Records the hooks ``_sync`` calls, and what ``seen`` holds at each."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[int]]] = []

    def propose(self, context, max_tokens):
        self._sync(context)
        return EMPTY

    def _index(self, new_ids: Sequence[int]) -> None:
        self.calls.append(("index", list(new_ids)))
        assert self.seen.tokens[len(self.seen) - len(new_ids) :].tolist() == list(new_ids)  # already appended

    def _reset_index(self) -> None:
        self.calls.append(("reset", self.seen.tokens.tolist()))  # seen holds the new sequence already


def test_sync_docstring_example():
    d = Recorder()
    for context in ([5, 6, 7], [5, 6, 7, 8], [5, 6, 7, 8], [9, 9], [9], [9, 1]):
        d._sync(context)
    assert d.calls == [
        ("index", [5, 6, 7]),
        ("index", [8]),
        ("index", []),  # nothing new
        ("reset", [9, 9]), ("index", [9, 9]),  # disagrees at the last seen token
        ("reset", [9]), ("index", [9]),  # shorter than what was seen
        ("index", [1]),
    ]
    assert d.seen.tokens.tolist() == [9, 1]


def test_begin_restarts_and_accept_syncs():
    d = Recorder()
    d.begin([1, 2], SAMPLING)
    d.propose([1, 2], 4)
    d.accept([1, 2, 3, 4], 1)
    d.begin([7], SAMPLING)
    assert d.calls == [("reset", [1, 2]), ("index", [1, 2]), ("index", []), ("index", [3, 4]),
                       ("reset", [7]), ("index", [7])]


TOKEN_DRAFTERS = [
    lambda: NgramDrafter(max_n=3, min_n=1),
    lambda: NgramMapDrafter(key_size=2),
    lambda: NgramMapK4VDrafter(key_size=2),
    lambda: SuffixDrafter(tree=True),
    lambda: DraftSelfDrafter(key_size=2),
    lambda: NgramModDrafter(NgramHashPool(2, 1 << 10), n_min=1, n_max=8),
    lambda: NgramCacheDrafter(),
]


@pytest.mark.parametrize("make", TOKEN_DRAFTERS,
                         ids=["ngram", "map-k", "map-k4v", "suffix", "draft-self", "ngram-mod", "ngram-cache"])
def test_a_new_sequence_without_begin_drafts_as_after_begin(make):
    first = [1, 2, 3, 1, 2, 3, 1, 2]
    other = [7, 8, 9, 7, 8, 9, 4, 7, 8, 9, 7, 8]
    reused = make()
    reused.begin(first, SAMPLING)
    reused.propose(first, 4)
    reused.accept([*first, 3], 1)
    fresh = make()
    fresh.begin(other, SAMPLING)
    assert reused.propose(other, 4) == fresh.propose(other, 4)
    grown = [*other, 9, 7, 8]
    assert reused.propose(grown, 4) == fresh.propose(grown, 4)


# -- the registry ----------------------------------------------------------------------------------


def test_registry_has_one_class_per_spec_type():
    assert set(DRAFTERS) == set(SpecType) - {SpecType.NONE}
    for kind, cls in DRAFTERS.items():
        assert cls.name == kind.value


def test_new_drafter_chains_and_shares_the_suffix_cache():
    spec = SpecConfig(types=(SpecType.SUFFIX, SpecType.NGRAM, SpecType.DRAFT_SELF), draft_n_max=5)
    res = DraftResources(spec, target=None, tokenizer=None)  # no draft model: no target needed
    one, two = res.new_drafter(), res.new_drafter()
    assert isinstance(one, ChainedDrafter) and one.name == "suffix,ngram,draft-self"
    assert one.drafters[0].cache is res.state(SpecType.SUFFIX) is two.drafters[0].cache
    assert one.drafters[0].max_tokens == 5
    assert DraftResources(SpecConfig(types=(SpecType.NONE,)), target=None, tokenizer=None).new_drafter() is None


def test_adaptive_resources_load_its_members_and_requests_may_name_one():
    res = DraftResources(SpecConfig(), target=None, tokenizer=None)  # the default: adaptive
    drafter = res.new_drafter()
    assert isinstance(drafter, AdaptiveDrafter) and res.state(SpecType.SUFFIX) is not None
    assert [m.drafter.name for m in drafter.members] == ["ngram", "ngram-map-k", "suffix"]
    assert drafter.members[2].drafter.cache is res.state(SpecType.SUFFIX)
    assert res.new_drafter([SpecType.SUFFIX]).name == "suffix"  # a member alone, for one request
    with pytest.raises(ValueError, match="not loaded"):
        res.new_drafter([SpecType.DRAFT_SELF])


def test_forget_empties_the_suffix_cache_in_place():
    res = DraftResources(SpecConfig(types=(SpecType.SUFFIX,)), target=None, tokenizer=None)
    drafter = res.new_drafter()
    drafter.begin([1, 2, 3], SAMPLING)
    drafter.end([1, 2, 3, 4, 5])
    cache = res.state(SpecType.SUFFIX)
    assert len(cache) == 1 and cache.trie.count([4, 5]) == 1 and cache.nbytes() > 0
    res.forget()
    assert res.state(SpecType.SUFFIX) is cache and len(cache) == 0 and cache.num_tokens == 0
    assert cache.trie.count([4, 5]) == 0


def test_ngram_pool_and_counts_are_shared_forgotten_and_saved(tmp_path):
    path = tmp_path / "lookup.bin"
    spec = SpecConfig(types=(SpecType.NGRAM_CACHE, SpecType.NGRAM_MOD), ngram_mod_n_match=2,
                      ngram_cache_file=str(path))
    res = DraftResources(spec, target=None, tokenizer=None)
    one, two = res.new_drafter(), res.new_drafter()
    assert one.name == "ngram-cache,ngram-mod"
    assert one.drafters[0].store is res.state(SpecType.NGRAM_CACHE) is two.drafters[0].store
    assert one.drafters[1].pool is res.state(SpecType.NGRAM_MOD) is two.drafters[1].pool
    one.begin([1, 2, 3], SAMPLING)
    one.end([1, 2, 3, 4, 5])
    assert res.state(SpecType.NGRAM_MOD).get([4, 5]) == -1 and res.state(SpecType.NGRAM_MOD).get([3, 4]) == 5
    assert res.state(SpecType.NGRAM_CACHE).dynamic.get((3, 4)) == {5: 1}
    res.close()
    assert load_counts(path).get((3, 4)) == {5: 1}
    res.forget()
    assert res.state(SpecType.NGRAM_MOD).num_used == 0 and len(res.state(SpecType.NGRAM_CACHE).dynamic) == 0


def test_shared_state_is_what_each_class_declares():
    """DraftResources builds only the declared state of the kinds it may draft with, and sizes it."""
    assert DraftResources(SpecConfig(types=(SpecType.NGRAM,)), target=None, tokenizer=None).nbytes() is None
    res = DraftResources(SpecConfig(types=(SpecType.SUFFIX, SpecType.NGRAM_MOD)), target=None, tokenizer=None)
    assert set(res.shared) == {SpecType.SUFFIX, SpecType.NGRAM_MOD}
    assert res.state(SpecType.NGRAM) is None
    assert res.nbytes() == res.state(SpecType.SUFFIX).nbytes() + res.state(SpecType.NGRAM_MOD).nbytes()


def test_from_config_needs_what_a_drafter_cannot_make():
    with pytest.raises(ValueError, match="draft model"):
        DraftModelDrafter.from_config(SpecConfig())
    with pytest.raises(TypeError):
        Fixed.from_config(SpecConfig())
    with pytest.raises(TypeError):  # a drafter is handed only what it reads, by name
        NgramDrafter.from_config(SpecConfig(), cache=None)


# -- wrappers forward every Drafter method ---------------------------------------------------------
def _drafter_methods() -> list[str]:
    """Every public method of the Drafter protocol (a new one joins this list by itself)."""
    return sorted(name for name, value in vars(Drafter).items()
                  if callable(value) and not name.startswith("_") and name != "from_config")


class Spy(Drafter):
    """Records each call; answers what no default would, so a forwarded answer is told from a default."""

    name = "spy"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattribute__(self, name):
        if name in _drafter_methods():
            calls = object.__getattribute__(self, "calls")
            answers = {"propose": DraftProposal([7]), "windows": {"spy-member": "window"}, "catch_up_seconds": 2.5,
                       "planned_alpha": 0.123, "token_seconds": 0.01}
            return lambda *args: calls.append(name) or answers.get(name)
        return object.__getattribute__(self, name)

    def propose(self, context, max_tokens):  # abstract in Drafter; replaced by __getattribute__
        raise AssertionError


CALL_ARGS = {"bind_slot": (3,), "begin": ([1, 2], SamplingParams()), "observe": ({-1: torch.zeros(1, 2)},),
             "propose": ([1, 2], 4), "accept": ([1, 2], 1), "end": ([1, 2],), "windows": (),
             "catch_up_seconds": ([1, 2],), "planned_alpha": (0.5,), "token_seconds": ()}


def _wrapped_spies() -> list[tuple[Drafter, Spy]]:
    from specdec.server.guards import GuardedDrafter

    class Request:
        id, error = "r", None

    spies = [Spy(), Spy()]
    for spy in spies:
        spy.hidden_layers = (-1,)  # so a chain forwards observe
    return [(GuardedDrafter(spies[0], Request()), spies[0]), (ChainedDrafter([spies[1]]), spies[1])]


@pytest.mark.parametrize("method", _drafter_methods())
def test_wrappers_forward_every_drafter_method(method):
    """GuardedDrafter (the server's) and ChainedDrafter reach their inner drafter on every method of
    Drafter and hand back its answer: a method added to Drafter fails here until both forward it
    (GuardedDrafter once dropped planned_alpha and catch_up_seconds, ChainedDrafter windows)."""
    assert method in CALL_ARGS, f"Drafter.{method} is new: give it arguments here"
    for wrapper, inner in _wrapped_spies():
        answer = getattr(wrapper, method)(*CALL_ARGS[method])
        assert inner.calls == [method], (type(wrapper).__name__, method)
        if method == "propose":
            assert answer.token_ids == [7]
        elif method == "windows":
            assert answer == {"spy-member": "window"}
        elif method == "catch_up_seconds":
            assert answer == 2.5
        elif method == "token_seconds":
            assert answer == 0.01
        elif method == "planned_alpha":
            assert answer in (0.123, 0.5)  # the chain plans with the monitor's alpha unless no member drafts
