"""Prompt-lookup drafting: copy what followed the last n-gram the previous time it appeared.

This is llama.cpp's ``ngram-simple``: take the last n tokens of the context, find
the most recent earlier place where the same n tokens occur, and propose the
tokens that followed them there. It costs nothing but a scan and pays off when the
output repeats its input (code edits, summaries, quoting, reasoning recaps).

Unlike llama.cpp, which tries one fixed n, we try n = max_n first and fall back to
shorter n-grams down to ``min_n`` (as vLLM's ngram proposer does), so a short
repeat still drafts when no 12-token repeat exists.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specdec.config import SpecConfig
from specdec.drafters.base import EMPTY, DraftProposal, IndexingDrafter


def find_ngram_continuation(
    tokens: np.ndarray, max_n: int, min_n: int, max_tokens: int, min_hits: int = 1
) -> list[int]:
    """Tokens that followed the most recent earlier occurrence of the context's last n-gram.

    tokens: [L] int array, the whole context; tokens[-1] is the newest token.
    Tries n = max_n, max_n - 1, ..., min_n and uses the first (longest) n whose
    n-gram ``tokens[-n:]`` occurs at least ``min_hits`` times ending before L - 1,
    i.e. with at least one token after it. Returns up to ``max_tokens`` tokens
    following the most recent such occurrence ([] when no n qualifies). The copied
    tokens may run into the suffix itself, which is how periodic text extends.

    Example::

        tokens = [1 2 3 4 1 2 3 5 1 2 3],  max_n=3, min_n=1, max_tokens=4
        last 3-gram [1 2 3] ends earlier at positions 2 and 6; the most recent is 6
        -> tokens[7:11] = [5, 1, 2, 3]
        with min_hits=3 no n-gram qualifies ([1 2 3], [2 3], [3] each occur twice) -> []

    Cost: one vectorised comparison over the context, then a small gather over the
    positions that hold the newest two tokens.
    """
    num = len(tokens)
    if num < 2 or max_tokens < 1 or max_n < 1:
        return []
    # Candidate occurrence ends: earlier positions holding the newest token.
    ends = np.flatnonzero(tokens[:-1] == tokens[-1])
    if len(ends) == 0 or len(ends) < min_hits:
        return []
    match_len = _match_lengths(tokens, ends, max_n)
    for n in range(int(match_len.max()), max(min_n, 1) - 1, -1):
        hits = ends[match_len >= n]
        if len(hits) >= min_hits:
            start = int(hits[-1]) + 1  # ends are ascending: the last hit is the most recent
            return tokens[start : start + max_tokens].tolist()
    return []


def _match_lengths(tokens: np.ndarray, ends: np.ndarray, max_n: int) -> np.ndarray:
    """How many tokens (capped at max_n) ending at each of ``ends`` match the context's tail.

    ends already hold tokens[-1], so every length is at least 1. A cheap pass on
    the second-to-last token drops most candidates; the rest get one gather whose
    column k compares tokens[end - k] with tokens[-1 - k], and a match length is
    the index of the first mismatch.
    """
    num = len(tokens)
    n = min(max_n, num - 1)
    lengths = np.ones(len(ends), dtype=np.intp)
    if n < 2:
        return lengths
    two = np.flatnonzero((ends >= 1) & (tokens[ends - 1] == tokens[-2]))
    back = np.arange(2, n)
    idx = ends[two, None] - back  # [E2, n - 2] positions walking back from each end
    same = np.zeros((len(two), n - 1), dtype=bool)  # the last column stays False: a sentinel
    same[:, : n - 2] = (tokens[np.maximum(idx, 0)] == tokens[num - 1 - back]) & (idx >= 0)
    lengths[two] = 2 + same.argmin(axis=1)
    return lengths


class NgramDrafter(IndexingDrafter):
    """``ngram`` (llama.cpp ``ngram-simple``): longest recent n-gram match in the context.

    max_n:      longest n-gram matched (--spec-ngram-size-n, default 12).
    min_n:      shortest n-gram tried when longer ones have no earlier match.
                Default 2: a single token (",", "the", a space) recurs everywhere,
                so a 1-gram match is mostly noise that costs verify width and, in
                a chain, hides a better fallback drafter behind a bad draft.
    max_tokens: most tokens proposed per step (--spec-ngram-size-m, default 48);
                the engine's per-step ``max_tokens`` caps it further.
    min_hits:   the matched n-gram must occur at least this often earlier
                (--spec-ngram-min-hits, default 1).
    """

    name = "ngram"

    def __init__(self, max_n: int = 12, min_n: int = 2, max_tokens: int = 48, min_hits: int = 1) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        if max_tokens < 1 or min_hits < 1:
            raise ValueError("max_tokens and min_hits must be >= 1")
        super().__init__()
        self.max_n = max_n
        self.min_n = min_n
        self.max_tokens = max_tokens
        self.min_hits = min_hits

    @classmethod
    def from_config(cls, spec: SpecConfig) -> NgramDrafter:
        return cls(
            max_n=spec.ngram_size_n,
            min_n=min(2, spec.ngram_size_n),
            max_tokens=spec.ngram_size_m,
            min_hits=spec.ngram_min_hits,
        )

    def propose(self, context: Sequence[int], max_tokens: int) -> DraftProposal:
        self._sync(context)
        draft = find_ngram_continuation(
            self.seen.tokens,
            max_n=self.max_n,
            min_n=self.min_n,
            max_tokens=min(max_tokens, self.max_tokens),
            min_hits=self.min_hits,
        )
        return DraftProposal(draft) if draft else EMPTY
