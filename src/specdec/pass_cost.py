"""What a target pass costs on this machine, by width: measured, never assumed.

A verify pass over T tokens costs c(T) seconds: on a 2-core AVX2 CPU c(16) is
~2.6 c(1), on an AMX CPU ~1.1 c(1), on a GPU ~1.0 c(1). The runner owns one
``PassCost`` (``ModelRunner.pass_cost``): the engine times every decode pass
into it, keyed by ``pass_width``, and the draft planner (``budget.py``) and the
adaptive drafter price drafts with it.
"""

from __future__ import annotations

from collections.abc import Sequence


class PassCost:
    """Running estimate of a target pass's seconds by width (shared by all sequences).

    Interference on a shared machine only adds time, so a slower pass moves the
    estimate a quarter as fast as a faster one. A width not timed for ``max_age``
    passes is forgotten: decisions taken on it (say, never drafting because one
    wide pass was slow) would otherwise never be re-measured; forgotten, the
    engine drafts in full once and times it again.
    """

    def __init__(self, smoothing: float = 0.2, max_age: int = 256) -> None:
        self.smoothing, self.max_age = smoothing, max_age
        self.seconds: dict[int, float] = {}
        self.timed_at: dict[int, int] = {}  # width -> the pass count when it was last timed
        self.passes = 0

    def observe(self, num_tokens: int, seconds: float) -> None:
        self.passes += 1
        for width in [w for w, at in self.timed_at.items() if self.passes - at >= self.max_age]:
            del self.seconds[width], self.timed_at[width]
        old = self.seconds.get(num_tokens)
        rate = self.smoothing if old is None or seconds < old else self.smoothing / 4
        self.seconds[num_tokens] = seconds if old is None else old + rate * (seconds - old)
        self.timed_at[num_tokens] = self.passes

    @property
    def measured(self) -> bool:
        """Whether every width can be priced: two widths are known."""
        return len(self.seconds) >= 2

    def estimate(self, num_tokens: int) -> float | None:
        """Interpolated cost; None until two widths were measured."""
        if num_tokens in self.seconds:
            return self.seconds[num_tokens]
        known = sorted(self.seconds)
        if len(known) < 2:
            return None
        lo = max((t for t in known if t < num_tokens), default=known[0])
        hi = min((t for t in known if t > num_tokens), default=known[-1])
        if lo == hi:
            lo, hi = known[-2], known[-1]
        slope = (self.seconds[hi] - self.seconds[lo]) / (hi - lo)
        return max(self.seconds[lo] + slope * (num_tokens - lo), 1e-9)



def pass_width(counts: Sequence[int], padded: bool) -> int:
    """Rows a pass computes for sequences of ``counts`` tokens each (``PassCost``'s key): a ragged
    pass runs the rows back to back (the sum), a padded one gives each the widest one's rows."""
    return len(counts) * max(counts) if padded else sum(counts)


def acceptance_floor(min_acceptance: float, cost: PassCost | None, draft_seconds: float = 0.0) -> float:
    """The per-token acceptance below which a monitor switches drafting off: ``min_acceptance``, or lower
    once the pass costs are measured, down to the acceptance at which a 1-token draft repays its row and
    its drafting, (c(2) + draft_seconds) / c(1) - 1, at least 0.05 (0 stays 0: nothing is ever switched off).

    Example: c(1) = 37 ms, c(2) = 39 ms: a look-up's free drafts pay above 0.054; a 0.5B draft's 10 ms a
    token above 0.32. At T=0.7 suffix keeps ~0.4 of its first tokens on chat text, and a fixed 0.4 floor
    held it off in most steps (Qwen2.5-Coder-1.5B on Zen 4)."""
    if min_acceptance == 0.0 or cost is None or not cost.measured:
        return min_acceptance
    return min(min_acceptance, max(0.05, (cost.estimate(2) + draft_seconds) / cost.estimate(1) - 1.0))
