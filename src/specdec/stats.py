"""Speculation statistics: per request, and summed over many."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class SpecStats:
    new_tokens: int = 0
    prompt_tokens: int = 0
    target_forwards: int = 0  # target passes, prefill included
    decode_passes: int = 0  # target passes after prefill (plain decode or verify)
    decode_tokens: int = 0  # tokens those passes committed
    drafts: int = 0  # steps that verified a non-empty draft
    drafted: int = 0  # drafted tokens sent to the target
    accepted: int = 0  # drafted tokens kept
    accepted_per_pos: list[int] = field(default_factory=list)  # [i]: drafts whose token i was kept
    drafted_per_pos: list[int] = field(default_factory=list)  # [i]: drafts that reached position i
    draft_seconds: float = 0.0
    target_seconds: float = 0.0  # target passes (prefill included)
    prefill_seconds: float = 0.0
    seconds: float = 0.0  # wall time of generation (loading excluded)

    def record_draft(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted == 0:
            return
        self.drafts += 1
        self.drafted += num_drafted
        self.accepted += num_accepted
        for counts, n in ((self.drafted_per_pos, num_drafted), (self.accepted_per_pos, num_accepted)):
            counts.extend([0] * (n - len(counts)))
            for i in range(n):
                counts[i] += 1

    @property
    def acceptance_rate(self) -> float:
        """alpha: the share of drafted tokens that were kept."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_len(self) -> float:
        """tau: tokens committed per decoding target pass (accepted + the recovered/bonus token)."""
        return self.decode_tokens / self.decode_passes if self.decode_passes else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def merge(self, other: SpecStats) -> None:
        for name in (
            "new_tokens", "prompt_tokens", "target_forwards", "decode_passes", "decode_tokens",
            "drafts", "drafted", "accepted",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("draft_seconds", "target_seconds", "prefill_seconds", "seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("accepted_per_pos", "drafted_per_pos"):
            mine, theirs = getattr(self, name), getattr(other, name)
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, v in enumerate(theirs):
                mine[i] += v

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(
            acceptance_rate=round(self.acceptance_rate, 4),
            mean_accepted_len=round(self.mean_accepted_len, 4),
            tokens_per_s=round(self.tokens_per_s, 3),
        )
        for key in ("draft_seconds", "target_seconds", "prefill_seconds", "seconds"):
            out[key] = round(out[key], 5)
        return out
