"""The sampling filters against their definitions."""

from __future__ import annotations

import pytest
import torch

from specdec.sampling import _top_p_drop, top_p_drop_by_sort


@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.95, 0.999999])
def test_top_p_keeps_the_full_sorts_tokens(top_p):
    """Peaked, flat and heavy-tailed rows, exact zeros (top-k's drops) and ties at the cut: the
    threshold-and-sort-the-head filter keeps exactly the tokens a sort of the whole row keeps, also
    where top_p is so close to 1 that no threshold's head reaches it."""
    gen = torch.Generator().manual_seed(0)
    vocab = 5000
    rows = [
        torch.randn(vocab, generator=gen) * 8,  # peaked: a handful of tokens carry the mass
        torch.randn(vocab, generator=gen) * 0.1,  # nearly flat: the cut lies deep in the vocabulary
        -torch.log(torch.rand(vocab, generator=gen)) * 3,  # heavy tail
        torch.where(torch.arange(vocab) < 40, torch.randn(vocab, generator=gen), torch.tensor(float("-inf"))),
        torch.cat([torch.full((10,), 2.0), torch.zeros(vocab - 10)]),  # ties across the cut
    ]
    probs = torch.softmax(torch.stack(rows), dim=-1)
    drop = _top_p_drop(probs, top_p)
    assert torch.equal(drop, top_p_drop_by_sort(probs, top_p))
    assert not drop.gather(-1, probs.argmax(-1, keepdim=True)).any()  # the top token always stays
    kept_mass = (probs * ~drop).sum(-1)
    assert (kept_mass >= min(top_p, 0.999) - 1e-6).all()


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.95])
def test_top_p_on_a_full_vocabulary_and_a_head_at_the_margin(top_p):
    """A 152K vocabulary with a peaked head (a model's row), and a row whose head holds top_p to within
    float32's rounding (8 equal tokens of mass top_p / 8 plus a flat tail: the threshold falls into the
    tail). A cut compared with <= instead of < fails here; an unstable sort fails the ties above."""
    gen = torch.Generator().manual_seed(1)
    vocab = 151936
    peaked = torch.randn(vocab, generator=gen) * 3
    peaked[:100] += 12
    head = torch.full((vocab,), (1 - top_p) / (vocab - 8), dtype=torch.float64)
    head[:8] = top_p / 8
    probs = torch.stack([torch.softmax(peaked, dim=-1), head.float()])
    assert torch.equal(_top_p_drop(probs, top_p), top_p_drop_by_sort(probs, top_p))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_cpu_draw_is_the_cumulative_sums_token(dtype):
    # inverse_cdf_rows must pick what searchsorted over torch's float64 cumsum picks, bit for bit: rows
    # of a 152K vocabulary (peaked, flat, with zero-mass runs, unnormalised), u across [0, 1) and its edges.
    from specdec.inverse_cdf import inverse_cdf_rows
    from specdec.sampling import sample_by_cdf

    gen = torch.Generator().manual_seed(0)
    vocab = 151_936
    rows = [torch.softmax(torch.randn(vocab, generator=gen) * 4, -1),  # peaked
            torch.full((vocab,), 1.0 / vocab),  # flat
            torch.rand(vocab, generator=gen) * 3.0]  # unnormalised
    zeros = torch.softmax(torch.randn(vocab, generator=gen), -1)
    zeros[::3] = 0.0
    zeros[-1000:] = 0.0
    rows.append(zeros)
    probs = torch.stack(rows).to(dtype)
    us = [0.0, 1e-12, 0.5, 1.0 - 1e-16, *torch.rand(60, dtype=torch.float64, generator=gen).tolist()]
    for value in us:
        u = torch.full((len(rows), 1), value, dtype=torch.float64)
        out = torch.empty(len(rows), dtype=torch.long)
        inverse_cdf_rows(probs.numpy(), u[:, 0].numpy(), out.numpy())
        assert out.tolist() == sample_by_cdf(probs, u).tolist(), value
    assert all(zeros[t] > 0 for t in out.tolist()[3:])
