"""stats.py: SpecStats' rates and ``merge``, which must add every field."""

from __future__ import annotations

from dataclasses import fields

import pytest

from specdec.monitor import WindowSums
from specdec.stats import SpecStats


def filled() -> SpecStats:
    """A SpecStats with every field away from its default (a new field must be given a value here)."""
    s = SpecStats()
    for f in fields(s):
        value = getattr(s, f.name)
        if isinstance(value, (int, float)):
            setattr(s, f.name, type(value)(3))
        elif isinstance(value, list):
            setattr(s, f.name, [2, 1])
        elif isinstance(value, WindowSums):
            setattr(s, f.name, WindowSums(steps=1, drafted=4, accepted=2, tested=3, committed=3))
        elif f.name == "drafter_windows":
            setattr(s, f.name, {"ngram": WindowSums(steps=1, drafted=4, accepted=2, tested=3, committed=3)})
        elif isinstance(value, dict):
            setattr(s, f.name, {"ngram": 2})
        else:
            raise AssertionError(f"filled() does not know how to fill {f.name}")
    return s


def test_merge_adds_every_field():
    """Fails if a field of SpecStats is not merged (the old hand-written list could drop one)."""
    one, total = filled(), SpecStats()
    total.merge(one)
    total.merge(one)
    for f in fields(SpecStats):
        empty, mine, theirs = getattr(SpecStats(), f.name), getattr(total, f.name), getattr(one, f.name)
        assert mine != empty, f"SpecStats.merge dropped {f.name}"
        if isinstance(theirs, (int, float)):
            assert mine == 2 * theirs, f.name
        elif isinstance(theirs, list):
            assert mine == [2 * v for v in theirs], f.name
        elif isinstance(theirs, WindowSums):
            assert mine.drafted == 2 * theirs.drafted and mine.tested == 2 * theirs.tested, f.name
        else:
            assert set(mine) == set(theirs), f.name


def test_merge_pads_per_position_counts_and_pools_drafters():
    a, b = SpecStats(), SpecStats()
    a.record_draft(2, 1, [("ngram", 2)], ["ngram"])
    b.record_draft(4, 3, [("suffix", 4)], ["suffix"] * 3)
    a.merge(b)
    assert a.drafted_per_pos == [2, 2, 1, 1] and a.accepted_per_pos == [2, 1, 1]
    assert a.drafted_by == {"ngram": 2, "suffix": 4} and a.accepted_by == {"ngram": 1, "suffix": 3}
    assert a.drafts == 2 and a.acceptance_rate == pytest.approx(4 / 6)


def test_acceptance_rate_is_accepted_over_drafted_not_alpha():
    s = SpecStats()
    s.record_draft(5, 2, [("ngram", 5)], ["ngram"] * 2)  # 2 kept of 5 drafted; the verifier tested 3
    assert s.acceptance_rate == pytest.approx(2 / 5)  # alpha (monitor.py) would be 2 / 3


def test_a_batch_counts_its_wall_time_its_passes_once_and_one_prefill():
    """Each sequence's stats count a batched pass in full: the batch's counters take its own times."""
    a = SpecStats(new_tokens=5, decode_passes=5, target_seconds=2.0, prefill_seconds=0.5, seconds=3.0)
    b = SpecStats(new_tokens=3, decode_passes=5, target_seconds=2.0, prefill_seconds=0.7, seconds=3.0)
    batch = SpecStats.of_batch([a, b], seconds=3.5, target_seconds=2.2)
    assert (batch.new_tokens, batch.decode_passes) == (8, 10)
    assert (batch.seconds, batch.target_seconds, batch.prefill_seconds) == (3.5, 2.2, 0.7)
    assert SpecStats.of_batch([], 0.0, 0.0) == SpecStats()
