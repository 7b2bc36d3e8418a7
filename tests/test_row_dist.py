"""A sampled row in 64-column blocks (``row_dist.BlockDist``) against torch's softmax of the whole row."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specdec.config import SamplingParams
from specdec.row_dist import BLOCK, BlockDist, TensorDist, row_dist
from specdec.sampling import probs_from_logits, sample_by_cdf


def logits_row(v: int, seed: int = 0) -> torch.Tensor:
    """Logits with a few large ones, -inf entries and a whole -inf block (when v allows)."""
    g = torch.Generator().manual_seed(seed)
    row = torch.randn(v, generator=g) * 3
    row[torch.randint(0, v, (5,), generator=g)] += 12.0
    row[torch.randint(0, v, (7,), generator=g)] = float("-inf")
    if v > 3 * BLOCK:
        row[BLOCK : 2 * BLOCK] = float("-inf")
    return row


FILTERS = [dict(temperature=0.7), dict(temperature=1.0), dict(temperature=0.2), dict(temperature=1.3, min_p=0.05),
           dict(temperature=0.7, min_p=0.3), dict(temperature=0.8, top_k=1), dict(temperature=0.8, top_k=3),
           dict(temperature=1.0, top_k=40), dict(temperature=0.7, top_p=0.9), dict(temperature=1.5, top_p=0.5),
           dict(temperature=1.0, top_p=0.999), dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)]


def definition(row: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``sampling.probs_from_logits``' filters by their definition, in float64."""
    logits = row.double() / params.temperature
    if params.top_k:
        kth = torch.topk(logits, min(params.top_k, len(logits))).values[-1]
        logits = torch.where(logits < kth, float("-inf"), logits)
    probs = torch.softmax(logits, dim=-1)
    keep = probs >= 0
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True, stable=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        keep[order[before >= params.top_p]] = False
    if params.min_p > 0.0:
        keep &= probs >= params.min_p * probs.max()
    probs = torch.where(keep, probs, 0.0)
    return probs / probs.sum()


@pytest.mark.parametrize("v", [5, 64, 70, 1000, 49_152])
@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_block_probabilities_are_torch_softmax(v, filters):
    row = logits_row(v)
    params = SamplingParams(**filters)
    dist = row_dist(row, params)
    assert isinstance(dist, BlockDist)
    ref = probs_from_logits(row.unsqueeze(0), params)[0].double()
    got = torch.tensor([dist.prob(x) for x in range(v)], dtype=torch.float64)
    # torch's float32 cumulative sums move top-p's cut by tokens of p ~1e-7 over 49K tokens: the support is held to
    # the definition in float64, the values to torch's
    exact = definition(row, params)
    assert (got[exact == 0] == 0).all() and (got[exact > 1e-30] > 0).all()  # (the terms stop at e^-87)
    torch.testing.assert_close(got, exact, rtol=2e-5, atol=1e-9)
    torch.testing.assert_close(got, ref, rtol=2e-5, atol=5e-7)
    assert (got[row == float("-inf")] == 0).all()


@pytest.mark.parametrize("filters", [dict(top_k=3), dict(top_k=2), dict(top_p=0.5), dict(top_p=0.6)])
def test_filters_cut_ties_as_torch_does(filters):
    """Equal logits at the cut, in one block: top-k keeps them all, top-p in id order."""
    row = torch.full((64,), -3.0)
    row[[9, 4, 30]] = 2.0  # three tied tokens, then one above them
    row[50] = 2.5
    params = SamplingParams(temperature=1.0, **filters)
    dist = row_dist(row, params)
    ref = probs_from_logits(row.unsqueeze(0), params)[0].double()
    got = torch.tensor([dist.prob(x) for x in range(64)], dtype=torch.float64)
    assert torch.equal(got > 0, ref > 0), (got, ref)
    torch.testing.assert_close(got, ref, rtol=2e-5, atol=1e-9)


def test_draws_follow_the_cumulative_sums():
    """A draw given u is the token ``sampling.sample``'s cumulative sums give (up to their float rounding)."""
    row = logits_row(1000, seed=1)
    params = SamplingParams(temperature=0.9)
    dist = row_dist(row, params)
    probs = probs_from_logits(row.unsqueeze(0), params)
    u = torch.rand(4000, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    expected = sample_by_cdf(probs.expand(4000, -1), u).tolist()
    got = [dist.pick(u[i, 0].item()) for i in range(4000)]
    agree = np.mean([a == b for a, b in zip(got, expected, strict=True)])
    assert agree > 0.998, agree


@pytest.mark.parametrize("removed", [[], [3], [3, 40, 41]])
def test_draws_without_rejected_tokens_have_the_residual_distribution(removed):
    """Drafts rejected at a node leave p with their tokens removed and renormalised; chi-square over 40,000 draws
    (a two-block vocabulary with a tail), and a draw never returns a removed token."""
    v = 70
    row = logits_row(v, seed=4) / 4
    params = SamplingParams(temperature=1.0)
    dist = row_dist(row, params)
    for x in removed:
        dist = dist.without(x, None)
    p = probs_from_logits(row.unsqueeze(0), params)[0].double()
    p[removed] = 0
    p /= p.sum()
    gen = torch.Generator().manual_seed(5)
    counts = np.bincount([dist.draw(gen) for _ in range(40_000)], minlength=v)
    assert counts[removed].sum() == 0 and counts[(p == 0).numpy()].sum() == 0
    keep = (p * 40_000 >= 5).numpy()
    expected = p.numpy()[keep] * 40_000
    observed = counts[keep]
    assert chisquare(observed, expected * observed.sum() / expected.sum()).pvalue > 1e-3


def test_a_sampled_drafts_rows_are_the_blocks_probabilities():
    """Against a sampled draft's q the residual reads every token's p: the row is a ``TensorDist`` of the blocks'
    probabilities (the distribution plain decoding samples from), with every filter; a float64 row is not the
    kernels': torch's softmax."""
    row = logits_row(1000)
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=50, min_p=0.01)
    blocks, dense = row_dist(row, params), row_dist(row, params, one_hot=False)
    assert isinstance(blocks, BlockDist) and isinstance(dense, TensorDist)
    each = torch.tensor([blocks.prob(x) for x in range(1000)], dtype=torch.float64)
    torch.testing.assert_close(dense.p.double(), each, rtol=1e-6, atol=1e-12)
    assert (dense.p > 0).sum() == sum(blocks.prob(x) > 0 for x in range(1000))
    q = torch.softmax(torch.randn(1000, generator=torch.Generator().manual_seed(1)), -1)
    residual = blocks.without(7, q)
    assert isinstance(residual, TensorDist) and abs(float(residual.p.sum()) - 1.0) < 1e-5
    assert isinstance(row_dist(row.double(), SamplingParams(temperature=0.7)), TensorDist)


@pytest.mark.parametrize("quantization", ["none", "q8_0"])
def test_a_sampled_verify_reads_the_blocks_its_runner_summed(tiny_model_factory, quantization, monkeypatch):
    """The engine asks the runner for each row's blocks at the sequence's temperature (look-up drafts: q one-hot) and
    the verifier reads those; summed by the verifier from the logits instead, the same seed gives the same tokens
    (the same bits), drafts verified and accepted either way."""
    from specdec.drafters.ngram import NgramDrafter
    from specdec.engine import Engine, SequenceState
    from specdec.runners.load import load_runner

    folder = tiny_model_factory("qwen2", logit_scale=4.0, bigram=True)
    runner = load_runner(str(folder), max_seq_len=256, num_slots=1, quantization=quantization)[0]
    engine = Engine(runner, draft_n_max=4, plan_drafts=False)
    probe = SequenceState([300], SamplingParams(max_new_tokens=8, ignore_eos=True))
    engine.run_batch([probe])
    chain = probe.output_ids
    prompt = [300, *chain, 300, *chain, 300, *chain[:2]]
    made: list[bool] = []
    init = BlockDist.__init__
    monkeypatch.setattr(BlockDist, "__init__", lambda self, *a: made.append(a[2] is not None) or init(self, *a))

    def sampled() -> SequenceState:
        seq = SequenceState(list(prompt), SamplingParams(max_new_tokens=48, temperature=0.5, seed=3, ignore_eos=True),
                            drafter=NgramDrafter())
        engine.run_batch([seq])
        assert seq.stats.drafted >= 8 and seq.stats.accepted >= 4, (seq.stats.drafted, seq.stats.accepted)
        return seq

    fused = sampled()
    assert made and all(made)
    made.clear()
    monkeypatch.setattr(type(runner.fused), "has_blocks", property(lambda self: False))
    alone = sampled()
    assert made and not any(made)
    assert fused.output_ids == alone.output_ids
