"""The reduced draft vocabulary: the target tokens that occur most in the training data.

A head that scores every one of a 49k vocabulary pays for a 49k-row LM head at
every drafted token; EAGLE-3 keeps the most frequent tokens only (d2t / t2d map
between the two id spaces). A token outside the draft vocabulary can never be
drafted, so the share of response tokens the draft vocabulary covers bounds
acceptance: ``coverage`` reports it.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def choose_vocab(counts: torch.Tensor, size: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The ``size`` most frequent ids (``always`` forced in, e.g. EOS), ascending: the d2t order.

    Example: counts [5, 0, 9, 1], size 2 -> tensor([0, 2]); with always=[3] -> tensor([2, 3]).
    """
    size = min(size, len(counts))
    forced = sorted({int(t) for t in always if 0 <= int(t) < len(counts)})
    order = torch.argsort(counts, descending=True, stable=True).tolist()
    chosen = list(forced)
    taken = set(forced)
    for t in order:
        if len(chosen) >= size:
            break
        if t not in taken:
            chosen.append(t)
            taken.add(t)
    return torch.tensor(sorted(chosen[:size]), dtype=torch.long)


def coverage(counts: torch.Tensor, vocab: torch.Tensor) -> float:
    """Share of the counted token occurrences whose token is in ``vocab``."""
    total = int(counts.sum())
    return float(counts[vocab].sum()) / total if total else 0.0
