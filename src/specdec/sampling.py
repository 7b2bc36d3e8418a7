"""Logits -> probabilities under SamplingParams, and seeded sampling.

The same ``probs_from_logits`` turns both target and draft logits into the p and
q of rejection sampling: applying temperature, top-k, top-p and min-p
identically to both is what keeps speculative sampling lossless.
"""

from __future__ import annotations

import torch

from specdec.config import SamplingParams

MIN_TEMPERATURE = 1e-5  # a sampled row's temperature at least this (row_dist.inverse_temperature too)


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[N, V] float logits -> [N, V] probabilities after temperature/top-k/top-p/min-p."""
    scaled, probs, drop = _filter(logits, params)
    if drop is not None:
        probs = torch.where(drop, 0.0, probs)  # (masked_fill: 1.7x slower on a CPU)
    return probs / probs.sum(dim=-1, keepdim=True)


def sampling_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[N, V] float logits -> the logits ``probs_from_logits`` samples from: divided by the
    temperature, with the tokens top-k/top-p/min-p drop at -inf (vLLM's "processed" logits).

    Greedy parameters leave the logits as they are: argmax reads them unscaled.
    """
    if params.greedy:
        return logits.float()
    scaled, _, drop = _filter(logits, params)
    return scaled if drop is None else torch.where(drop, float("-inf"), scaled)


def _filter(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(logits / temperature with top-k applied, their softmax, the tokens top-p and min-p drop or None)."""
    logits = logits.float() / max(params.temperature, MIN_TEMPERATURE)
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = torch.where(logits < kth, float("-inf"), logits)
    probs = torch.softmax(logits, dim=-1)
    drop = None
    if params.top_p < 1.0:
        drop = _top_p_drop(probs, params.top_p)
    if params.min_p > 0.0:
        # The top token is never dropped by top_p, so its probability is the same either way.
        top = probs.amax(dim=-1, keepdim=True)  # (max also finds the index: 20x slower on a CPU)
        below = probs < params.min_p * top
        drop = below if drop is None else drop | below
    return logits, probs, drop


def _top_p_drop(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """[N, V] bool, True where top-p drops a token: in descending order of probability (ties in id
    order), a token whose predecessors' mass already reaches top_p (the top one stays). On a CPU the
    same set from each row's head alone (``top_p.top_p_drop_rows``); elsewhere by its definition, a
    sort of the whole row (fast on a GPU)."""
    if probs.device.type == "cpu":
        from specdec.top_p import top_p_drop_rows  # (numba: loaded where a CPU samples with top-p)

        drop = torch.empty(probs.shape, dtype=torch.bool)
        top_p_drop_rows(probs.float().contiguous().numpy(), top_p, drop.numpy())
        return drop
    return top_p_drop_by_sort(probs, top_p)


def top_p_drop_by_sort(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """``_top_p_drop`` by its definition: sort each whole row (stable), drop a token once its
    predecessors' mass reaches top_p."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    return torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before >= top_p)


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
    a tenth of a small model's decode step; this is one cumulative sum and one search (on a CPU
    the same sums in ``inverse_cdf``, stopping at the token: 1.22 -> 0.29 ms a step on Qwen2.5-Coder-1.5B,
    ``scripts/step_work.py``).
    """
    u = torch.rand(probs.shape[0], 1, dtype=torch.float64, generator=generator, device=probs.device)
    if probs.device.type == "cpu" and probs.dtype in (torch.float32, torch.float64):
        from specdec.inverse_cdf import inverse_cdf_rows  # (numba: the same sums without a cdf tensor)

        out = torch.empty(probs.shape[0], dtype=torch.long)
        inverse_cdf_rows(probs.contiguous().numpy(), u[:, 0].numpy(), out.numpy())
        return out
    return sample_by_cdf(probs, u)


def sample_by_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``sample``'s draw given u [N, 1] by its definition: the cumulative sums as a tensor (fast on a GPU)."""
    cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64)
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=probs.shape[-1] - 1).squeeze(-1)
