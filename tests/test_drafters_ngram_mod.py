"""ngram-mod: the rolling-hash pool (llama.cpp's common_ngram_mod) and its drafter."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.config import SamplingParams, SpecConfig, SpecType
from specdec.drafters.ngram_mod import LCG_MULTIPLIER, MASK64, NgramHashPool, NgramModDrafter

SAMPLING = SamplingParams()


def reference_pool(tokens: list[int], n: int, size: int) -> tuple[np.ndarray, int]:
    """llama.cpp's add, window by window in order: (slots, number used)."""
    entries = np.full(size, -1, dtype=np.int32)
    for i in range(len(tokens) - n):
        h = 0
        for tok in tokens[i : i + n]:
            h = (h * LCG_MULTIPLIER + tok) & MASK64
        entries[h % size] = tokens[i + n]
    return entries, int(np.count_nonzero(entries != -1))


def test_pool_docstring_example():
    pool = NgramHashPool(2)
    pool.add(np.array([5, 6, 7, 8]))
    assert (pool.get([5, 6]), pool.get([6, 7]), pool.get([7, 8])) == (7, 8, -1)
    assert pool.num_used == 2


@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(st.integers(0, 49151), max_size=80), n=st.integers(1, 5), size=st.integers(1, 64),
       split=st.integers(0, 80))
def test_pool_add_equals_llama_cpp_in_order_writes(tokens, n, size, split):
    """Both paths (numpy for many windows, rolled Python for a step's few), in two calls, collisions included."""
    pool = NgramHashPool(n, size)
    first = tokens[: split + n]
    pool.add(np.array(first, dtype=np.int64))
    pool.add(np.array(tokens[max(len(first) - n, 0) :], dtype=np.int64))
    entries, used = reference_pool(tokens, n, size)
    assert np.array_equal(pool.entries, entries)
    assert pool.num_used == used


@given(tokens=st.lists(st.integers(0, 49151), min_size=4, max_size=12), n=st.integers(1, 3))
def test_rolled_hash_equals_fresh_hash(tokens, n):
    pool = NgramHashPool(n, 8)
    h = pool.hash(tokens[:n])
    for i in range(n, len(tokens)):
        h = pool.roll(h, tokens[i - n], tokens[i])
        assert h == pool.hash(tokens[i - n + 1 : i + 1])


def drafter(n_match: int = 2, n_min: int = 1, n_max: int = 8, pool: NgramHashPool | None = None) -> NgramModDrafter:
    return NgramModDrafter(pool or NgramHashPool(n_match, 1 << 12), n_min=n_min, n_max=n_max)


def test_repeated_pattern_is_proposed():
    """The module docstring's example: the pool continues the cycle past what the context held."""
    d = drafter()
    context = [5, 6, 7, 8, 5, 6]
    d.begin(context, SAMPLING)
    assert d.propose(context, 6).token_ids == [7, 8, 5, 6, 7, 8]
    assert d.propose(context, 2).token_ids == [7, 8]  # the engine's budget caps it
    assert d.propose([1, 2, 3], 4).token_ids == []  # an unseen key (a new sequence: restarts)


def test_repeat_within_the_output_is_drafted_at_once():
    d = drafter(n_match=3)
    prompt = [1, 2, 3]
    d.begin(prompt, SAMPLING)
    context = [*prompt, 40, 41, 42, 43, 40, 41, 42]
    assert d.propose(context, 4).token_ids == [43, 40, 41, 42]  # learned from tokens committed after begin


def test_hash_pool_is_shared_across_two_sequences():
    pool = NgramHashPool(3, 1 << 12)
    first, second = drafter(pool=pool), drafter(pool=pool)
    first.begin([9, 10, 11, 12, 13, 14, 15], SAMPLING)
    first.end([9, 10, 11, 12, 13, 14, 15, 16])
    second.begin([1, 10, 11, 12], SAMPLING)
    assert second.propose([1, 10, 11, 12], 4).token_ids == [13, 14, 15, 16]
    alone = drafter(n_match=3)  # its own pool never saw the first sequence
    alone.begin([1, 10, 11, 12], SAMPLING)
    assert alone.propose([1, 10, 11, 12], 4).token_ids == []


def test_short_drafts_are_dropped_and_n_min_scales_with_the_budget():
    pool = NgramHashPool(2, 1 << 12)
    drafter(pool=pool).begin([1, 2, 3, 7], SAMPLING)  # (1 2) -> 3, (2 3) -> 7, and (3 7) never continued
    context = [5, 1, 2]
    d = drafter(n_min=3, n_max=4, pool=pool)
    d.begin(context, SAMPLING)
    assert d.propose(context, 4).token_ids == []  # the chain [3, 7] is shorter than n_min 3
    assert d.propose(context, 2).token_ids == [3, 7]  # budget 2 of n_max 4: n_min 3 scales to 1
    d = drafter(n_min=2, n_max=4, pool=pool)
    d.begin(context, SAMPLING)
    assert d.propose(context, 4).token_ids == [3, 7]


def run_outcomes(outcomes: str) -> NgramHashPool:
    """Draft from the cycle 5 -> 6 -> 7 -> 5, with the target agreeing (g) or not (b) at each step.

    A disagreeing target commits one other token of the cycle, so the next key is known and
    every step drafts. Another sequence's entry (100 -> 101) shows whether the pool was emptied.
    """
    pool = NgramHashPool(1, 1 << 12)
    drafter(pool=pool).begin([100, 101], SAMPLING)
    d = drafter(pool=pool)
    context = [5, 6, 7, 5]
    d.begin(context, SAMPLING)
    for outcome in outcomes:
        proposal = d.propose(context, 2).token_ids
        assert len(proposal) == 2
        if outcome == "g":
            context = [*context, *proposal, 5]  # both accepted, then the bonus token
            d.accept(context, 2)
        else:
            context = [*context, next(t for t in (5, 6, 7) if t != proposal[0])]
            d.accept(context, 0)
    return pool


def test_three_poorly_accepted_drafts_empty_the_shared_pool():
    assert run_outcomes("bb").get([100]) == 101
    pool = run_outcomes("bbb")
    assert pool.get([100]) == -1  # emptied ...
    assert pool.get([5]) != -1  # ... and this sequence indexed again from its start


def test_a_well_accepted_draft_ends_the_streak():
    assert run_outcomes("bbgbb").get([100]) == 101


def test_begin_empties_a_pool_more_than_a_quarter_full():
    pool = NgramHashPool(1, 8)
    d = drafter(pool=pool)
    d.begin([1, 2], SAMPLING)
    assert pool.num_used == 1
    d.begin([1, 2, 3, 4], SAMPLING)  # 3 of 8 slots > 25%
    assert pool.num_used == 0


def test_from_config_uses_the_shared_pool_and_the_flags():
    spec = SpecConfig(types=(SpecType.NGRAM_MOD,), ngram_mod_n_match=5, ngram_mod_n_min=2, ngram_mod_n_max=6)
    pool = NgramHashPool(5, 64)
    d = NgramModDrafter.from_config(spec, pool=pool)
    assert d.pool is pool and (d.n_min, d.n_max) == (2, 6)
    private = NgramModDrafter.from_config(spec)
    assert private.pool.n == 5 and private.pool is not pool


@pytest.mark.parametrize("changes", [dict(ngram_mod_n_min=9, ngram_mod_n_max=8), dict(ngram_mod_n_match=0),
                                     dict(ngram_mod_n_min=0)])
def test_bad_settings_are_refused(changes):
    with pytest.raises(ValueError, match="spec-ngram-mod"):
        SpecConfig(types=(SpecType.NGRAM_MOD,), **changes)


@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(st.integers(0, 4), min_size=1, max_size=60), prompt_len=st.integers(1, 20),
       max_tokens=st.integers(1, 6), n_match=st.integers(1, 3), n_min=st.integers(1, 4))
def test_proposals_stay_in_budget(tokens, prompt_len, max_tokens, n_match, n_min):
    d = drafter(n_match=n_match, n_min=n_min, n_max=4)
    d.begin(tokens[:prompt_len], SAMPLING)
    for end in range(min(prompt_len, len(tokens)), len(tokens) + 1):
        proposal = d.propose(tokens[:end], max_tokens)
        assert len(proposal) <= min(max_tokens, 4) and proposal.probs is None and proposal.parents is None
        assert len(proposal) == 0 or len(proposal) >= max(1, n_min * min(max_tokens, 4) // 4)
        d.accept(tokens[: end + 1], 0)
    d.end(tokens)
