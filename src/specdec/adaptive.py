"""Dynamic draft length: draft only as many tokens as pay for their verification.

A verify pass over T tokens costs c(T) seconds (measured, not assumed: on a
2-core AVX2 CPU c(16) is ~2.6 c(1), on an AMX CPU ~1.1 c(1), on a GPU ~1.0
c(1)). If each drafted token is accepted with probability alpha (given the
previous ones were), drafting k tokens commits (1 - alpha^(k+1)) / (1 - alpha)
tokens per pass in expectation. The policy drafts the k that maximises
tokens per second, k = 0 meaning plain decoding: speculation switches itself
off where it loses (creative text, a weak drafter) and stretches where it wins
(copying code). A pause in drafting is probed again after a few steps so a
sequence that starts repeating itself is noticed.
"""

from __future__ import annotations

from dataclasses import dataclass


class PassCost:
    """Running estimate of a target pass's seconds by token count (shared by all sequences)."""

    def __init__(self, smoothing: float = 0.2) -> None:
        self.smoothing = smoothing
        self.seconds: dict[int, float] = {}

    def observe(self, num_tokens: int, seconds: float) -> None:
        old = self.seconds.get(num_tokens)
        self.seconds[num_tokens] = seconds if old is None else old + self.smoothing * (seconds - old)

    def estimate(self, num_tokens: int) -> float | None:
        """Interpolated cost; None until a 1-token pass and a wider one were measured."""
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


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens committed by a pass verifying k drafted tokens (the bonus/recovered one included)."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass
class DraftLengthPolicy:
    """Per-sequence acceptance estimate and the draft length it implies."""

    alpha: float = 0.6  # optimistic start: the first drafts are tried in full
    smoothing: float = 0.3
    probe_every: int = 8  # after this many plain steps, draft once more to re-measure alpha
    steps_since_draft: int = 0

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted == 0:
            self.steps_since_draft += 1
            return
        self.steps_since_draft = 0
        # Per-token acceptance rate implied by this draft: accepted / tokens tested.
        tested = min(num_accepted + 1, num_drafted)
        rate = num_accepted / tested
        self.alpha += self.smoothing * (rate - self.alpha)

    def choose(self, cost: PassCost, k_max: int, others: int = 0) -> int:
        """Draft length in 0..k_max maximising committed tokens per second of the step.

        ``others``: tokens the rest of the batch puts in the same pass (one per sequence
        that decodes plainly), so a big batch makes extra verify tokens dearer.
        """
        plain = cost.estimate(others + 1)
        if plain is None or cost.estimate(others + k_max + 1) is None:
            return k_max  # nothing measured yet: try the full draft
        best_k, best_rate = 0, (others + 1) / plain
        for k in range(1, k_max + 1):
            rate = (others + expected_tokens(self.alpha, k)) / cost.estimate(others + k + 1)
            if rate > best_rate:
                best_k, best_rate = k, rate
        if best_k == 0 and self.steps_since_draft >= self.probe_every:
            return k_max
        return best_k
