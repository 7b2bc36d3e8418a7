"""Logits -> probabilities under SamplingParams, and seeded sampling.

The same ``probs_from_logits`` turns both target and draft logits into the p and
q of rejection sampling: applying temperature, top-k, top-p and min-p
identically to both is what keeps speculative sampling lossless.
"""

from __future__ import annotations

import torch

from specdec.config import SamplingParams


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[N, V] float logits -> [N, V] probabilities after temperature/top-k/top-p/min-p."""
    scaled, probs, drop = _filter(logits, params)
    if drop is not None:
        probs = probs.masked_fill(drop, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def sampling_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[N, V] float logits -> the logits ``probs_from_logits`` samples from: divided by the
    temperature, with the tokens top-k/top-p/min-p drop at -inf (vLLM's "processed" logits).

    Greedy parameters leave the logits as they are: argmax reads them unscaled.
    """
    if params.greedy:
        return logits.float()
    scaled, _, drop = _filter(logits, params)
    return scaled if drop is None else scaled.masked_fill(drop, float("-inf"))


def _filter(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(logits / temperature with top-k applied, their softmax, the tokens top-p and min-p drop or None)."""
    logits = logits.float() / max(params.temperature, 1e-5)
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    drop = None
    if params.top_p < 1.0:
        drop = _top_p_drop(probs, params.top_p)
    if params.min_p > 0.0:
        # The top token is never dropped by top_p, so its probability is the same either way.
        top = probs.max(dim=-1, keepdim=True).values
        below = probs < params.min_p * top
        drop = below if drop is None else drop | below
    return logits, probs, drop


def _top_p_drop(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """[N, V] bool, True where top-p drops a token: in descending order of probability, a token whose
    predecessors' mass already reaches top_p (the top one stays).

    Only the head of that order decides, so a row sorts just the tokens above a threshold whose mass
    reaches top_p (a few hundred of 152K; the threshold falls 1000-fold until it does) instead of its
    whole vocabulary (13 ms a row on a CPU, more than a 1.5B model's pass). Every token below the
    threshold comes after the head in the full order, so the prefix sums, and the kept set, are the
    full sort's (ties ordered as a stable sort orders them).
    """
    drop = torch.ones_like(probs, dtype=torch.bool)
    for row, p in enumerate(probs):
        theta = float(p.max()) * 1e-3
        while theta > 0 and float(p[p > theta].sum()) < top_p:
            theta = theta * 1e-3 if theta > 1e-30 else 0.0  # then: every token of positive mass
        ids = torch.nonzero(p > theta).squeeze(-1) if theta > 0 else torch.arange(p.shape[0], device=p.device)
        head, order = torch.sort(p[ids], descending=True, stable=True)
        keep = torch.cumsum(head, dim=-1) - head < top_p
        drop[row, ids[order[keep]]] = False
    return drop


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """[N, V] probabilities (each row summing to any positive total) -> [N] sampled token ids.

    Inverse-CDF sampling: the first token whose running mass exceeds u * total, u uniform in
    [0, 1), so a token of zero mass is never drawn. The running sums are float64 (off by
    ~1e-16 of the total, not float32's ~1e-7 per add). ``torch.multinomial`` draws one
    exponential per vocabulary entry on a CPU: 1-3 ms a token for 49K-152K vocabularies,
    a tenth of a small model's decode step; this is one cumulative sum and one search.
    """
    cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64)
    u = torch.rand(probs.shape[0], 1, dtype=torch.float64, generator=generator, device=probs.device)
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=probs.shape[-1] - 1).squeeze(-1)
