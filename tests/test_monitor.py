"""monitor.py: the sliding-window alpha / tau / speedup of a sequence and its on/off switch,
fed hand-made samples."""

from __future__ import annotations

import pytest

from specdec.monitor import Mode, SpecMonitor, WindowSums, draft_sample


def rejected(k: int = 4) -> WindowSums:
    return draft_sample(k, 0, 1)


def kept(k: int = 4) -> WindowSums:
    return draft_sample(k, k, k)


def test_monitor_switches_off_after_a_run_of_rejections():
    monitor = SpecMonitor(min_acceptance=0.4, min_samples=3)
    for _ in range(2):
        monitor.observe(rejected())
    assert monitor.mode is Mode.ON  # too few drafts to judge
    monitor.observe(rejected())
    assert monitor.mode is Mode.OFF and not monitor.allows_draft and monitor.num_switch_offs == 1


def test_monitor_reprobes_with_growing_backoff_and_resets_on_success():
    monitor = SpecMonitor(min_samples=3, base_backoff=4)
    for _ in range(3):
        monitor.observe(rejected())
    waits = []
    for _ in range(3):  # three failed probes
        steps = 0
        while monitor.mode is Mode.OFF:
            monitor.observe(None)
            steps += 1
        assert monitor.mode is Mode.PROBE and monitor.alpha == monitor.probe_alpha  # a fresh, hopeful look
        assert monitor.draft_cap(8) == monitor.probe_tokens == 2  # ...with a short draft
        waits.append(steps)
        monitor.observe(rejected())
        assert monitor.mode is Mode.OFF  # one probe draft with nothing kept fails it: probes stay cheap
    assert waits == [4, 8, 16] and monitor.num_probes == 3
    while monitor.mode is Mode.OFF:
        monitor.observe(None)
    for _ in range(3):  # the text turned repetitive: the probe succeeds
        monitor.observe(kept())
    assert monitor.mode is Mode.ON and monitor.backoff == monitor.base_backoff and monitor.draft_cap(8) == 8


def test_monitor_alpha_counts_tested_tokens_and_slower_than_plain_switches_off():
    monitor = SpecMonitor(min_samples=3)
    for _ in range(3):
        monitor.observe(draft_sample(8, 2, 3))  # 2 of 3 tested tokens kept: alpha 0.67, not 2 / 8
    assert monitor.sums.alpha() == pytest.approx(2 / 3) and monitor.sums.tau == 3.0
    assert monitor.mode is Mode.ON
    slow = SpecMonitor(min_samples=3)
    slow.observe(draft_sample(8, 2, 3))  # untimed: the speedup rule waits for three timed drafts
    sample = draft_sample(8, 2, 3, seconds=4.0, plain_seconds_per_token=1.0)  # 3 tokens in 4 plain tokens' time
    for _ in range(2):
        slow.observe(sample)
    assert slow.sums.speedup == pytest.approx(0.75) and slow.mode is Mode.ON
    slow.observe(sample)
    assert slow.mode is Mode.OFF  # well accepted, but slower than plain decoding


def test_monitor_held_steps_count_a_drafter_with_nothing_does_not():
    monitor = SpecMonitor(base_backoff=4)
    for _ in range(10):
        monitor.observe(None, held=False)  # the drafter found nothing: no reason to re-measure
    assert monitor.mode is Mode.ON
    for _ in range(4):
        monitor.observe(None, held=True)  # the cost model kept saying no: re-measure alpha
    assert monitor.mode is Mode.PROBE


def test_a_first_draft_that_keeps_nothing_decides_when_asked():
    """Sampled requests' adaptive members: the first draft is judged as a probe is (full length kept)."""
    monitor = SpecMonitor(min_samples=3)
    monitor.judge_first_draft()
    assert monitor.mode is Mode.ON and monitor.draft_cap(8) == 8
    monitor.observe(rejected())
    assert monitor.mode is Mode.OFF and monitor.num_switch_offs == 1
    lucky = SpecMonitor(min_samples=3)
    lucky.judge_first_draft()
    lucky.observe(kept())
    lucky.observe(rejected())  # only the first draft decides alone; later ones wait for min_samples
    assert lucky.mode is Mode.ON


def test_a_monitor_that_does_not_switch_keeps_its_window_and_stays_on():
    """The engine's monitor of a drafter that switches its own members (adaptive): counts, never holds off."""
    monitor = SpecMonitor(min_acceptance=0.4, min_samples=3, switching=False)
    for _ in range(6):
        monitor.observe(rejected())
        monitor.observe(None, held=True)
    assert monitor.mode is Mode.ON and monitor.num_switch_offs == monitor.num_probes == 0
    assert monitor.sums.steps == 6 and monitor.sums.alpha() == 0.0 and monitor.draft_cap(8) == 8
