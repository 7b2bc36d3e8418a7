"""Dynamic draft length: the expected-tokens formula and the choices it implies."""

from __future__ import annotations

import pytest

from specdec.adaptive import DraftLengthPolicy, PassCost, expected_tokens


def cost_model(per_token: float, base: float = 1.0) -> PassCost:
    cost = PassCost()
    for t in (1, 2, 4, 8, 17):
        cost.observe(t, base + per_token * (t - 1))
    return cost


def test_expected_tokens():
    assert expected_tokens(0.0, 5) == 1.0  # only the recovered token
    assert expected_tokens(1.0, 5) == 6.0  # all accepted plus the bonus
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_cost_interpolates_between_measured_widths():
    cost = cost_model(per_token=0.1)
    assert cost.estimate(3) == pytest.approx(1.2)
    assert cost.estimate(40) == pytest.approx(1.0 + 0.1 * 39)
    assert PassCost().estimate(1) is None


def test_free_verification_drafts_everything_even_at_modest_alpha():
    policy = DraftLengthPolicy(alpha=0.3)
    assert policy.choose(cost_model(per_token=0.0), k_max=8) == 8


def test_expensive_verification_and_low_alpha_switch_drafting_off_then_probe():
    policy = DraftLengthPolicy(alpha=0.05)
    cost = cost_model(per_token=0.15)
    assert policy.choose(cost, k_max=8) == 0
    for _ in range(policy.probe_every):
        policy.observe(0, 0)
    assert policy.choose(cost, k_max=8) == 8  # re-measure alpha once in a while


def test_alpha_follows_acceptance():
    policy = DraftLengthPolicy(alpha=0.5)
    for _ in range(20):
        policy.observe(8, 8)
    assert policy.alpha > 0.95
    for _ in range(20):
        policy.observe(8, 0)
    assert policy.alpha < 0.05


def test_bigger_batches_make_drafting_dearer():
    policy = DraftLengthPolicy(alpha=0.6)
    cost = PassCost()
    for t in (1, 2, 4, 8, 16, 32, 64):  # flat until 4 tokens, then linear: compute-bound
        cost.observe(t, max(1.0, t / 4))
    alone = policy.choose(cost, k_max=8, others=0)
    crowded = policy.choose(cost, k_max=8, others=31)
    assert alone > crowded
