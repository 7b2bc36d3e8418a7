"""Monitoring speculation and switching it off where it does not pay.

Practitioners watch the acceptance rate and turn speculation off below ~40%, or
when it measures slower than plain decoding. ``SpecMonitor`` does that for one
sequence (and, inside the adaptive drafter, for one member drafter) over a
sliding window of recent drafting steps:

- alpha: the chance a drafted token is kept given the ones before it were
  (kept / tokens the verifier tested: a draft of 5 with 2 kept tested 3 tokens).
  Unlike kept / drafted it does not fall when drafts get longer.
- tau: tokens committed per drafting pass (the kept ones plus the target's own).
- speedup: committed tokens, each priced at what plain decoding spends on one,
  over the seconds the drafting steps took (known once a plain pass was timed).

Speculation goes off when alpha < ``min_acceptance`` or speedup < 1 (never with min_acceptance 0), and is
probed again after ``backoff`` steps (its owners lower ``min_acceptance`` to what a drafted token costs once
pass costs are measured: ``pass_cost.acceptance_floor``); each failed probe doubles the back-off, so
prose costs little while a repetitive stretch that starts later is still caught.

Example (min_samples 3, base back-off 4): three drafts with nothing kept switch
it off; 4 plain steps later it probes; a probe that fails again waits 8, then 16.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, fields


@dataclass
class WindowSums:
    """Sums over a window of drafting steps; sums of several sequences' windows pool them."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    tested: int = 0  # drafted tokens whose fate the verifier decided (accepted + the first rejected one)
    committed: int = 0  # accepted + the recovered or bonus token
    timed_steps: int = 0  # steps below that carry timings (a plain pass's cost was known)
    seconds: float = 0.0  # drafting and this sequence's share of the target pass
    plain_seconds: float = 0.0  # the same tokens at plain decoding's cost per token

    def add(self, other: WindowSums, sign: int = 1) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + sign * getattr(other, f.name))

    def alpha(self, prior: float | None = None, weight: float = 2.0) -> float | None:
        """Kept / tested; with a prior, shrunk towards it as if ``weight`` tokens had been tested."""
        if prior is not None:
            return (self.accepted + prior * weight) / (self.tested + weight)
        return self.accepted / self.tested if self.tested else None

    @property
    def tau(self) -> float | None:
        return self.committed / self.steps if self.steps else None

    @property
    def speedup(self) -> float | None:
        return self.plain_seconds / self.seconds if self.timed_steps and self.seconds > 0 else None

    def to_dict(self) -> dict:
        alpha, tau, speedup = self.alpha(), self.tau, self.speedup
        return dict(steps=self.steps, drafted=self.drafted, accepted=self.accepted,
                    alpha=None if alpha is None else round(alpha, 4), tau=None if tau is None else round(tau, 4),
                    speedup=None if speedup is None else round(speedup, 4))


class SlidingSums:
    """The sums of the last ``size`` samples, kept as they come and go (a monitor's window of drafts; the
    adaptive drafter's ``Ledger`` of each member's timed drafts)."""

    def __init__(self, size: int) -> None:
        self._samples: deque[WindowSums] = deque(maxlen=size)
        self.sums = WindowSums()

    def __len__(self) -> int:
        return len(self._samples)

    def append(self, sample: WindowSums) -> None:
        if len(self._samples) == self._samples.maxlen:
            self.drop_oldest()
        self._samples.append(sample)
        self.sums.add(sample)

    def drop_oldest(self) -> None:
        if self._samples:
            self.sums.add(self._samples.popleft(), -1)

    def clear(self) -> None:
        self._samples.clear()
        self.sums = WindowSums()


def draft_sample(num_drafted: int, num_accepted: int, tested: int, seconds: float | None = None,
                 plain_seconds_per_token: float | None = None) -> WindowSums:
    """One verified draft as window sums. ``tested``: accepted, plus 1 when a drafted token after
    them was rejected (none is when the whole path was kept). Timings count when both are known."""
    timed = seconds is not None and plain_seconds_per_token is not None
    return WindowSums(1, num_drafted, num_accepted, tested, num_accepted + 1, int(timed),
                      seconds if timed else 0.0, (num_accepted + 1) * plain_seconds_per_token if timed else 0.0)


class Mode(str, enum.Enum):
    ON = "on"  # drafting allowed, judged on the window
    OFF = "off"  # held off: plain decoding until the back-off ends
    PROBE = "probe"  # drafting again to re-measure; judged after min_samples drafts (one with nothing kept fails)


class SpecMonitor:
    """Sliding-window alpha / tau / speedup of one sequence (or drafter) and its on/off switch."""

    def __init__(self, min_acceptance: float = 0.4, window: int = 16, min_samples: int = 3,
                 base_backoff: int = 4, max_backoff: int = 512, prior: float = 0.6,
                 probe_alpha: float = 0.9, probe_tokens: int = 2, switching: bool = True) -> None:
        if not 0.0 <= min_acceptance <= 1.0:
            raise ValueError(f"the minimum acceptance must be in [0, 1], got {min_acceptance}")
        self.min_acceptance, self.min_samples, self.prior = min_acceptance, min_samples, prior
        # A probe asks "has the text turned repetitive?": it is planned as if it had, so the cost
        # model lets it draft wherever such text would pay (not in a batch where nothing would).
        self.probe_alpha = probe_alpha
        # ...and it drafts at most ``probe_tokens``: whether its first token or two are kept answers
        # that question; a full draft made every failed probe cost a wide pass (at T=1, where
        # nothing is kept, probes were most of what adaptive lost against plain decoding).
        self.probe_tokens = probe_tokens
        self.base_backoff, self.max_backoff = base_backoff, max_backoff
        # False: the window is kept (stats, alpha) but the mode stays ON: the engine's monitor of a drafter
        # that switches its own members (``Drafter.switches_itself``)
        self.switching = switching
        self._window = SlidingSums(window)
        self.mode = Mode.ON
        self.backoff = base_backoff
        self.idle = 0  # steps without a draft since the last one (OFF: since switching off)
        self.hold = base_backoff  # OFF: the steps it waits before probing (its back-off, or a skipped probe's wait)
        self.num_switch_offs = 0
        self.num_probes = 0
        self.first_draft_decides = False  # see ``judge_first_draft``

    def judge_first_draft(self) -> None:
        """Judge the next draft as a probe is judged: nothing kept switches speculation off at once
        (the draft keeps its full length). For a sampled request's model members in ``AdaptiveDrafter``
        (its look-up members start as probes instead): at temperature 1 the three drafts a fresh
        monitor waited for were a third of what adaptive lost."""
        self.first_draft_decides = True

    def skip_probe(self, wait: int) -> None:
        """A probe that found nothing to draft: it did not fail (its back-off stays), so it probes again after
        ``wait`` steps without one, and at the next step with 0 (``AdaptiveDrafter._probe_wait``: as often as
        its dry runs are cheap beside the passes). Off for its back-off, growing to 4x on each empty find,
        suffix in adaptive drafted a third of what it drafts alone at T=0.7 on MT-bench (Qwen2.5-Coder-1.5B):
        on chat it finds nothing at many steps, and one empty find held it off for the next 4-16."""
        if self.mode is Mode.PROBE and wait > 0:
            self.mode, self.idle, self.hold = Mode.OFF, 0, wait + 1

    @property
    def allows_draft(self) -> bool:
        return self.mode is not Mode.OFF

    def draft_cap(self, cap: int) -> int:
        """The most tokens to draft now: ``cap``, or ``probe_tokens`` while probing."""
        return min(cap, self.probe_tokens) if self.mode is Mode.PROBE else cap

    @property
    def sums(self) -> WindowSums:
        """The window's sums."""
        return self._window.sums

    @property
    def alpha(self) -> float:
        """The window's alpha shrunk towards the prior; ``probe_alpha`` while probing (a fresh look)."""
        return self.probe_alpha if self.mode is Mode.PROBE else self.sums.alpha(self.prior)

    def observe(self, sample: WindowSums | None, held: bool = True, dry: bool = False) -> None:
        """After a step: its drafting sample, or None when nothing was drafted.

        held: the step had no draft budget (this monitor or the cost model held it), as opposed
        to a drafter that had nothing to propose, which says nothing about speculation.
        dry: the sample is a dry run's (``AdaptiveDrafter``'s look-up probes: scored, never verified). It
        cost no pass, so a probe of dry runs is judged on ``min_samples`` of them like a window, not
        ended by its first miss (at T=0.7 half of suffix's 2-token probes missed on chat text).
        """
        if not self.switching:
            if sample is not None:
                self._window.append(sample)
            return
        if sample is None:
            if held or self.mode is Mode.OFF:
                self.idle += 1
            # Off: probe once the back-off has passed. On but never given a budget (the cost model
            # said no at this alpha): re-measure alpha as often, or a stale low alpha sticks.
            if self.idle >= (self.hold if self.mode is Mode.OFF else self.backoff) and self.mode is not Mode.PROBE:
                self.start_probe()
            return
        self.idle = 0
        self._window.append(sample)
        first, self.first_draft_decides = self.first_draft_decides, False
        if (self.mode is Mode.PROBE or first) and not dry and sample.tested and not sample.accepted \
                and self.min_acceptance > 0:
            # A probe's draft with nothing kept answers "has the text turned repetitive?" at once:
            # judging it on min_samples drafts made probes at T=1 cost three full drafts each.
            self._switch_off()
        elif len(self._window) >= self.min_samples:
            self._judge()

    def _judge(self) -> None:
        alpha = self.sums.alpha()
        speedup = self.sums.speedup if self.sums.timed_steps >= self.min_samples else None
        # min_acceptance 0 switches nothing off: no judgment by wall-clock speed either (what tests need)
        failing = self.min_acceptance > 0 and (
            (alpha is not None and alpha < self.min_acceptance) or (speedup is not None and speedup < 1.0))
        if failing:
            self._switch_off()
        elif self.mode is Mode.PROBE:
            self.mode, self.backoff = Mode.ON, self.base_backoff

    def _switch_off(self) -> None:
        if self.mode is Mode.PROBE:  # a failed probe: wait twice as long next time
            self.backoff = min(2 * self.backoff, self.max_backoff)
        self.mode, self.hold = Mode.OFF, self.backoff
        self.num_switch_offs += 1
        self._clear()

    def start_off(self, backoff: int) -> None:
        """Start held off, probing after ``backoff`` steps (``AdaptiveDrafter``: a member that did not
        pay in earlier requests)."""
        self.mode, self.idle, self.backoff = Mode.OFF, 0, max(1, min(backoff, self.max_backoff))
        self.hold = self.backoff

    def start_probe(self) -> None:
        """Probe now: after a back-off, or at once (a sampled request's look-up member in ``AdaptiveDrafter``)."""
        self.mode, self.idle = Mode.PROBE, 0
        self.num_probes += 1
        self._clear()  # judge the probe on its own drafts, not on the ones that switched it off

    def _clear(self) -> None:
        self._window.clear()
