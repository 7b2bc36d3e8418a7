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
