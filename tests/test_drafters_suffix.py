"""Suffix decoding: the lazy suffix trie, the shared cache, and the drafter."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.config import SamplingParams, SpecConfig
from specdec.drafters.base import DraftProposal
from specdec.drafters.suffix import SuffixCache, SuffixDrafter, SuffixTrie

SAMPLING = SamplingParams()
sequences = st.lists(st.lists(st.integers(0, 3), max_size=30), min_size=1, max_size=4)


def naive_counts(seqs: list[list[int]], max_depth: int) -> dict[tuple[int, ...], int]:
    """Occurrences of every substring of up to max_depth tokens, within each sequence."""
    counts: dict[tuple[int, ...], int] = {}
    for seq in seqs:
        for i in range(len(seq)):
            for d in range(1, min(max_depth, len(seq) - i) + 1):
                key = tuple(seq[i : i + d])
                counts[key] = counts.get(key, 0) + 1
    return counts


def assert_counts_match(trie: SuffixTrie, seqs: list[list[int]], probes: list[list[int]]) -> None:
    expected = naive_counts(seqs, trie.max_depth)
    for key, n in expected.items():
        assert trie.count(list(key)) == n, key
    for probe in probes:
        assert trie.count(probe) == expected.get(tuple(probe), 0), probe


def num_nodes(trie: SuffixTrie) -> int:
    stack, total = [trie.root], 0
    while stack:
        node = stack.pop()
        total += 1
        stack.extend((node.children or {}).values())
    return total


def assert_valid(proposal: DraftProposal, max_tokens: int) -> None:
    assert len(proposal) <= max_tokens
    if len(proposal):
        tree = proposal.to_tree(root=-1)
        for kids in tree.children:
            siblings = [tree.tokens[c] for c in kids]
            assert len(siblings) == len(set(siblings))


def run_request(drafter: SuffixDrafter, prompt: list[int], output: list[int]) -> list[list[int]]:
    """Generate ``output`` one token per step (nothing accepted); returns each step's draft."""
    drafter.begin(prompt, SAMPLING)
    context, drafts = list(prompt), []
    for tok in output:
        drafts.append(drafter.propose(context, 8).token_ids)
        context.append(tok)
        drafter.accept(context, 0)
    drafter.end(context)
    return drafts


# ---------------------------------------------------------------- SuffixTrie


def test_trie_docstring_example():
    trie = SuffixTrie(max_depth=3)
    trie.extend([1, 2, 3, 1, 2, 4])
    assert trie.count([1, 2]) == 2
    assert trie.count([2, 3]) == 1
    assert trie.count([3, 2]) == 0
    assert trie.count([1, 2, 3]) == trie.count([1, 2, 4]) == 1
    with pytest.raises(ValueError):
        trie.count([1, 2, 3, 1])  # deeper than max_depth


def test_trie_is_lazy():
    """Text that never repeats needs one node per token, not max_depth per token."""
    trie = SuffixTrie(max_depth=24)
    trie.extend(range(1000))
    assert num_nodes(trie) == 1000 + 1  # plus the root
    assert trie.count(list(range(10, 34))) == 1


@settings(max_examples=200, deadline=None)
@given(
    sequences,
    st.integers(2, 6),
    st.lists(st.integers(1, 5), min_size=1, max_size=8),
    st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=6), max_size=20),
)
def test_trie_incremental_counts_equal_naive(seqs, max_depth, sizes, probes):
    trie = SuffixTrie(max_depth)
    for seq in seqs:
        i, k = 0, 0
        while i < len(seq):  # arrive in uneven chunks, as accepted tokens do
            trie.extend(seq[i : i + sizes[k % len(sizes)]])
            i += sizes[k % len(sizes)]
            k += 1
        trie.close()
    assert_counts_match(trie, seqs, [p[:max_depth] for p in probes])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=40), st.integers(2, 6))
def test_own_match_equals_searched_match(tokens, max_depth):
    trie = SuffixTrie(max_depth)
    for tok in tokens:
        trie.extend([tok])
        own_len, own_cursor = trie.longest_own_match()
        found_len, found_cursor = trie.longest_match(trie.tail(max_depth - 1))
        assert own_len == found_len
        assert (own_cursor is None) == (found_cursor is None)


def test_longest_match_example():
    trie = SuffixTrie(max_depth=8)
    trie.extend([4, 5, 6, 7, 1])
    trie.close()
    assert trie.longest_match([9, 5, 6]) == (2, trie.longest_match([5, 6])[1])
    assert trie.longest_match([9, 1])[0] == 0  # [1] only ever ended a sequence
    assert trie.longest_match([3])[0] == 0


def expand_example_trie() -> SuffixTrie:
    """After [7]: children {1: 3 times, 2: once}; after [7, 1] always 3, then the end."""
    trie = SuffixTrie(max_depth=8)
    for seq in ([7, 1, 3], [7, 1, 3], [7, 1, 3], [7, 2]):
        trie.extend(seq)
        trie.close()
    return trie


def test_expand_docstring_example():
    trie = expand_example_trie()
    match_len, cursor = trie.longest_match([7])
    assert match_len == 1
    chain = trie.expand(cursor, budget=3, min_prob=0.1, tree=False)
    assert (chain.token_ids, chain.parents) == ([1, 3], [0, 1])
    assert chain.score == pytest.approx(1.5)
    tree = trie.expand(cursor, budget=3, min_prob=0.1, tree=True)
    assert (tree.token_ids, tree.parents) == ([1, 3, 2], [0, 1, 0])
    assert tree.score == pytest.approx(1.75)
    pruned = trie.expand(cursor, budget=3, min_prob=0.5, tree=True)
    assert pruned.token_ids == [1, 3]  # 2 has probability 0.25
    assert trie.expand(cursor, budget=1, min_prob=0.1, tree=True).token_ids == [1]


def test_remove_prefix_needs_whole_closed_sequences():
    trie = SuffixTrie(max_depth=4)
    trie.extend([1, 2, 3])
    with pytest.raises(ValueError):
        trie.remove_prefix(4)  # still open
    trie.close()
    with pytest.raises(ValueError):
        trie.remove_prefix(2)  # mid-sequence
    trie.remove_prefix(4)
    assert trie.count([1]) == 0 and num_nodes(trie) == 1


# ---------------------------------------------------------------- SuffixCache


def test_cache_eviction_bounds_size():
    cache = SuffixCache(max_depth=4, max_sequences=2, max_tokens=10)
    cache.add([1, 2, 3])
    cache.add([4, 5, 6])
    cache.add([7, 8, 9])
    assert len(cache) == 2 and cache.num_tokens == 6
    assert cache.trie.count([1]) == 0 and cache.trie.count([7, 8]) == 1
    cache.add(list(range(20, 29)))  # 9 tokens: only it fits next to nothing else
    assert len(cache) == 1 and cache.num_tokens == 9
    cache.add(list(range(100, 130)))  # longer than max_tokens: its tail is kept
    assert cache.num_tokens == 10 and cache.trie.count([129]) == 1 and cache.trie.count([119]) == 0


@settings(max_examples=150, deadline=None)
@given(sequences, st.integers(2, 5), st.integers(1, 3), st.integers(1, 40))
def test_cache_counts_equal_naive_after_eviction(seqs, max_depth, max_sequences, max_tokens):
    cache = SuffixCache(max_depth, max_sequences, max_tokens)
    stored: list[list[int]] = []
    for seq in seqs:
        cache.add(seq)
        if seq:
            stored.append(seq[-max_tokens:])
        while len(stored) > max_sequences or sum(map(len, stored)) > max_tokens:
            stored.pop(0)
        assert len(cache) == len(stored) <= max_sequences
        assert cache.num_tokens == sum(map(len, stored)) <= max_tokens
        assert_counts_match(cache.trie, stored, [])


# ---------------------------------------------------------------- SuffixDrafter


def test_cache_helps_a_second_identical_request():
    prompt = list(range(100, 130))
    output = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    cache = SuffixCache()
    first = SuffixDrafter(cache)
    assert run_request(first, prompt, output)[0] == []  # nothing to copy yet
    assert cache.num_tokens == 23 + len(output)  # the prompt's last max_depth - 1 tokens + output
    second = SuffixDrafter(cache)
    second.begin(prompt, SAMPLING)
    assert second.propose(prompt, 8).token_ids == output[:8]
    assert second.propose(prompt + output[:5], 8).token_ids == output[5:]


def test_local_trie_drafts_beyond_max_depth():
    drafter = SuffixDrafter(max_depth=4, max_spec_factor=10.0)
    text = list(range(20))
    context = text + text[:5]
    drafter.begin(context, SAMPLING)
    assert drafter.propose(context, 10).token_ids == text[5:15]  # match is only 3 tokens


def test_max_spec_factor_limits_short_matches():
    context = [1, 2, 3, 4, 5, 6, 1]
    drafter = SuffixDrafter(max_spec_factor=1.0)  # a 1-token match drafts 1 token
    drafter.begin(context, SAMPLING)
    assert drafter.propose(context, 8).token_ids == [2]
    drafter = SuffixDrafter()  # the default, 2: it drafts 2
    drafter.begin(context, SAMPLING)
    assert drafter.propose(context, 8).token_ids == [2, 3]


def test_tree_mode_proposes_alternatives():
    context = [9, 1, 3, 9, 1, 3, 9, 2, 5, 9]  # after 9: 1 twice, 2 once
    drafter = SuffixDrafter(tree=True, max_spec_factor=4.0)
    drafter.begin(context, SAMPLING)
    proposal = drafter.propose(context, 4)
    assert_valid(proposal, 4)
    root_children = [t for t, p in zip(proposal.token_ids, proposal.parents, strict=True) if p == 0]
    assert sorted(root_children) == [1, 2]
    chain = SuffixDrafter(max_spec_factor=4.0)
    chain.begin(context, SAMPLING)
    assert chain.propose(context, 4).token_ids[:2] == [1, 3]


def test_suffix_from_config_uses_shared_cache():
    cache = SuffixCache()
    drafter = SuffixDrafter.from_config(SpecConfig(draft_n_max=5), cache=cache)
    assert drafter.cache is cache and drafter.max_tokens == 5 and not drafter.tree
    alone = SuffixDrafter.from_config(SpecConfig(), tree=True)
    assert alone.tree and isinstance(alone.cache, SuffixCache)  # a private cache


@settings(max_examples=60, deadline=None)
@given(sequences, st.integers(1, 6), st.booleans())
def test_proposals_stay_in_budget_and_valid(seqs, max_tokens, tree):
    cache = SuffixCache(max_depth=5, max_tokens=60)
    drafter = SuffixDrafter(cache, max_depth=5, tree=tree, min_prob=0.0, max_spec_factor=3.0)
    for seq in seqs:
        prompt, output = seq[: len(seq) // 2], seq[len(seq) // 2 :]
        drafter.begin(prompt, SAMPLING)
        context = list(prompt)
        for tok in output:
            assert_valid(drafter.propose(context, max_tokens), max_tokens)
            context.append(tok)
            drafter.accept(context, 0)
        drafter.end(context)
