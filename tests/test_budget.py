"""budget.py: the expected tokens of a draft, the batch's draft plan and the user's caps on it.

The plan runs on fixed pass-cost tables (tests/test_pass_cost.py), so its decisions are exact
whatever the machine's load; the last test runs it inside the engine on a batch of four.
"""

from __future__ import annotations

import pytest

from specdec.budget import DraftBudget, DraftCost, expected_tokens, plan_draft_lengths
from specdec.config import SamplingParams, SpecConfig
from specdec.drafters.registry import DraftResources
from specdec.engine import Engine, SequenceState
from specdec.llm import LLM
from specdec.pass_cost import PassCost
from tests.test_pass_cost import compute_bound, cost_model


def test_expected_tokens():
    assert expected_tokens(0.0, 5) == 1.0  # only the recovered token
    assert expected_tokens(1.0, 5) == 6.0  # all accepted plus the bonus
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_free_verification_drafts_everything_even_at_modest_alpha():
    assert plan_draft_lengths([0.3], [8], cost_model(per_token=0.0), padded=False) == [8]


def test_expensive_verification_and_low_alpha_draft_nothing():
    assert plan_draft_lengths([0.05], [8], cost_model(per_token=0.15), padded=False) == [0]


def test_unmeasured_cost_drafts_the_cap_then_a_plain_step_to_measure_both():
    cost = PassCost()
    assert plan_draft_lengths([0.1, None], [5, 5], cost, padded=True) == [5, 0]
    cost.observe(2 * 6, 0.2)  # the padded pass of that plan, timed: plain is still unknown
    assert plan_draft_lengths([0.9, None], [5, 5], cost, padded=True) == [0, 0]
    cost.observe(2 * 1, 0.1)
    assert plan_draft_lengths([0.9, None], [5, 5], cost, padded=True) == [5, 0]


def test_plan_gives_tokens_to_the_sequence_that_accepts():
    plan = plan_draft_lengths([0.9, 0.3], [8, 8], compute_bound(), padded=False)
    assert plan[0] >= 2 and plan[1] == 0


def test_bigger_batches_draft_less_and_then_nothing():
    cost = compute_bound()
    totals = [sum(plan_draft_lengths([0.6] * b, [8] * b, cost, padded=False)) for b in (1, 2, 4, 16)]
    assert totals[0] > 0 and totals == sorted(totals, reverse=True) and totals[-1] == 0
    # A padded pass charges every sequence the widest draft: it gives up sooner.
    assert sum(plan_draft_lengths([0.8] * 4, [8] * 4, cost, padded=True)) <= \
        sum(plan_draft_lengths([0.8] * 4, [8] * 4, cost, padded=False))


def test_draft_seconds_count_against_drafting():
    cost = cost_model(per_token=0.02)
    assert plan_draft_lengths([0.5], [8], cost, padded=False) != [0]
    assert plan_draft_lengths([0.5], [8], cost, padded=False, token_seconds=[5.0]) == [0]


def test_each_drafted_token_pays_its_drafting():
    """A draft model's tokens cost a pass each: dear ones shorten the draft before they stop it."""
    cost = cost_model(per_token=0.002)  # verifying is nearly free: only drafting limits the length
    free, dear = (plan_draft_lengths([0.6], [8], cost, padded=False, token_seconds=[t])[0] for t in (0.0, 0.03))
    assert free == 8 and 1 <= dear < free


def test_draft_cost_per_token():
    c = DraftCost()
    assert c.per_token == 0.0  # nothing known yet: the first ask drafts the cap
    c.observe(0.03, 2)
    c.observe(0.01, 0)  # an ask that drafted nothing still cost its seconds
    assert c.per_token == pytest.approx(0.02)


def test_user_caps():
    assert [DraftBudget(8)(b) for b in (1, 4, 16)] == [8, 8, 8]  # no cap unless asked: the engine plans
    assert [DraftBudget(8, 8)(b) for b in (1, 2, 3, 9)] == [8, 4, 2, 0]


# -- the plan in the engine ------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=["cpu-kernels", "torch"])
def bigram(tiny_model_factory, request) -> LLM:
    """The fused kernels run a batch's rows back to back; the torch path pads it [B, T] (as on a GPU)."""
    llm = LLM(str(tiny_model_factory("llama", seed=2, bigram=True)), max_model_len=512, max_num_seqs=4, spec="none",
              backend=request.param)
    assert llm.runner.pads_batches == (request.param == "torch")
    return llm


PROMPTS = [[5, 6, 7, 8, 9] * 4, [300, 301, 302] * 5, [9, 8, 7] * 6, [1000, 1001] * 8]


def run_planned(llm: LLM, engine: Engine, seqs: list[SequenceState]) -> list[tuple[list[int], list[int]]]:
    """Run a static batch step by step: per step, (the engine's plan, what each sequence drafted)."""
    engine.start(seqs)
    steps, running = [], list(seqs)
    while running:
        plan = engine._plan(running, engine.draft_n_max)
        steps.append((plan, [r.num_drafted for r in engine.step(running)]))
        for s in running:
            if s.finished:
                engine.finish(s)
        running = [s for s in running if not s.finished]
    return steps


def test_batch_of_four_never_drafts_more_than_the_cost_model_allows(bigram, monkeypatch):
    resources = DraftResources(SpecConfig(), bigram.runner, bigram.tokenizer)
    monkeypatch.setattr(bigram.runner, "pass_cost", compute_bound())
    engine = Engine(bigram.runner, draft_n_max=8)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    plain = [bigram.generate([p], SamplingParams(max_new_tokens=24, ignore_eos=True))[0].token_ids for p in PROMPTS]
    seqs = [SequenceState(p, params, drafter=resources.new_drafter()) for p in PROMPTS]
    steps = run_planned(bigram, engine, seqs)
    assert [s.output_ids for s in seqs] == plain
    for plan, drafted in steps:
        assert all(d <= k for d, k in zip(drafted, plan, strict=True))
        if len(plan) == 4:  # at alpha <= 1, no draft at batch 4 beats plain on this cost table
            assert sum(plan) == 0
    alone = SequenceState(PROMPTS[0], params, drafter=resources.new_drafter())
    assert sum(sum(d) for _, d in run_planned(bigram, engine, [alone])) > 0  # the same sequence alone drafts


class CountingDrafter:
    """Wraps a drafter and counts its asks."""

    def __init__(self, inner) -> None:
        self.inner, self.asks = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, context, max_tokens):
        self.asks += 1
        return self.inner.propose(context, max_tokens)


def test_a_requests_first_ask_is_not_priced_into_its_steps(bigram):
    """The engine's per-token price of drafting leaves out the first ask of a request (its setup) and
    counts every later ask; the stats still hold all of the drafting time."""
    resources = DraftResources(SpecConfig(), bigram.runner, bigram.tokenizer)
    engine = Engine(bigram.runner, draft_n_max=4, plan_drafts=False)
    seq = SequenceState(PROMPTS[0], SamplingParams(max_new_tokens=12, ignore_eos=True),
                        drafter=CountingDrafter(resources.new_drafter()))
    engine.start([seq])
    first = engine.step([seq])[0]
    assert seq.stats.draft_asks == 1 and first.draft_seconds > 0 and first.num_drafted > 0
    assert seq.draft_cost.seconds == 0.0 and seq.draft_cost.tokens == first.num_drafted
    engine.step([seq])
    assert seq.stats.draft_asks == 2 and seq.drafter.asks == 2
    assert 0.0 < seq.draft_cost.seconds < seq.stats.draft_seconds
