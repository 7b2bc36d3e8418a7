"""Adaptive speculation: the cost model, the batch's draft plan, the monitor and the adaptive drafter.

The controller runs here on scripted acceptance (members whose proposals are
right or wrong by design, monitors fed hand-made samples) and on a fixed pass-cost
table, so the decisions are exact whatever the machine's load.
"""

from __future__ import annotations

import pytest
import torch

from specdec.adaptive import PassCost, expected_tokens
from specdec.budget import DraftBudget, pass_width, plan_draft_lengths
from specdec.config import SamplingParams, SpecConfig, SpecType, parse_spec_types
from specdec.drafters.adaptive import AdaptiveDrafter, DraftTrie, Offer, choose, planned_length, replay
from specdec.drafters.base import Drafter, DraftProposal
from specdec.drafters.registry import DraftResources, adaptive_members
from specdec.engine import Engine, Sequence
from specdec.llm import LLM
from specdec.monitor import Mode, SpecMonitor, WindowSums, draft_sample


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


# -- the cost model ----------------------------------------------------------------------------------

def test_expected_tokens():
    assert expected_tokens(0.0, 5) == 1.0  # only the recovered token
    assert expected_tokens(1.0, 5) == 6.0  # all accepted plus the bonus
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


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


# -- the batch's draft plan ----------------------------------------------------------------------------

def test_free_verification_drafts_everything_even_at_modest_alpha():
    assert plan_draft_lengths([0.3], [8], cost_model(per_token=0.0), padded=False) == [8]


def test_expensive_verification_and_low_alpha_draft_nothing():
    assert plan_draft_lengths([0.05], [8], cost_model(per_token=0.15), padded=False) == [0]


def test_unmeasured_cost_drafts_the_cap_to_measure_it():
    assert plan_draft_lengths([0.1, None], [5, 5], PassCost(), padded=True) == [5, 0]


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
    assert plan_draft_lengths([0.5], [8], cost, padded=False, draft_seconds=[5.0]) == [0]


def test_pass_width_and_user_caps():
    assert pass_width([1, 5, 2], padded=True) == 15 and pass_width([1, 5, 2], padded=False) == 8
    assert [DraftBudget(8)(b) for b in (1, 4, 16)] == [8, 8, 8]  # no cap unless asked: the engine plans
    assert [DraftBudget(8, 8)(b) for b in (1, 2, 3, 9)] == [8, 4, 2, 0]


# -- the monitor -----------------------------------------------------------------------------------------

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
        waits.append(steps)
        monitor.observe(rejected())
        assert monitor.mode is Mode.OFF  # one probe draft with nothing kept fails it: probes stay cheap
    assert waits == [4, 8, 16] and monitor.num_probes == 3
    while monitor.mode is Mode.OFF:
        monitor.observe(None)
    for _ in range(3):  # the text turned repetitive: the probe succeeds
        monitor.observe(kept())
    assert monitor.mode is Mode.ON and monitor.backoff == monitor.base_backoff


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


# -- the adaptive drafter ------------------------------------------------------------------------------

def test_trie_merges_shared_prefixes():
    trie = DraftTrie.merge([Offer("ngram", 0.8, DraftProposal([5, 6, 7])), Offer("suffix", 0.5, DraftProposal([5, 9]))])
    assert trie.tokens[1:] == [5, 6, 7, 9] and trie.parents[1:] == [0, 1, 2, 1]
    assert trie.owners[1:] == ["ngram"] * 3 + ["suffix"]
    assert trie.reach[1] == pytest.approx(1 - 0.2 * 0.5)  # both drafters support token 5
    # Siblings 6 (0.8) and 9 (0.5) cannot both be kept: their shares are scaled to sum to 1.
    assert trie.reach[2] + trie.reach[4] == pytest.approx(trie.reach[1])


def test_choose_merges_into_one_tree_when_verification_is_cheap():
    offers = [Offer("ngram", 0.7, DraftProposal([5, 6, 7])), Offer("suffix", 0.7, DraftProposal([5, 9, 10]))]
    proposal = choose(offers, 8, cost_model(per_token=0.0), greedy=True)
    assert not proposal.is_chain and sorted(proposal.token_ids) == [5, 6, 7, 9, 10]
    assert proposal.drafter == "ngram+suffix" and proposal.origins.count("suffix") == 2


def test_choose_picks_the_better_proposal_when_verification_is_dear():
    offers = [Offer("ngram", 0.95, DraftProposal([5, 6, 7])), Offer("suffix", 0.2, DraftProposal([8, 9, 10]))]
    proposal = choose(offers, 8, cost_model(per_token=0.2), greedy=True)
    assert proposal.token_ids == [5, 6, 7] and proposal.is_chain and proposal.drafter == "ngram"
    assert proposal.origins is None


def test_choose_keeps_a_sampled_proposal_alone_when_sampling():
    import torch

    q = torch.full((2, 10), 0.1)
    offers = [Offer("draft-model", 0.9, DraftProposal([5, 6], probs=q)), Offer("ngram", 0.5, DraftProposal([5, 7]))]
    sampled = choose(offers, 8, cost_model(per_token=0.0), greedy=False)
    assert sampled.drafter in ("draft-model", "ngram") and sampled.is_chain  # never the merged tree
    assert (sampled.probs is not None) == (sampled.drafter == "draft-model")
    merged = choose(offers, 8, cost_model(per_token=0.0), greedy=True)
    assert not merged.is_chain and merged.probs is None


def test_replay_scores_a_proposal_against_the_committed_tokens():
    assert replay(DraftProposal([5, 6, 7]), [5, 6, 9]) == (2, 3)
    assert replay(DraftProposal([5, 6, 7]), [5, 6]) == (2, 2)  # 7 was never tested
    assert replay(DraftProposal([5, 6]), [5, 6, 1]) == (2, 2)  # all kept: nothing rejected
    assert replay(DraftProposal.from_tree([4, 5, 6], [0, 0, 2]), [5, 6, 1]) == (2, 2)


class Script(Drafter):
    """Proposes the next ``k`` tokens of a known output, right or shifted by one (always wrong)."""

    def __init__(self, name: str, truth: list[int], right: bool, k: int = 4) -> None:
        self.name, self.truth, self.right, self.k = name, truth, right, k

    def propose(self, context, max_tokens):
        chain = self.truth[len(context) : len(context) + min(self.k, max_tokens)]
        return DraftProposal(chain if self.right else [t + 1 for t in chain])


def run_script(drafter: AdaptiveDrafter, truth: list[int], steps: int, start: int = 1) -> list[DraftProposal]:
    drafter.begin(truth[:start], SamplingParams())
    context, chosen = list(truth[:start]), []
    for _ in range(steps):
        proposal = drafter.propose(context, 8)
        chosen.append(proposal)
        num = replay(proposal, truth[len(context) :])[0] if len(proposal) else 0
        context = truth[: len(context) + num + 1]  # what a verifier would commit
        drafter.accept(context, num)
    return chosen


def test_adaptive_prefers_the_drafter_being_accepted_and_switches_the_other_off():
    truth = list(range(100, 200))
    drafter = AdaptiveDrafter([Script("wrong", truth, right=False), Script("right", truth, right=True)],
                              cost_model(per_token=0.1))
    chosen = run_script(drafter, truth, 12)
    origins = [p.origins or [p.drafter] * len(p) for p in chosen]
    assert all(o[:4] == ["right"] * 4 for o in origins[1:])  # its chain first, in full
    assert origins[0].count("wrong") >= 2  # at first both were equals
    # Switched off after its first three rejections, "wrong" is only asked in one probe of three steps.
    assert sum("wrong" in o for o in origins[3:]) <= 3
    wrong = drafter.members[0].monitor
    assert wrong.num_switch_offs == 2 and wrong.num_probes == 1 and wrong.backoff == 2 * wrong.base_backoff
    assert drafter.windows()["right"].alpha() == 1.0


def test_adaptive_on_flat_cost_verifies_both_as_one_tree():
    truth = list(range(100, 200))
    drafter = AdaptiveDrafter([Script("wrong", truth, right=False), Script("right", truth, right=True)],
                              cost_model(per_token=0.0))
    first = run_script(drafter, truth, 1)[0]
    assert not first.is_chain and set(first.origins) == {"wrong", "right"}


# -- the engine: spec type, batches --------------------------------------------------------------------

def test_adaptive_spec_type_is_the_default_and_alone():
    assert SpecConfig().types == (SpecType.ADAPTIVE,)
    with pytest.raises(ValueError, match="cannot be combined"):
        parse_spec_types("adaptive,ngram")
    assert adaptive_members(SpecConfig()) == (SpecType.NGRAM, SpecType.NGRAM_MAP_K, SpecType.SUFFIX)
    assert adaptive_members(SpecConfig(draft_model="m", spec_model="h"))[-2:] == (SpecType.DRAFT_MODEL,
                                                                                   SpecType.EAGLE3)


@pytest.fixture(scope="module", params=["cpu-kernels", "torch"])
def bigram(tiny_model_factory, request) -> LLM:
    """The fused kernels run a batch's rows back to back; the torch path pads it [B, T] (as on a GPU)."""
    llm = LLM(str(tiny_model_factory("llama", seed=2, bigram=True)), max_model_len=512, max_num_seqs=4, spec="none",
              backend=request.param)
    assert llm.runner.pads_batches == (request.param == "torch")
    return llm


PROMPTS = [[5, 6, 7, 8, 9] * 4, [300, 301, 302] * 5, [9, 8, 7] * 6, [1000, 1001] * 8]


def run_planned(llm: LLM, engine: Engine, seqs: list[Sequence]) -> list[tuple[list[int], list[int]]]:
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
    seqs = [Sequence(p, params, drafter=resources.new_drafter()) for p in PROMPTS]
    steps = run_planned(bigram, engine, seqs)
    assert [s.output_ids for s in seqs] == plain
    for plan, drafted in steps:
        assert all(d <= k for d, k in zip(drafted, plan, strict=True))
        if len(plan) == 4:  # at alpha <= 1, no draft at batch 4 beats plain on this cost table
            assert sum(plan) == 0
    alone = Sequence(PROMPTS[0], params, drafter=resources.new_drafter())
    assert sum(sum(d) for _, d in run_planned(bigram, engine, [alone])) > 0  # the same sequence alone drafts


def test_a_sampled_offer_is_cut_by_its_plan_never_by_its_drawn_length():
    """verify.py's rule: a sampled draft's length follows its own tokens (p-min), so whether it is
    verified must not. Here one drafted token never pays and three do: a sampled chain that came
    out one token long was dropped (its trie's rate), a longer one kept. Now both are verified."""
    cost = PassCost(max_age=1 << 30)
    cost.seconds = {1: 1.0, 2: 2.5, 4: 1.2}
    assert planned_length(0.8, 4, cost)[0] == 4
    q = torch.full((8,), 1 / 8)
    short, long = DraftProposal([5], probs=q.expand(1, 8)), DraftProposal([5, 6, 7], probs=q.expand(3, 8))
    for proposal in (short, long):
        picked = choose([Offer("draft-model", 0.8, proposal)], 4, cost, greedy=False)
        assert picked.token_ids == proposal.token_ids and picked.probs is not None
    assert planned_length(0.8, 1, cost)[0] == 0  # one token never pays: the member is not verified
    assert len(choose([Offer("draft-model", 0.8, short)], 1, cost, greedy=False)) == 0
