"""pass_cost.py: the running estimate of a target pass's seconds by width, and the width of a pass.

``cost_model`` and ``FixedCost`` are shared with the budget and adaptive-drafter tests: a fixed
table makes the decisions exact whatever the machine's load.
"""

from __future__ import annotations

import pytest

from specdec.budget import plan_draft_lengths
from specdec.pass_cost import PassCost, acceptance_floor, pass_width


def cost_model(per_token: float, base: float = 1.0) -> PassCost:
    cost = PassCost()
    for t in (1, 2, 4, 8, 17):
        cost.observe(t, base + per_token * (t - 1))
    return cost


class FixedCost(PassCost):
    """A measured table that later passes do not move: the engine's decisions become exact."""

    def __init__(self, seconds: dict[int, float]) -> None:
        super().__init__()
        self.seconds = dict(seconds)

    def observe(self, num_tokens: int, seconds: float) -> None:
        pass


def compute_bound(widths=(1, 2, 4, 8, 16, 32, 64)) -> FixedCost:
    """Flat up to 4 rows, then linear: a CPU whose few-row kernels saturate at 4 rows."""
    return FixedCost({t: max(1.0, t / 4) for t in widths})


def test_cost_interpolates_between_measured_widths():
    cost = cost_model(per_token=0.1)
    assert cost.estimate(3) == pytest.approx(1.2)
    assert cost.estimate(40) == pytest.approx(1.0 + 0.1 * 39)
    assert PassCost().estimate(1) is None


def test_cost_discounts_slow_outliers_and_forgets_widths_not_timed_lately():
    cost = PassCost(smoothing=0.2, max_age=10)
    cost.observe(1, 1.0)
    cost.observe(9, 2.0)
    cost.observe(9, 6.0)  # a stall: moves the estimate a quarter as fast as a faster pass would
    assert cost.estimate(9) == pytest.approx(2.0 + 0.05 * 4.0)
    cost.observe(9, 1.0)
    assert cost.estimate(9) == pytest.approx(2.2 + 0.2 * (1.0 - 2.2))
    for _ in range(10):  # plain passes only: width 9 grows stale and is forgotten
        cost.observe(1, 1.0)
    assert cost.estimate(9) is None and not cost.measured
    assert plan_draft_lengths([0.2], [8], cost, padded=False) == [8]  # so it is drafted and timed again


def test_pass_width_is_the_rows_a_ragged_or_padded_pass_computes():
    assert pass_width([1, 5, 2], padded=True) == 15 and pass_width([1, 5, 2], padded=False) == 8


def test_the_acceptance_floor_is_what_one_drafted_token_costs():
    """A 1-token draft repays its row at alpha = (c(2) + drafting) / c(1) - 1: the floor falls from
    min_acceptance to that (at least 0.05) once the costs are measured, and never rises above it."""
    cost = cost_model(per_token=0.02)  # c(1) = 1, c(2) = 1.02
    assert acceptance_floor(0.4, None) == acceptance_floor(0.4, PassCost()) == 0.4  # nothing measured yet
    assert acceptance_floor(0.4, cost) == pytest.approx(0.05)  # a look-up's free token: 0.02, raised to 0.05
    assert acceptance_floor(0.4, cost, draft_seconds=0.3) == pytest.approx(0.32)  # a draft model's pass
    assert acceptance_floor(0.4, cost, draft_seconds=0.9) == 0.4  # dearer than min_acceptance: that
    assert acceptance_floor(0.0, cost) == 0.0  # 0 switches nothing off
