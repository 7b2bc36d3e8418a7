"""The server's recent speculation in one-second buckets: the data behind ``/dashboard``.

Prometheus counters (``metrics.py``) answer "how much since start"; the dashboard
wants "what happened in each of the last minutes" without a Prometheus server, so
the scheduler thread also drops every step into a bucket of the second it ended
in, and ``GET /metrics/live`` returns the last ``window`` seconds as columns.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from specdec.stats import SpecStats

KEEP_SECONDS = 900  # buckets kept: the longest window the dashboard can ask for


@dataclass
class Bucket:
    """Everything the server did in one second (a sum over its steps and sequences)."""

    t: int  # the second, as a unix timestamp
    tokens: int = 0  # committed tokens
    passes: int = 0  # one per sequence per step: tau = tokens / passes
    drafted: int = 0
    accepted: int = 0
    steps: int = 0  # engine steps
    batch: int = 0  # sequences summed over steps: the mean batch is batch / steps
    waiting: int = 0  # the most requests seen waiting for a slot
    step_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    drafters: dict[str, list[int]] = field(default_factory=dict)  # name -> [drafted, accepted]


COLUMNS = [f.name for f in fields(Bucket) if f.name != "drafters"]


class LiveSeries:
    """Written by the scheduler thread, read by the event loop: every method takes the lock."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._buckets: deque[Bucket] = deque(maxlen=KEEP_SECONDS)
        self.total = SpecStats()  # since start: per-position acceptance
        self.by_drafter: dict[str, SpecStats] = {}

    def _bucket(self) -> Bucket:
        now = int(self.clock())
        if not self._buckets or self._buckets[-1].t != now:
            self._buckets.append(Bucket(now))
        return self._buckets[-1]

    def record_result(self, drafter: str | None, num_drafted: int, num_accepted: int, num_tokens: int) -> None:
        """One sequence's step."""
        with self._lock:
            b = self._bucket()
            b.tokens += num_tokens
            b.passes += 1
            if not drafter or not num_drafted:
                return
            b.drafted += num_drafted
            b.accepted += num_accepted
            counts = b.drafters.setdefault(drafter, [0, 0])
            counts[0] += num_drafted
            counts[1] += num_accepted
            self.total.record_draft(num_drafted, num_accepted)
            self.by_drafter.setdefault(drafter, SpecStats()).record_draft(num_drafted, num_accepted)

    def record_step(self, batch: int, seconds: float, draft_seconds: float, verify_seconds: float) -> None:
        with self._lock:
            b = self._bucket()
            b.steps += 1
            b.batch += batch
            b.step_seconds += seconds
            b.draft_seconds += draft_seconds
            b.verify_seconds += verify_seconds

    def record_waiting(self, waiting: int) -> None:
        with self._lock:
            b = self._bucket()
            b.waiting = max(b.waiting, waiting)

    def snapshot(self, window: int = 120) -> dict:
        """The last ``window`` seconds as columns (idle seconds as zeros), and the totals since start.

        {"t": [...], "tokens": [...], ..., "drafters": {name: [[drafted, accepted] per second]},
         "totals": {"drafted", "accepted", "drafted_per_pos", "accepted_per_pos", "by_drafter": {...}}}
        """
        with self._lock:
            now = int(self.clock())
            seen = {b.t: b for b in self._buckets if b.t > now - window}
            rows = [seen.get(t) or Bucket(t) for t in range(now - window + 1, now + 1)]
            names = sorted({n for b in rows for n in b.drafters})
            out: dict = {name: [getattr(b, name) for b in rows] for name in COLUMNS}
            for key in ("step_seconds", "draft_seconds", "verify_seconds"):
                out[key] = [round(v, 6) for v in out[key]]
            out["drafters"] = {n: [b.drafters.get(n, [0, 0]) for b in rows] for n in names}
            out["totals"] = {**_counts(self.total),
                             "by_drafter": {n: _counts(s) for n, s in sorted(self.by_drafter.items())}}
            return {"interval": 1, "window": window, **out}


def _counts(stats: SpecStats) -> dict:
    return {"drafts": stats.drafts, "drafted": stats.drafted, "accepted": stats.accepted,
            "acceptance_rate": round(stats.acceptance_rate, 4),
            "drafted_per_pos": list(stats.drafted_per_pos), "accepted_per_pos": list(stats.accepted_per_pos)}
