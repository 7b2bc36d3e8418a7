"""The sampling filters against their definitions."""

from __future__ import annotations

import pytest
import torch

from specdec.sampling import _top_p_drop


def _sorted_top_p_drop(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p by its definition: sort the whole row, drop a token once its predecessors' mass reaches top_p."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    return torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before >= top_p)


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
    assert torch.equal(drop, _sorted_top_p_drop(probs, top_p))
    assert not drop.gather(-1, probs.argmax(-1, keepdim=True)).any()  # the top token always stays
    kept_mass = (probs * ~drop).sum(-1)
    assert (kept_mass >= min(top_p, 0.999) - 1e-6).all()
