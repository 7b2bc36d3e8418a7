"""The verifier on hand-made logits: greedy prefixes, trees, and rejection sampling's distribution."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

import specdec.verify as verify_mod
from specdec.config import SamplingParams
from specdec.row_dist import BlockDist
from specdec.tree import DraftTree
from specdec.verify import verify, verify_greedy, verify_sampling

V = 6


def one_hot_logits(best: list[int]) -> torch.Tensor:
    logits = torch.zeros(len(best), V)
    logits[torch.arange(len(best)), torch.tensor(best)] = 5.0
    return logits


def test_greedy_chain_keeps_matching_prefix_and_recovers():
    tree = DraftTree.chain(root=0, draft_ids=[1, 2, 3])
    result = verify_greedy(tree, one_hot_logits([1, 2, 4, 5]))
    assert result.token_ids == [1, 2, 4]  # a, b accepted; c rejected; x recovered
    assert result.path == [0, 1, 2]
    assert result.num_accepted == 2


def test_greedy_chain_all_accepted_gets_bonus():
    tree = DraftTree.chain(0, [1, 2])
    assert verify_greedy(tree, one_hot_logits([1, 2, 5])).token_ids == [1, 2, 5]


def test_greedy_empty_draft_is_plain_decoding():
    assert verify_greedy(DraftTree.chain(0, []), one_hot_logits([3])).token_ids == [3]


def test_greedy_tree_follows_the_matching_branch():
    # root 0 -> {1 -> 2, 3 -> 4}; target wants 3 then 4 then 5
    tree = DraftTree([0, 1, 2, 3, 4], [-1, 0, 1, 0, 3])
    logits = one_hot_logits([3, 0, 0, 4, 5])
    result = verify_greedy(tree, logits)
    assert result.token_ids == [3, 4, 5]
    assert result.path == [0, 3, 4]


def test_tree_equals_chain_on_single_path_trees():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        k = int(torch.randint(0, 5, (1,), generator=gen))
        drafts = torch.randint(0, V, (k,), generator=gen).tolist()
        logits = torch.randn(k + 1, V, generator=gen)
        chain = DraftTree.chain(0, drafts)
        as_tree = DraftTree([0, *drafts], [-1, *range(k)])
        assert verify_greedy(chain, logits) == verify_greedy(as_tree, logits)


# -- sampling: the distribution of the first emitted token must be exactly p ---------------

P = torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03, 0.0])
Q_BAD = torch.tensor([0.02, 0.03, 0.05, 0.1, 0.3, 0.5])  # far from p: most drafts get rejected
N_SAMPLES = 6000


def first_token_counts(tree_tokens, parents, draft_probs, seed=0, blocks=False) -> torch.Tensor:
    """Draw a fresh draft each time (from q, or fixed tokens) and count the first emitted token. blocks: the target
    as logits log P at T=1, each row a ``row_dist.BlockDist`` (the verifier's CPU rows for deterministic drafts)."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V)
    target = P.expand(len(tree_tokens), V).clone()
    if blocks:
        target = verify_mod.RowProbs(torch.log(target), SamplingParams(temperature=1.0))
        assert isinstance(target[0], BlockDist)
    for _ in range(N_SAMPLES):
        tokens = list(tree_tokens)
        if draft_probs is not None:  # a chain of one token drawn from q
            tokens = [0, int(torch.multinomial(draft_probs[0], 1, generator=gen))]
        result = verify_sampling(DraftTree(tokens, parents), target, draft_probs, gen)
        counts[result.token_ids[0]] += 1
    return counts


def pvalue(counts: torch.Tensor) -> float:
    expected = P * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token with p = 0 was emitted"
    return chisquare(counts[keep].numpy(), expected[keep].numpy()).pvalue


@pytest.mark.parametrize(
    "tokens,parents,probs",
    [
        ([0, 4], [-1, 0], None),  # deterministic chain drafting an unlikely token
        ([0, 0], [-1, 0], Q_BAD.unsqueeze(0)),  # sampled chain, q far from p
        ([0, 4, 3, 1], [-1, 0, 0, 0], None),  # a tree: three distinct siblings
        ([0, 5], [-1, 0], None),  # drafting a token the target never emits
    ],
    ids=["one-hot-chain", "bad-q-chain", "tree", "impossible-token"],
)
def test_rejection_sampling_keeps_target_distribution(tokens, parents, probs):
    assert pvalue(first_token_counts(tokens, parents, probs)) > 1e-3


@pytest.mark.parametrize("tokens,parents", [([0, 4], [-1, 0]), ([0, 4, 3, 1], [-1, 0, 0, 0]), ([0, 5], [-1, 0])],
                         ids=["one-hot-chain", "tree", "impossible-token"])
def test_rejection_sampling_over_block_rows_keeps_target_distribution(tokens, parents):
    assert pvalue(first_token_counts(tokens, parents, None, blocks=True)) > 1e-3


# -- deliberately broken verifiers: the chi-square test above is evidence only if it fails these ------


@pytest.mark.parametrize("broken", [lambda p_x, q_x: 1.0, lambda p_x, q_x: p_x],
                         ids=["accept-always", "ignores-q"])
def test_statistical_test_catches_broken_verifier_acceptance(monkeypatch, broken):
    """The real verifier with its acceptance rule broken (always keep the draft; keep it with p(x) as if
    q were one-hot): the same chi-square test that passes the real rule must fail these."""
    assert pvalue(first_token_counts([0, 0], [-1, 0], Q_BAD.unsqueeze(0))) > 1e-3  # the real rule passes
    monkeypatch.setattr(verify_mod, "_acceptance", broken)
    assert pvalue_or_zero(first_token_counts([0, 0], [-1, 0], Q_BAD.unsqueeze(0))) < 1e-3


def test_statistical_test_catches_broken_verifier_resampling_from_p(monkeypatch):
    # The classic bug: after a rejection, sample from p instead of the residual max(0, p - q).
    monkeypatch.setattr(verify_mod, "_residual", lambda p, q, x: p)
    assert pvalue(first_token_counts([0, 0], [-1, 0], Q_BAD.unsqueeze(0))) < 1e-3
    assert pvalue(first_token_counts([0, 4], [-1, 0], None, seed=1)) < 1e-3  # one-hot q too
    assert pvalue(first_token_counts([0, 4], [-1, 0], None, seed=1, blocks=True)) < 1e-3  # rows in blocks too


def pvalue_or_zero(counts: torch.Tensor) -> float:
    expected = P * counts.sum()
    if counts[expected == 0].sum() > 0:
        return 0.0
    return pvalue(counts)


def test_verify_dispatches_on_temperature():
    tree = DraftTree.chain(0, [1])
    logits = one_hot_logits([1, 2])
    assert verify(tree, logits, SamplingParams()).token_ids == [1, 2]
    sampled = verify(tree, logits * 10, SamplingParams(temperature=0.5), None, torch.Generator().manual_seed(0))
    assert sampled.token_ids == [1, 2]  # one-hot-ish p: accept and bonus are certain


def test_sampled_rows_are_made_as_the_walk_reaches_them(monkeypatch):
    """verify makes the target's p of a node only when the walk reads it (rows past the first rejection never),
    each as ``probs_from_logits`` of that row alone: the same draws as from every row made up front."""
    from specdec.row_dist import row_dist
    from specdec.sampling import probs_from_logits

    made: list[int] = []

    def counted(logits, params, one_hot, summed):
        made.append(logits.dim())
        return row_dist(logits, params, one_hot, summed)

    monkeypatch.setattr(verify_mod, "row_dist", counted)
    params = SamplingParams(temperature=0.8, top_p=0.9)
    gen = torch.Generator().manual_seed(3)
    short = 0
    for trial in range(200):
        k = int(torch.randint(1, 6, (1,), generator=gen))
        logits = torch.randn(k + 1, 50, generator=gen) * 2
        tree = DraftTree.chain(0, torch.randint(0, 50, (k,), generator=gen).tolist())
        eager = torch.cat([probs_from_logits(logits[i : i + 1], params) for i in range(k + 1)])
        made.clear()
        lazy = verify(tree, logits, params, None, torch.Generator().manual_seed(trial))
        assert lazy == verify_sampling(tree, eager, None, torch.Generator().manual_seed(trial))
        assert made == [1] * len(lazy.path)  # the accepted nodes' rows, then the row the last token came from
        short += len(lazy.path) < k + 1
    assert short > 100  # most walks stopped before the last row
