"""Token-list drafters that copy from the context: ngram, ngram-map-k(4v), draft-self."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.config import SamplingParams, SpecConfig
from specdec.drafters.base import DraftProposal, TokenBuffer
from specdec.drafters.draft_self import DraftSelfDrafter, Kept, SelfHistoryIndex
from specdec.drafters.ngram import NgramDrafter, find_ngram_continuation
from specdec.drafters.ngram_map import (
    KeyStats,
    NgramIndex,
    NgramMapDrafter,
    NgramMapK4VDrafter,
    ValueStats,
    chains_to_proposal,
    split_budget,
)

SAMPLING = SamplingParams()
# Small vocabularies make repeats (and so matches) common.
token_lists = st.lists(st.integers(0, 3), max_size=60)
chunk_sizes = st.lists(st.integers(1, 7), min_size=1, max_size=20)


def chunks(tokens: list[int], sizes: list[int]) -> list[list[int]]:
    """Split tokens into consecutive pieces with the given sizes (cycled)."""
    out, i, k = [], 0, 0
    while i < len(tokens):
        out.append(tokens[i : i + sizes[k % len(sizes)]])
        i += sizes[k % len(sizes)]
        k += 1
    return out


def assert_valid(proposal: DraftProposal, max_tokens: int) -> None:
    """At most max_tokens, deterministic, and a proper trie when it is a tree."""
    assert len(proposal) <= max_tokens
    assert proposal.probs is None
    if len(proposal):
        tree = proposal.to_tree(root=-1)
        for kids in tree.children:
            siblings = [tree.tokens[c] for c in kids]
            assert len(siblings) == len(set(siblings))


def reference_continuation(tokens, max_n, min_n, max_tokens, min_hits):
    """Brute force: the longest n-gram with enough earlier hits, most recent hit."""
    num = len(tokens)
    for n in range(min(max_n, num - 1), min_n - 1, -1):
        hits = [j for j in range(n - 1, num - 1) if list(tokens[j - n + 1 : j + 1]) == tokens[num - n :]]
        if hits and len(hits) >= min_hits:
            return tokens[hits[-1] + 1 : hits[-1] + 1 + max_tokens]
    return []


# ---------------------------------------------------------------- find_ngram_continuation


def test_ngram_docstring_example():
    tokens = np.array([1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3])
    assert find_ngram_continuation(tokens, max_n=3, min_n=1, max_tokens=4) == [5, 1, 2, 3]
    assert find_ngram_continuation(tokens, max_n=3, min_n=1, max_tokens=4, min_hits=3) == []


def test_ngram_falls_back_to_shorter_n():
    tokens = np.array([5, 2, 3, 7, 1, 2, 3])  # [1 2 3] never occurred before; [2 3] did
    assert find_ngram_continuation(tokens, max_n=3, min_n=2, max_tokens=8) == [7, 1, 2, 3]
    assert find_ngram_continuation(tokens, max_n=3, min_n=3, max_tokens=8) == []


def test_ngram_prefers_longest_match_over_most_recent():
    # [9 1 2] matches at 0..2 (3 tokens); only [1 2] matches at 4..5 (more recent).
    tokens = np.array([9, 1, 2, 6, 1, 2, 7, 9, 1, 2])
    assert find_ngram_continuation(tokens, max_n=3, min_n=1, max_tokens=2) == [6, 1]


def test_ngram_periodic_text_extends_itself():
    tokens = np.array([4, 4, 4])
    assert find_ngram_continuation(tokens, max_n=2, min_n=1, max_tokens=5) == [4]


def test_ngram_short_inputs():
    assert find_ngram_continuation(np.array([], dtype=np.int64), 3, 1, 4) == []
    assert find_ngram_continuation(np.array([1]), 3, 1, 4) == []
    assert find_ngram_continuation(np.array([1, 1]), 3, 1, 4) == [1]


@settings(max_examples=300, deadline=None)
@given(
    token_lists,
    st.integers(1, 6),
    st.integers(1, 6),
    st.integers(1, 8),
    st.integers(1, 3),
)
def test_ngram_matches_brute_force(tokens, max_n, min_n, max_tokens, min_hits):
    min_n = min(min_n, max_n)
    got = find_ngram_continuation(np.array(tokens, dtype=np.int64), max_n, min_n, max_tokens, min_hits)
    assert got == reference_continuation(tokens, max_n, min_n, max_tokens, min_hits)
    assert len(got) <= max_tokens


# ---------------------------------------------------------------- TokenBuffer


def test_token_buffer_docstring_example():
    buf = TokenBuffer()
    assert buf.last is None
    buf.extend([5, 6, 7])
    buf.extend([8])
    assert buf.tokens.tolist() == [5, 6, 7, 8]
    assert buf.last == 8 and len(buf) == 4
    buf.reset()
    assert len(buf) == 0 and buf.last is None


@settings(max_examples=100, deadline=None)
@given(token_lists, chunk_sizes)
def test_token_buffer_grows_incrementally(tokens, sizes):
    buf = TokenBuffer(capacity=4)  # small, so it must grow
    for piece in chunks(tokens, sizes):
        buf.extend(piece)
    assert buf.tokens.tolist() == tokens


# ---------------------------------------------------------------- NgramDrafter


def test_ngram_drafter_proposes_after_root():
    drafter = NgramDrafter(max_n=3, min_n=1, max_tokens=48)
    prompt = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3]
    drafter.begin(prompt, SAMPLING)
    assert drafter.propose(prompt, 4).token_ids == [5, 1, 2, 3]
    assert drafter.propose(prompt, 2).token_ids == [5, 1]  # the engine's cap wins


def test_ngram_drafter_caps_at_its_own_max_tokens_and_min_hits():
    prompt = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3]
    drafter = NgramDrafter(max_n=3, min_n=1, max_tokens=3)
    drafter.begin(prompt, SAMPLING)
    assert drafter.propose(prompt, 8).token_ids == [5, 1, 2]
    strict = NgramDrafter(max_n=3, min_n=1, min_hits=3)
    strict.begin(prompt, SAMPLING)
    assert len(strict.propose(prompt, 8)) == 0


def test_ngram_drafter_syncs_without_accept_and_restarts_on_new_sequence():
    drafter = NgramDrafter(max_n=3, min_n=1)
    drafter.begin([7, 8], SAMPLING)
    context = [7, 8, 9, 7, 8]
    assert drafter.propose(context, 4).token_ids == [9, 7, 8]  # no accept() in between
    other = [1, 2, 1]  # a different request, begin() never called
    assert drafter.propose(other, 4).token_ids == [2, 1]


def test_ngram_drafter_from_config():
    spec = SpecConfig(ngram_size_n=5, ngram_size_m=7, ngram_min_hits=2)
    drafter = NgramDrafter.from_config(spec)
    assert (drafter.max_n, drafter.min_n, drafter.max_tokens, drafter.min_hits) == (5, 2, 7, 2)
    with pytest.raises(ValueError):
        NgramDrafter(max_n=2, min_n=3)


# ---------------------------------------------------------------- NgramIndex


def test_ngram_index_docstring_example():
    index = NgramIndex(key_size=2, num_values=4)
    index.update(np.array([7, 8, 1, 7, 8, 2, 7, 8]))
    assert index.get((7, 8)) == KeyStats(count=2, start=5, values={1: ValueStats(1, 2), 2: ValueStats(1, 5)})
    assert index.get((1, 7)) == KeyStats(count=1, start=4, values={8: ValueStats(1, 4)})
    assert index.num_indexed == 8
    keys_only = NgramIndex(key_size=2)  # ngram-map-k keeps no values
    keys_only.update(np.array([7, 8, 1, 7, 8, 2, 7, 8]))
    assert keys_only.get((7, 8)) == KeyStats(count=2, start=5)


def test_ngram_index_evicts_rarest_then_oldest_value():
    index = NgramIndex(key_size=1, num_values=2)
    index.update([0, 5, 0, 5, 0, 6, 0, 7])  # after 0: 5 twice, then 6, then 7
    assert index.get((0,)).values == {5: ValueStats(2, 3), 7: ValueStats(1, 7)}


@settings(max_examples=150, deadline=None)
@given(token_lists, chunk_sizes, st.integers(1, 4), st.integers(0, 3))
def test_ngram_index_incremental_equals_rebuilt(tokens, sizes, key_size, num_values):
    incremental = NgramIndex(key_size, num_values)
    seen: list[int] = []
    for piece in chunks(tokens, sizes):
        seen += piece
        incremental.update(np.array(seen, dtype=np.int64))
    rebuilt = NgramIndex(key_size, num_values)
    rebuilt.update(np.array(tokens, dtype=np.int64))
    assert incremental.keys == rebuilt.keys
    assert incremental.num_indexed == rebuilt.num_indexed == len(tokens)


# ---------------------------------------------------------------- split_budget, chains_to_proposal


def test_split_budget_docstring_examples():
    assert split_budget([3, 1], [100, 100], 8) == [6, 2]
    assert split_budget([3, 1], [2, 100], 8) == [2, 6]
    assert split_budget([5, 1, 1, 1], [9] * 4, 3) == [3, 0, 0, 0]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 9), st.integers(0, 9)), min_size=1, max_size=4),
    st.integers(0, 20),
)
def test_split_budget_respects_limits(branches, budget):
    counts, available = zip(*branches, strict=True)
    nodes = split_budget(counts, available, budget)
    assert all(0 <= n <= a for n, a in zip(nodes, available, strict=True))
    assert sum(nodes) == min(budget, sum(available))


def test_chains_to_proposal_merges_prefixes():
    proposal = chains_to_proposal([[5, 6, 7], [5, 9], [4]])
    assert proposal.token_ids == [5, 6, 7, 9, 4]
    assert proposal.parents == [0, 1, 2, 1, 0]
    assert_valid(proposal, 5)
    assert chains_to_proposal([[1, 2]]).parents is None
    assert len(chains_to_proposal([])) == 0


# ---------------------------------------------------------------- NgramMapDrafter, NgramMapK4VDrafter


def test_ngram_map_k_drafts_most_recent_continuation():
    drafter = NgramMapDrafter(key_size=2)
    context = [7, 8, 1, 2, 7, 8, 5, 6, 7, 8]
    drafter.begin(context, SAMPLING)
    assert drafter.propose(context, 3).token_ids == [5, 6, 7]


def test_ngram_map_k_min_hits():
    context = [7, 8, 1, 2, 7, 8]
    drafter = NgramMapDrafter(key_size=2, min_hits=2)
    drafter.begin(context, SAMPLING)
    assert len(drafter.propose(context, 4)) == 0
    context = context + [1, 7, 8]
    assert drafter.propose(context, 4).token_ids == [1, 7, 8]


def test_ngram_map_k_limits_a_key_after_a_partial_accept():
    drafter = NgramMapDrafter(key_size=2)
    context = [7, 8, 1, 2, 3, 7, 8]
    drafter.begin(context, SAMPLING)
    assert drafter.propose(context, 4).token_ids == [1, 2, 3, 7]
    context = context + [9]  # the target disagreed at once: 0 accepted
    drafter.accept(context, 0)
    context = context + [7, 8]
    assert drafter.propose(context, 4).token_ids == [9]  # a one-token probe for (7, 8)
    context = context + [9, 4]  # the probe was accepted (plus a bonus token)
    drafter.accept(context, 1)
    context = context + [7, 8]
    assert drafter.propose(context, 4).token_ids == [9, 4, 7, 8]  # the limit is lifted


def test_ngram_map_k4v_docstring_example():
    context = [7, 8, 1, 2, 7, 8, 1, 3, 7, 8, 5, 6, 7, 8]
    drafter = NgramMapK4VDrafter(key_size=2)
    drafter.begin(context, SAMPLING)
    proposal = drafter.propose(context, 4)
    assert proposal.token_ids == [1, 3, 7, 5]
    assert proposal.parents == [0, 1, 2, 0]
    assert_valid(proposal, 4)


def test_ngram_map_k4v_single_value_is_a_chain():
    context = [7, 8, 1, 2, 7, 8]
    drafter = NgramMapK4VDrafter(key_size=2)
    drafter.begin(context, SAMPLING)
    proposal = drafter.propose(context, 3)
    assert proposal.token_ids == [1, 2, 7] and proposal.parents is None


def test_ngram_map_from_config_caps_key_size():
    spec = SpecConfig(ngram_size_n=12, ngram_size_m=9, ngram_min_hits=2)
    drafter = NgramMapK4VDrafter.from_config(spec)
    assert isinstance(drafter, NgramMapK4VDrafter)
    assert (drafter.key_size, drafter.max_tokens, drafter.min_hits) == (4, 9, 2)
    assert NgramMapDrafter.from_config(SpecConfig(ngram_size_n=3)).key_size == 3
    assert NgramMapDrafter.from_config(spec, key_size=6).key_size == 6


# ---------------------------------------------------------------- draft-self


def test_self_history_docstring_example():
    index = SelfHistoryIndex(key_size=2, max_run=16)
    index.extend([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 9, 1, 2])
    assert index.kept[(1, 2)] == Kept(start=6, run=2)
    assert index.lookup((1, 2)) == 6


def test_self_history_ignores_the_prompt():
    index = SelfHistoryIndex(key_size=2, prompt_len=4)
    index.extend([1, 2, 3, 4])  # the prompt
    index.extend([1, 2])  # output repeats the prompt's key
    assert index.lookup((1, 2)) is None


def test_self_history_stale_continuation_gives_way():
    index = SelfHistoryIndex(key_size=1, max_run=2)
    index.extend([0, 1, 2, 0, 1, 2])  # (0,) -> "1 2" confirmed for 2 tokens
    assert index.lookup((0,)) == 4
    index.extend([0, 7, 0, 7, 0])  # the model moved on to "7"
    assert index.text[index.lookup((0,))] == 7


@settings(max_examples=150, deadline=None)
@given(token_lists, chunk_sizes, st.integers(1, 3), st.integers(1, 4), st.integers(0, 10))
def test_self_history_incremental_equals_rebuilt(tokens, sizes, key_size, max_run, prompt_len):
    incremental = SelfHistoryIndex(key_size, max_run, prompt_len)
    for piece in chunks(tokens, sizes):
        incremental.extend(piece)
    rebuilt = SelfHistoryIndex(key_size, max_run, prompt_len)
    rebuilt.extend(tokens)
    assert vars(incremental) == vars(rebuilt)


def test_draft_self_drafter_copies_kept_continuation():
    drafter = DraftSelfDrafter(key_size=2, max_tokens=3)
    prompt = [1, 2]
    drafter.begin(prompt, SAMPLING)
    assert len(drafter.propose(prompt, 8)) == 0  # the prompt is not indexed
    context = prompt + [1, 2, 3, 4, 1, 2]
    assert drafter.propose(context, 8).token_ids == [3, 4, 1]
    assert drafter.propose(context, 2).token_ids == [3, 4]
    assert DraftSelfDrafter.from_config(SpecConfig(ngram_size_m=5)).max_tokens == 5


# ---------------------------------------------------------------- every drafter here


@pytest.mark.parametrize(
    "make",
    [
        lambda: NgramDrafter(max_n=4, min_n=1),
        lambda: NgramMapDrafter(key_size=1),
        lambda: NgramMapK4VDrafter(key_size=1),
        lambda: DraftSelfDrafter(key_size=1),
    ],
)
@settings(max_examples=60, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 4), min_size=1, max_size=60),
    prompt_len=st.integers(1, 20),
    max_tokens=st.integers(1, 6),
)
def test_proposals_stay_in_budget_and_valid(make, tokens, prompt_len, max_tokens):
    drafter = make()
    drafter.begin(tokens[:prompt_len], SAMPLING)
    for end in range(min(prompt_len, len(tokens)), len(tokens) + 1):
        proposal = drafter.propose(tokens[:end], max_tokens)
        assert_valid(proposal, max_tokens)
        drafter.accept(tokens[: end + 1], 0)
    drafter.end(tokens)
