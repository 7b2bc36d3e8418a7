"""ngram-cache: llama.cpp's lookup cache (context, dynamic and static n-gram counts) and its file."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.config import SamplingParams, SpecConfig, SpecType
from specdec.drafters.ngram_cache import (
    NgramCacheDrafter,
    NgramCacheFileError,
    NgramCacheStore,
    NgramCounts,
    draft_tokens,
    load_counts,
    save_counts,
)

SAMPLING = SamplingParams()


def counts_of(tokens: list[int]) -> NgramCounts:
    counts = NgramCounts()
    counts.update(tokens, len(tokens))
    return counts


def test_counts_docstring_example():
    counts = counts_of([7, 8, 7, 9])
    assert counts.get((7,)) == {8: 1, 9: 1}
    assert counts.get((8, 7)) == {9: 1}
    assert counts.get((9,)) is None


@settings(max_examples=40, deadline=None)
@given(tokens=st.lists(st.integers(0, 3), max_size=40), cut=st.integers(0, 40))
def test_incremental_counts_equal_counts_of_the_whole(tokens, cut):
    counts = NgramCounts()
    counts.update(tokens[:cut], len(tokens[:cut]))
    counts.update(tokens, len(tokens) - len(tokens[:cut]))
    naive: dict = {}
    for size in range(1, 5):
        for i in range(size, len(tokens)):
            part = naive.setdefault(tuple(tokens[i - size : i]), {})
            part[tokens[i]] = part.get(tokens[i], 0) + 1
    assert counts.parts == naive


def test_repeated_pattern_is_proposed():
    """The module docstring's example: the context tier continues the cycle."""
    empty = NgramCounts()
    tokens = [1, 2, 3, 1, 2, 3, 1, 2]
    assert draft_tokens(tokens, 5, counts_of(tokens), empty, empty) == [3, 1, 2, 3, 1]
    d = NgramCacheDrafter()
    d.begin(tokens, SAMPLING)
    assert d.propose(tokens, 4).token_ids == [3, 1, 2, 3]


def test_a_unigram_needs_two_samples_and_a_majority():
    empty = NgramCounts()
    once = [7, 8, 5, 7]  # (7,) -> 8 once: too few samples; no longer n-gram was seen
    assert draft_tokens(once, 3, counts_of(once), empty, empty) == []
    twice = [7, 8, 5, 7, 8, 6, 7]  # (7,) -> 8 twice, and (6, 7) unseen
    assert draft_tokens(twice, 1, counts_of(twice), empty, empty) == [8]
    split = [7, 8, 5, 7, 9, 6, 7]  # (7,) -> {8: 1, 9: 1}: no 66% majority
    assert draft_tokens(split, 1, counts_of(split), empty, empty) == []


def test_the_dynamic_tier_is_shared_across_requests_and_stricter():
    store = NgramCacheStore()
    first = NgramCacheDrafter(store)
    first.begin([10, 11, 12, 13, 14] * 3, SAMPLING)
    first.end([10, 11, 12, 13, 14] * 3)
    second = NgramCacheDrafter(store)
    context = [1, 10, 11, 12, 13]
    second.begin(context, SAMPLING)
    assert second.propose(context, 4).token_ids == [14, 10, 11, 12]
    assert NgramCacheDrafter().propose(context, 4).token_ids == []  # a store that never saw the first
    once = NgramCacheStore()
    NgramCacheDrafter(once).end([10, 11, 12, 13, 14])  # a 4-gram seen once passes LAX but not STRICT
    assert NgramCacheDrafter(once).propose(context, 4).token_ids == []


def test_the_static_tier_weighs_candidates_and_drafts_alone():
    empty = NgramCounts()
    tokens = [1, 2, 3, 4, 8, 1, 2, 3, 4, 9, 1, 2, 3, 4]  # (1 2 3 4) -> {8: 1, 9: 1}: the first wins a tie
    assert draft_tokens(tokens, 1, counts_of(tokens), empty, empty) == [8]
    static = NgramCounts()
    static.parts[(3, 4)] = {9: 1}  # the static counts of the last 2 tokens favour 9
    assert draft_tokens(tokens, 1, counts_of(tokens), empty, static) == [9]
    static.parts[(1, 2)] = {3: 2}
    assert draft_tokens([5, 1, 2], 3, empty, empty, static) == [3]  # alone: 2 samples, 100%; (2 3) unknown


def layout(counts: NgramCounts) -> list[int]:
    """llama.cpp's common_ngram_cache_save layout, written out by hand."""
    out = []
    for ngram, part in counts.parts.items():
        out += [*ngram, *[-1] * (4 - len(ngram)), len(part)]
        for tok, count in part.items():
            out += [tok, count]
    return out


def test_cache_file_round_trip_in_llama_cpp_layout(tmp_path):
    counts = counts_of([7, 8, 7, 9, 7, 8])
    path = tmp_path / "lookup.bin"
    save_counts(counts, path)
    assert np.fromfile(path, dtype="<i4").tolist() == layout(counts)
    assert load_counts(path, vocab_size=10).parts == counts.parts


def test_store_loads_at_start_and_saves_what_requests_taught_it(tmp_path):
    path = tmp_path / "lookup.bin"
    store = NgramCacheStore(str(path))  # no file yet: starts empty
    assert len(store.dynamic) == 0
    d = NgramCacheDrafter(store)
    d.begin([10, 11, 12, 13, 14] * 2, SAMPLING)
    d.end([10, 11, 12, 13, 14] * 3)
    store.save()
    again = NgramCacheStore(str(path))
    assert again.dynamic.parts == store.dynamic.parts
    context = [1, 10, 11, 12, 13]
    assert NgramCacheDrafter(again).propose(context, 2).token_ids == [14, 10]
    again.clear()  # the bench's cold start: the learned tier is forgotten
    assert NgramCacheDrafter(again).propose(context, 2).token_ids == []


@pytest.mark.parametrize(
    "data,message",
    [
        (b"\x01\x00\x00", "not a whole number of int32"),
        ([7, -1, -1, -1, 2, 8, 1], "cut short"),
        ([7, -1, -1], "cut short"),
        ([7, -1, -1, -1, 0], "has 0 next tokens"),
        ([-1, 7, -1, -1, 1, 8, 1], "invalid n-gram"),
        ([7, -1, -1, -1, 1, 8, 0], "count below 1"),
        ([7, -1, -1, -1, 1, 99, 1], "beyond this model's vocabulary (10 tokens)"),
    ],
)
def test_bad_cache_file_is_one_clear_error(tmp_path, data, message):
    path = tmp_path / "bad.bin"
    path.write_bytes(data if isinstance(data, bytes) else np.asarray(data, dtype="<i4").tobytes())
    with pytest.raises(NgramCacheFileError, match="is not an n-gram cache file") as info:
        NgramCacheStore(str(path), vocab_size=10)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_unreadable_or_unwritable_paths_fail_at_start(tmp_path):
    with pytest.raises(NgramCacheFileError, match="cannot read the n-gram cache file"):
        NgramCacheStore(str(tmp_path))  # a folder
    with pytest.raises(NgramCacheFileError, match="no folder"):
        NgramCacheStore(str(tmp_path / "missing" / "lookup.bin"))
    with pytest.raises(NgramCacheFileError, match="cannot read"):
        NgramCacheStore(static_path=str(tmp_path / "absent.bin"))  # a static file must exist


def test_dynamic_tier_keeps_its_most_frequent_ngrams():
    store = NgramCacheStore(max_ngrams=8)
    store.add(counts_of([1, 2, 1, 2, 1, 2, 1, 2]))  # few n-grams, seen often
    store.add(counts_of([30, 31, 32, 33, 34, 35]))  # many n-grams, seen once
    assert len(store.dynamic) <= 8
    assert store.dynamic.get((1,)) == {2: 4}


def test_cache_flags_need_the_drafter():
    with pytest.raises(ValueError, match="need --spec-type ngram-cache"):
        SpecConfig(types=(SpecType.NGRAM,), ngram_cache_file="x.bin")
    spec = SpecConfig(types=(SpecType.NGRAM_CACHE,), ngram_cache_file="x.bin")
    store = NgramCacheStore()
    assert NgramCacheDrafter.from_config(spec, store=store).store is store


@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(st.integers(0, 4), min_size=1, max_size=60), prompt_len=st.integers(1, 20),
       max_tokens=st.integers(1, 6))
def test_proposals_stay_in_budget(tokens, prompt_len, max_tokens):
    store = NgramCacheStore()
    for _ in range(2):  # the second request also drafts from the first's counts
        d = NgramCacheDrafter(store)
        d.begin(tokens[:prompt_len], SAMPLING)
        for end in range(min(prompt_len, len(tokens)), len(tokens) + 1):
            proposal = d.propose(tokens[:end], max_tokens)
            assert len(proposal) <= max_tokens and proposal.probs is None and proposal.parents is None
            d.accept(tokens[: end + 1], 0)
        d.end(tokens)
