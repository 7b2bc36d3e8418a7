"""Speculation statistics: per request, and summed over many."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace

from specdec.monitor import SpecMonitor, WindowSums


@dataclass
class SpecStats:
    new_tokens: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of them, found cached by an earlier request (``ModelRunner.allocate``)
    target_forwards: int = 0  # target passes, prefill included
    decode_passes: int = 0  # target passes after prefill (plain decode or verify)
    decode_tokens: int = 0  # tokens those passes committed
    drafts: int = 0  # steps that verified a non-empty draft
    drafted: int = 0  # drafted tokens sent to the target
    accepted: int = 0  # drafted tokens kept
    accepted_per_pos: list[int] = field(default_factory=list)  # [i]: drafts whose token i was kept
    drafted_per_pos: list[int] = field(default_factory=list)  # [i]: drafts that reached position i
    draft_asks: int = 0  # steps that asked the drafter for a draft
    draft_seconds: float = 0.0
    target_seconds: float = 0.0  # target passes (prefill included)
    prefill_seconds: float = 0.0
    seconds: float = 0.0  # wall time of generation (loading excluded)
    # Per drafter (a chain's or the adaptive drafter's member): tokens it drafted, and accepted
    # tokens it proposed. A token of a merged tree is counted for the drafter that owns its node.
    drafted_by: dict[str, int] = field(default_factory=dict)
    accepted_by: dict[str, int] = field(default_factory=dict)
    # Monitoring (monitor.py): decode steps held off, switches off, re-probes; and the latest
    # sliding windows, of the sequence and of each member drafter, pooled over sequences.
    spec_off_steps: int = 0
    spec_switch_offs: int = 0
    spec_probes: int = 0
    window: WindowSums = field(default_factory=WindowSums)
    drafter_windows: dict[str, WindowSums] = field(default_factory=dict)

    def record_draft(self, num_drafted: int, num_accepted: int, drafted_by: Iterable[tuple[str, int]] = (),
                     origins: Iterable[str] = ()) -> None:
        """One verified draft; ``drafted_by`` (drafter, tokens) and ``origins`` (one per accepted token)."""
        if num_drafted == 0:
            return
        self.drafts += 1
        self.drafted += num_drafted
        self.accepted += num_accepted
        for name, n in drafted_by:
            self.drafted_by[name] = self.drafted_by.get(name, 0) + n
        for name in origins:
            self.accepted_by[name] = self.accepted_by.get(name, 0) + 1
        for counts, n in ((self.drafted_per_pos, num_drafted), (self.accepted_per_pos, num_accepted)):
            counts.extend([0] * (n - len(counts)))
            for i in range(n):
                counts[i] += 1

    def snapshot_windows(self, monitor: SpecMonitor, drafter_windows: Mapping[str, WindowSums]) -> None:
        """Keep the sequence's monitor state as it ends (copies: the monitor goes on changing)."""
        self.window = replace(monitor.sums)
        self.drafter_windows = {name: replace(w) for name, w in drafter_windows.items()}
        self.spec_switch_offs, self.spec_probes = monitor.num_switch_offs, monitor.num_probes

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted: the share of drafted tokens that were kept (vLLM's "draft acceptance
        rate"). Not alpha, which is accepted / tested (``monitor.py``): this one falls as drafts
        get longer, since tokens after the first rejected one count as drafted but never tested."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_len(self) -> float:
        """tau: tokens committed per decoding target pass (accepted + the recovered/bonus token)."""
        return self.decode_tokens / self.decode_passes if self.decode_passes else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def merge(self, other: SpecStats) -> None:
        """Add ``other`` in, field by field: every field of the dataclass, so none can be left out.

        Numbers add; per-position lists add element-wise (the longer one's length); per-drafter
        dicts add by key; ``WindowSums`` pool (``add``), dicts of them by key.
        """
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, (int, float)):
                setattr(self, f.name, mine + theirs)
            elif isinstance(mine, list):
                mine.extend([0] * (len(theirs) - len(mine)))
                for i, v in enumerate(theirs):
                    mine[i] += v
            elif isinstance(mine, WindowSums):
                mine.add(theirs)
            elif isinstance(mine, dict):
                for key, v in theirs.items():
                    if isinstance(v, WindowSums):
                        mine.setdefault(key, WindowSums()).add(v)
                    else:
                        mine[key] = mine.get(key, 0) + v
            else:
                raise TypeError(f"SpecStats.merge: no rule for field {f.name} ({type(mine).__name__})")

    @classmethod
    def of_batch(cls, per_sequence: Iterable[SpecStats], seconds: float, target_seconds: float) -> SpecStats:
        """A static batch's counters: its sequences' summed, with the batch's wall time and pass seconds
        (each sequence's own stats count a batched pass in full: the batch counts it once) and one prefill."""
        batch, prefills = cls(), [0.0]
        for stats in per_sequence:
            batch.merge(stats)
            prefills.append(stats.prefill_seconds)
        batch.seconds, batch.target_seconds, batch.prefill_seconds = seconds, target_seconds, max(prefills)
        return batch

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(
            acceptance_rate=round(self.acceptance_rate, 4),
            mean_accepted_len=round(self.mean_accepted_len, 4),
            tokens_per_s=round(self.tokens_per_s, 3),
        )
        for key in ("draft_seconds", "target_seconds", "prefill_seconds", "seconds"):
            out[key] = round(out[key], 5)
        out["window"] = self.window.to_dict()
        out["drafter_windows"] = {name: w.to_dict() for name, w in self.drafter_windows.items()}
        return out
