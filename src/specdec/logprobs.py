"""Per-token logprobs of the target's raw distribution.

Which distribution: the target's raw logits at the token's position, before
penalties, logit_bias, the grammar mask, temperature and top-k/top-p/min-p. This is
vLLM's default (``logprobs_mode="raw_logprobs"``): a token's logprob measures the
model, not the sampler settings, so evaluation harnesses get the same numbers
whatever they sample with.

Under speculation a committed token at position t is scored by row t of the
verify pass that committed it; the target computes that row exactly as a plain
decoding pass would (``model/kernels.py``: bit-identical rows), and each row's
log-softmax reads that row only, so the logprobs equal plain decoding's bit for
bit in float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    rank: int  # 1 = the most likely token (vLLM's rank)
    top: tuple[tuple[int, float], ...] = ()  # the k most likely (token id, logprob), most likely first


def token_logprobs(logits: torch.Tensor, token_ids: Sequence[int], k: int) -> list[TokenLogprob]:
    """logits [T, V] (row t predicts token_ids[t]) -> one TokenLogprob per token, with the top k."""
    if not len(token_ids):
        return []
    logprobs = torch.log_softmax(logits[: len(token_ids)].float(), dim=-1)  # [T, V]
    ids = torch.tensor(list(token_ids), dtype=torch.long)
    chosen = logprobs.gather(1, ids[:, None])  # [T, 1]
    ranks = ((logprobs > chosen).sum(dim=-1) + 1).tolist()
    top_ids: list[list[int]] = [[] for _ in token_ids]
    top_lps: list[list[float]] = [[] for _ in token_ids]
    if k > 0:
        top = torch.topk(logprobs, k, dim=-1)
        top_ids, top_lps = top.indices.tolist(), top.values.tolist()
    return [
        TokenLogprob(tok, lp, rank, tuple(zip(ti, tl, strict=True)))
        for tok, lp, rank, ti, tl in zip(list(token_ids), chosen[:, 0].tolist(), ranks, top_ids, top_lps, strict=True)
    ]
