"""Per-token logprobs of committed tokens, in vLLM's four ``logprobs_mode`` s.

Which values (an engine setting, as vLLM's ``LLM(logprobs_mode=...)`` / ``--logprobs-mode``):

- ``raw_logprobs`` (the default): log-softmax of the target's logits at the token's
  position, before penalties, logit_bias, the grammar mask, temperature and
  top-k/top-p/min-p. A token's logprob measures the model, not the sampler
  settings, so evaluation harnesses get the same numbers whatever they sample with.
- ``raw_logits``: those logits themselves.
- ``processed_logprobs``: the log of the distribution the token was chosen from:
  after every processor (``processors.py``) and, when sampling, temperature and
  top-k/top-p/min-p (dropped tokens at -inf). Greedy decoding applies no
  temperature, so it is the log-softmax of the processed logits.
- ``processed_logits``: the logits of that distribution (``sampling.sampling_logits``).

Prompt logprobs are always ``raw_logprobs``, as in vLLM: nothing is sampled there.

Under speculation a committed token at position t is scored by row t of the
verify pass that committed it. The target computes that row exactly as a plain
decoding pass would (``model/kernels.py``: bit-identical rows); the processors
give it the history plain decoding would have (the drafted path before it); and
every step below reads that row only. So the values equal plain decoding's bit
for bit in float32, in every mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.config import LogprobsMode, SamplingParams  # LogprobsMode lives in config: the CLI reads it without torch
from specdec.sampling import sampling_logits

# What a logprob of -inf (a token the processed distribution excludes) becomes in JSON, which has no
# infinities: vLLM's floor.
JSON_LOGPROB_FLOOR = -9999.0


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float  # in the engine's LogprobsMode: a logprob, or a logit in the *_logits modes
    rank: int  # 1 = the most likely token (vLLM's rank)
    top: tuple[tuple[int, float], ...] = ()  # the k most likely (token id, logprob), most likely first


def token_logprobs(logits: torch.Tensor, token_ids: Sequence[int], k: int) -> list[TokenLogprob]:
    """Raw logprobs: logits [T, V] (row t predicts token_ids[t]) -> one TokenLogprob per token, with the top k."""
    if not len(token_ids):
        return []
    return rank_tokens(torch.log_softmax(logits[: len(token_ids)].float(), dim=-1), token_ids, k)


def output_logprobs(raw: torch.Tensor, processed: torch.Tensor, token_ids: Sequence[int], params: SamplingParams,
                    mode: LogprobsMode) -> list[TokenLogprob]:
    """Committed output tokens in ``mode``: raw [T, V] target logits and the same rows after the
    processors (the logits the verifier read); row t predicts token_ids[t]."""
    if not len(token_ids):
        return []
    k = params.logprobs or 0
    if mode is LogprobsMode.RAW_LOGPROBS:
        return token_logprobs(raw, token_ids, k)
    if mode is LogprobsMode.RAW_LOGITS:
        return rank_tokens(raw[: len(token_ids)].float(), token_ids, k)
    values = sampling_logits(processed[: len(token_ids)], params)
    if mode is LogprobsMode.PROCESSED_LOGPROBS:
        values = torch.log_softmax(values, dim=-1)
    return rank_tokens(values, token_ids, k)


def rank_tokens(values: torch.Tensor, token_ids: Sequence[int], k: int) -> list[TokenLogprob]:
    """values [T, V] (logprobs or logits; row t scores token_ids[t]) -> each token's value, rank and top k."""
    ids = torch.tensor(list(token_ids), dtype=torch.long, device=values.device)
    chosen = values.gather(1, ids[:, None])  # [T, 1]
    ranks = ((values > chosen).sum(dim=-1) + 1).tolist()
    top_ids: list[list[int]] = [[] for _ in token_ids]
    top_values: list[list[float]] = [[] for _ in token_ids]
    if k > 0:
        top = torch.topk(values, k, dim=-1)
        top_ids, top_values = top.indices.tolist(), top.values.tolist()
    return [
        TokenLogprob(tok, value, rank, tuple(zip(ti, tv, strict=True)))
        for tok, value, rank, ti, tv in zip(list(token_ids), chosen[:, 0].tolist(), ranks, top_ids, top_values,
                                            strict=True)
    ]


def json_logprob(value: float) -> float:
    """A logprob as JSON can hold it: -inf becomes JSON_LOGPROB_FLOOR."""
    return max(value, JSON_LOGPROB_FLOOR)
