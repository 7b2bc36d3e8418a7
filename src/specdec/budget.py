"""Dynamic draft length: draft only as many tokens as pay for their verification.

If each drafted token is accepted with probability alpha (given the previous ones
were: accepted / tested, ``monitor.py``), drafting k tokens commits
(1 - alpha^(k+1)) / (1 - alpha) tokens per pass in expectation
(``expected_tokens``). A pass's seconds by width are measured (``pass_cost.py``),
so the engine drafts the k that maximises tokens per second, k = 0 meaning plain
decoding: speculation switches itself off where it loses (creative text, a weak
drafter) and stretches where it wins (copying code). ``monitor.SpecMonitor``
measures alpha per sequence and re-probes a pause.

For a batch (``plan_draft_lengths``): one target pass verifies every sequence's
draft. What it costs depends on how the runner lays the batch out: the CPU
kernels run the rows of all sequences back to back (ragged: width = sum of rows),
a padded pass gives every sequence the widest one's rows (width = batch x widest).
With ``PassCost`` the engine can price any split: it gives drafted tokens to the
sequences that accept most, as long as expected committed tokens per second of
the whole step grow, and drafts nothing once the batch is so wide that verifying
costs more than it saves. The user's hard limits (``DraftBudget``, the server's
--spec-batch-draft-tokens and --spec-disable-batch-size) cap that plan; they no
longer make it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specdec.pass_cost import PassCost, pass_width


@dataclass(frozen=True)
class DraftBudget:
    """The user's caps on drafting in a step of ``batch`` sequences (the cost model plans within them).

    draft_n_max: most tokens one sequence drafts (--spec-draft-n-max).
    step_tokens: most drafted tokens per step over the whole batch (--spec-batch-draft-tokens;
                 None = no cap): each sequence gets at most step_tokens // batch.
    max_batch:   no drafting at all when more sequences than this run
                 (--spec-disable-batch-size, vLLM's ``disable_by_batch_size``).

    Example (draft_n_max=8, step_tokens=8, max_batch=None)::

        batch  1  2  3  4  5..8  9+
        cap    8  4  2  2  1     0
    """

    draft_n_max: int = 8
    step_tokens: int | None = None
    max_batch: int | None = None

    def __post_init__(self) -> None:
        if self.draft_n_max < 0 or (self.step_tokens is not None and self.step_tokens < 0):
            raise ValueError("draft budgets must be >= 0")
        if self.max_batch is not None and self.max_batch < 0:
            raise ValueError("the speculation batch limit must be >= 0")

    def __call__(self, batch: int) -> int:
        if batch < 1 or (self.max_batch is not None and batch > self.max_batch):
            return 0
        if self.step_tokens is None:
            return self.draft_n_max
        return min(self.draft_n_max, self.step_tokens // batch)


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens committed by a pass verifying k drafted tokens (the bonus/recovered one included)."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass
class DraftCost:
    """What one sequence's drafting has cost per drafted token, a catch-up apart (the engine's plan
    prices a draft of k tokens at k times it). A catch-up (a draft model's first pass over the
    prompt) is paid once per request: priced into every step, it made a 0.5B draft's 1-token
    drafts look 10x their 12 ms (Qwen2.5-Coder-1.5B on MT-bench): the plan then held drafting
    off, and each probe paid a longer catch-up than the last."""

    seconds: float = 0.0  # drafting seconds, catch-ups excluded
    tokens: int = 0  # tokens those asks drafted

    def observe(self, seconds: float, tokens: int) -> None:
        self.seconds += seconds
        self.tokens += tokens

    @property
    def per_token(self) -> float:
        """Seconds per drafted token (an ask that drafted nothing still counts its seconds); 0 before any."""
        return self.seconds / self.tokens if self.tokens else 0.0


def plan_draft_lengths(
    alphas: Sequence[float | None], caps: Sequence[int], cost: PassCost, padded: bool,
    token_seconds: Sequence[float] | None = None,
) -> list[int]:
    """Draft length per sequence maximising the step's expected committed tokens per second.

    alphas: each sequence's per-token acceptance (None: it does not draft this step).
    caps:   most tokens each may draft. token_seconds: what drafting one token costs each (0 if
            unknown; ``DraftCost.per_token``): a draft model's pass, a look-up's few microseconds.

    Token j of sequence i is kept with probability alpha_i^j, so adding it gains that many
    tokens in expectation; gains fall along a sequence, so taking tokens best-gain-first
    gives each sequence a prefix. Every prefix of that order is priced with ``cost`` at the
    batch's width and the best one is kept (plain decoding, all zeros, included). Before the
    cost of wider passes is known, every sequence drafts its cap, which measures it; then, before plain
    decoding's is, a plain step measures that.

    Example: batch 2, alphas [0.9, 0.3], a flat cost up to width 4 then linear: the gains
    0.9, 0.81, 0.73 (first sequence) come before 0.3, so the plan is [2, 0] or [3, 0].
    """
    n = len(alphas)
    lengths = [0] * n
    drafting = [i for i in range(n) if alphas[i] is not None and caps[i] > 0]
    if not drafting:
        return lengths
    plain = cost.estimate(pass_width([1] * n, padded))
    widest = cost.estimate(pass_width([1 + (caps[i] if i in drafting else 0) for i in range(n)], padded))
    if widest is None:
        for i in drafting:
            lengths[i] = caps[i]
        return lengths
    if plain is None:
        # the wide pass is timed, plain decoding not yet: one plain step times it (a draft model
        # proposing its cap every step left plain unmeasured for a whole first request, and adaptive
        # asked it at full depth throughout: Qwen2.5-Coder 0.5B for the 1.5B on chat, 0.75x)
        return lengths
    seconds = list(token_seconds) if token_seconds is not None else [0.0] * n
    gains = sorted(((alphas[i] ** j, i) for i in drafting for j in range(1, caps[i] + 1)),
                   key=lambda g: -g[0])
    best, best_rate = list(lengths), n / plain
    tokens, extra, rows, widest_row = float(n), 0.0, n, 1
    for gain, i in gains:
        extra += seconds[i]
        lengths[i] += 1
        tokens += gain
        rows += 1
        widest_row = max(widest_row, lengths[i] + 1)
        pass_seconds = cost.estimate(n * widest_row if padded else rows)
        rate = tokens / (pass_seconds + extra)
        if rate > best_rate:
            best, best_rate = list(lengths), rate
    return best
