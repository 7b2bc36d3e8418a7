"""drafters/adaptive.py: the --spec-type adaptive drafter (its trie, choice, replay and members).

It runs here on scripted acceptance (members whose proposals are right or wrong by design)
and on a fixed pass-cost table (tests/test_pass_cost.py), so the decisions are exact whatever
the machine's load.
"""

from __future__ import annotations

import pytest
import torch

from specdec.config import SamplingParams, SpecConfig, SpecType, parse_spec_types
from specdec.drafters.adaptive import AdaptiveDrafter, Offer, OfferTrie, choose, planned_length, replay
from specdec.drafters.base import EMPTY, Drafter, DraftProposal, IndexingDrafter
from specdec.drafters.registry import adaptive_members
from specdec.monitor import Mode, WindowSums
from specdec.pass_cost import PassCost
from tests.test_pass_cost import cost_model


def test_trie_merges_shared_prefixes():
    trie = OfferTrie.merge([Offer("ngram", 0.8, DraftProposal([5, 6, 7])), Offer("suffix", 0.5, DraftProposal([5, 9]))])
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


def test_adaptive_spec_type_is_the_default_and_alone():
    assert SpecConfig().types == (SpecType.ADAPTIVE,)
    with pytest.raises(ValueError, match="cannot be combined"):
        parse_spec_types("adaptive,ngram")
    assert adaptive_members(SpecConfig()) == (SpecType.NGRAM, SpecType.NGRAM_MAP_K, SpecType.SUFFIX)
    assert adaptive_members(SpecConfig(draft_model="m", spec_model="h"))[-2:] == (SpecType.DRAFT_MODEL,
                                                                                   SpecType.EAGLE3)


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


class Dear(Script):
    """A right member that must first spend ``catch_up`` seconds on the context it has not seen
    (a draft model's pass over the prompt)."""

    def __init__(self, truth: list[int], catch_up: float) -> None:
        super().__init__("dear", truth, right=True)
        self.catch_up, self.asked = catch_up, 0

    def catch_up_seconds(self, context):
        return self.catch_up

    def propose(self, context, max_tokens):
        self.asked += 1
        self.catch_up = 0.0  # caught up
        return super().propose(context, max_tokens)


@pytest.mark.parametrize("max_new, made, catch_up, asked",
                         [(100, 50, 50.0, False), (100, 50, 5.0, True), (100, 5, 5.0, False), (10, 5, 5.0, False),
                          (100, 0, 0.1, True)])
def test_a_member_is_asked_only_where_the_request_can_repay_its_catch_up(max_new, made, catch_up, asked):
    """Plain decoding costs 1 s a token here, a 4-token draft at alpha 0.6 ~0.6 s a token: at best
    0.4 s saved per remaining token. The rest of an answer is expected to be as long as what it has
    made (at most its budget; at least the next one): 5 s of catch-up pays after 50 of 100 tokens, not
    after 5, nor over 10; 0.1 s pays before the first."""
    truth = list(range(100, 300))
    dear = Dear(truth, catch_up)
    drafter = AdaptiveDrafter([dear], cost_model(per_token=0.1))
    drafter.begin(truth[:1], SamplingParams(max_new_tokens=max_new))
    drafter.propose(truth[: 1 + made], 4)
    assert (dear.asked == 1) == asked


class Priced(Dear):
    """``Dear`` whose drafter knows what a drafted token costs before drafting (a draft model's timed pass)."""

    def __init__(self, truth: list[int], catch_up: float, token_seconds: float | None) -> None:
        super().__init__(truth, catch_up)
        self.seconds = token_seconds

    def token_seconds(self):
        return self.seconds


@pytest.mark.parametrize("token_seconds, asked", [(None, True), (0.3, True), (0.5, False)])
def test_a_members_first_ask_is_priced_by_what_its_drafter_says_a_token_costs(token_seconds, asked):
    """As above, 5 s of catch-up after 50 of 100 tokens: with free drafts (nothing known before the first ask)
    it pays; at 0.3 s a drafted token against 1 s passes one token at alpha 0.6 still saves 0.12 s a token
    (6 s over the 50 to come); at 0.5 s nothing does, so the catch-up is not paid (a 0.5B draft's 0.2-0.4 s
    prompt passes, let through as if its drafts were free, cost adaptive 0.66 s on three MT-bench answers)."""
    truth = list(range(100, 300))
    dear = Priced(truth, 5.0, token_seconds)
    drafter = AdaptiveDrafter([dear], cost_model(per_token=0.1))
    drafter.begin(truth[:1], SamplingParams(max_new_tokens=100))
    drafter.propose(truth[:51], 4)
    assert (dear.asked == 1) == asked


@pytest.mark.parametrize("realized, asked", [(None, True), (1.1, False), (1.5, True)])
def test_a_catch_up_is_repaid_no_faster_than_the_members_drafts_realized(realized, asked):
    """As above, 5 s of catch-up after 50 of 100 tokens: priced at alpha it pays (0.4 s saved a
    token); at the 1.1x its drafts realized in earlier requests (the ledger) ~0.09 s a token, which
    does not; at 1.5x, 0.33 s a token, which does."""
    truth = list(range(100, 300))
    ledger = AdaptiveDrafter.shared_state(None).value
    for _ in range(3 if realized else 0):
        ledger.record("dear", WindowSums(1, 2, 1, 2, 2, timed_steps=1, seconds=1.0, plain_seconds=realized))
    dear = Dear(truth, 5.0)
    drafter = AdaptiveDrafter([dear], cost_model(per_token=0.1), ledger=ledger)
    drafter.begin(truth[:1], SamplingParams(max_new_tokens=100))
    drafter.propose(truth[:51], 4)
    assert (dear.asked == 1) == asked


def test_a_catch_up_waits_for_the_targets_costs():
    """Before the target's pass costs are measured nothing prices what a catch-up could buy back: a member
    that must first catch up is not asked (a process's first RAG prompt had a 0.5B draft spend 1.9 s on it to
    draft 4 tokens), while one that need not is; once two widths are timed, the catch-up is priced."""
    truth = list(range(100, 300))
    cost = PassCost(max_age=1 << 30)
    dear, free = Dear(truth, 0.1), Dear(truth, 0.0)
    drafter = AdaptiveDrafter([dear, free], cost)
    drafter.begin(truth[:1], SamplingParams(max_new_tokens=100))
    drafter.propose(truth[:2], 4)
    assert (dear.asked, free.asked) == (0, 1)
    cost.seconds = {1: 1.0, 5: 1.4}
    alone = AdaptiveDrafter([dear], cost)
    alone.begin(truth[:1], SamplingParams(max_new_tokens=100))
    alone.propose(truth[:3], 4)
    assert dear.asked == 1


def test_a_paid_catch_up_is_charged_to_the_ledger_not_to_the_requests_monitor():
    """15 s of catch-up after 50 of 100 tokens (the most the rest could repay is 50 x 0.4 s), then three
    drafts all kept: the request drafts on (its monitor judges the drafts: the catch-up is paid), but the
    ledger, which decides whether the next request pays it again, prices them with it; a catch-up no draft
    followed is all cost."""
    truth = list(range(100, 300))
    ledger = AdaptiveDrafter.shared_state(None).value
    dear = Dear(truth, 15.0)
    drafter = AdaptiveDrafter([dear], cost_model(per_token=0.1), ledger=ledger)
    drafter.begin(truth[:1], SamplingParams(max_new_tokens=100))
    context, plain, seconds = truth[:51], 0.0, 15.0
    for _ in range(3):
        n = len(drafter.propose(context, 4))
        context = truth[: len(context) + n + 1]
        drafter.accept(context, n)
        plain, seconds = plain + n + 1, seconds + 1.0 + 0.1 * n
    monitor = drafter.members[0].monitor
    assert dear.asked == 3 and monitor.mode is Mode.ON and monitor.sums.speedup > 1.5
    drafter.end(context)
    assert ledger.speedup("dear", 3) == pytest.approx(plain / seconds, rel=1e-3) and plain / seconds < 1.0
    fresh = AdaptiveDrafter.shared_state(None).value
    unpaid = AdaptiveDrafter([Dear(truth, 15.0)], cost_model(per_token=0.1), ledger=fresh)
    unpaid.begin(truth[:1], SamplingParams(max_new_tokens=100))
    assert len(unpaid.propose(truth[:51], 4))
    unpaid.end(truth[:51])
    assert (fresh.timed["dear"].sums.seconds, fresh.timed["dear"].sums.plain_seconds) == (15.0, 0.0)
    stuck = Stuck(truth, 15.0)
    skipped = AdaptiveDrafter([stuck], cost_model(per_token=0.1))
    skipped.begin(truth[:1], SamplingParams(max_new_tokens=100))
    assert not len(skipped.propose(truth[:51], 4))  # returned before catching up: nothing paid, nothing owed
    assert stuck.asked == 1 and skipped.members[0].owed == 0.0


class Stuck(Dear):
    """A draft model at the end of its context: returns nothing, without catching up."""

    def propose(self, context, max_tokens):
        self.asked += 1
        return EMPTY


@pytest.mark.parametrize("free_alpha, asked", [(0.9, False), (0.1, True)])
def test_a_catch_up_must_beat_what_the_other_members_already_draft(free_alpha, asked):
    """The catch-up buys back only what its drafts add over the members that need none: 0.1 s of catch-up
    after 50 of 100 tokens pays against plain decoding, not beside a look-up that drafts at alpha 0.9
    (suffix drafting on code edits), but beside one at alpha 0.1 it does."""
    truth = list(range(100, 300))
    dear, free = Dear(truth, 0.1), Dear(truth, 0.0)
    drafter = AdaptiveDrafter([dear, free], cost_model(per_token=0.1))
    drafter.begin(truth[:1], SamplingParams(max_new_tokens=100))
    for member, alpha in zip(drafter.members, (0.6, free_alpha), strict=True):  # as if measured
        member.monitor.__class__ = type("Measured", (type(member.monitor),), {"alpha": property(lambda _, a=alpha: a)})
    drafter.propose(truth[:51], 4)
    assert (dear.asked == 1) == asked


def test_with_every_member_off_no_rows_are_planned_and_the_back_offs_still_run_out():
    truth = list(range(100, 300))
    drafter = AdaptiveDrafter([Script("wrong", truth, right=False)], cost_model(per_token=0.1))
    run_script(drafter, truth, 3)  # three rejections: switched off
    monitor = drafter.members[0].monitor
    assert not monitor.allows_draft and drafter.planned_alpha(0.9) is None
    context = truth[:10]
    for _ in range(monitor.backoff):  # steps the engine gave adaptive no budget: propose never called
        drafter.accept(context, 0)
        context = truth[: len(context) + 1]
    assert monitor.mode.value == "probe" and drafter.planned_alpha(0.9) == monitor.probe_alpha
    # the sequence's alpha (of the tokens its budgets let through) does not cap it
    assert drafter.planned_alpha(0.3) == monitor.probe_alpha


class Lookup(IndexingDrafter):
    """A look-up member (its probes are dry runs) proposing the known output: right, shifted by one
    (always wrong), or nothing (``right=None``)."""

    name = "lookup"

    def __init__(self, truth: list[int], right: bool | None) -> None:
        super().__init__()
        self.truth, self.right, self.proposed = truth, right, 0

    def propose(self, context, max_tokens):
        self._sync(context)
        self.proposed += 1
        chain = self.truth[len(context) : len(context) + min(4, max_tokens)]
        return DraftProposal([] if self.right is None else chain if self.right else [t + 1 for t in chain])


def sampled_lookup(truth: list[int], right: bool | None) -> AdaptiveDrafter:
    drafter = AdaptiveDrafter([Lookup(truth, right)], cost_model(per_token=0.1))
    drafter.begin(truth[:1], SamplingParams(temperature=1.0, max_new_tokens=100))
    return drafter


def test_a_sampled_requests_lookup_member_is_verified_only_after_its_dry_runs_keep_tokens():
    """Its first drafts are dry runs, scored against what the target commits: no rows are planned
    for it and ``propose`` verifies nothing of it until min_samples dry runs kept tokens."""
    truth = list(range(100, 300))
    drafter = sampled_lookup(truth, right=True)
    monitor, member = drafter.members[0].monitor, drafter.members[0].drafter
    context = truth[:1]
    for _ in range(monitor.min_samples):
        assert monitor.mode is Mode.PROBE and drafter.planned_alpha(0.9) is None
        assert len(drafter.propose(context, 4)) == 0
        context = truth[: len(context) + 1]  # a plain step committed the next token
        drafter.accept(context, 0)
    assert monitor.mode is Mode.ON and monitor.sums.accepted == monitor.min_samples
    assert member.proposed == monitor.min_samples  # one dry run a step (propose asked nothing of it)
    assert drafter.planned_alpha(0.9) == monitor.alpha
    proposal = drafter.propose(context, 4)
    assert len(proposal) and proposal.token_ids == truth[len(context) : len(context) + len(proposal)]


def test_dry_runs_that_keep_nothing_switch_the_member_off():
    """Dry runs cost no pass: a probe of them is judged on min_samples (a first miss does not end it)."""
    truth = list(range(100, 300))
    wrong = sampled_lookup(truth, right=False)
    monitor = wrong.members[0].monitor
    context = truth[:1]
    for _ in range(monitor.min_samples):
        assert monitor.mode is Mode.PROBE
        context = truth[: len(context) + 1]
        wrong.accept(context, 0)
    assert monitor.mode is Mode.OFF and monitor.backoff == 2 * monitor.base_backoff
    assert wrong.planned_alpha(0.9) is None


@pytest.mark.parametrize("dry_seconds, batch, wait", [(None, 1, 0), (0.01, 1, 3), (0.01, 4, 10), (1.0, 1, 16)])
def test_a_probe_that_finds_nothing_waits_as_long_as_its_dry_runs_cost(monkeypatch, dry_seconds, batch, wait):
    """A dry run that finds nothing did not fail: its back-off stays, and it looks again after as many steps
    as keep its dry runs within ``DRY_SHARE`` (0.3%) of the pass: at once where they are cheap (microseconds
    against these 1 s passes; a 1.5B target's 37 ms against suffix's ~0.1 ms), after 3 steps at 1% of a
    pass, at most 4x the base back-off (a fixed back-off held suffix off most of an MT-bench answer at T=0.7).
    In a batch every live sequence dry-runs: 4 of them at 1% of a 1-row pass share a 4-row pass of 1.3 s."""
    import specdec.drafters.adaptive as adaptive

    if dry_seconds is not None:
        monkeypatch.setattr(adaptive, "time", Clock(dry_seconds))
    truth = list(range(100, 300))
    silent = AdaptiveDrafter([Lookup(truth, right=None)], cost_model(per_token=0.1))
    silent.ledger.live = batch  # the sequences of the last pass (``Ledger.count_step``)
    silent.begin(truth[:1], SamplingParams(temperature=1.0, max_new_tokens=100))
    monitor, member = silent.members[0].monitor, silent.members[0].drafter
    assert member.proposed == 1 and (monitor.mode is Mode.PROBE) is (wait == 0)
    context = truth[:1]
    for looks in range(2, 5):
        for _ in range(wait + 1):  # ``wait`` steps without a dry run, then one
            assert member.proposed == looks - 1
            context = truth[: len(context) + 1]
            silent.accept(context, 0)
        assert member.proposed == looks
    assert monitor.backoff == monitor.base_backoff  # found nothing: not a failure


def test_the_ledger_counts_the_sequences_a_pass_carried():
    """What the dry runs' wait prices against: the accepts after the last complete decode pass (a request that
    fails in the server never ends its drafter, so requests begun minus ended would only grow)."""
    ledger = AdaptiveDrafter.shared_state(None).value
    assert ledger.live == 1
    for step, batch in ((7, 4), (8, 3), (9, 1), (10, 1)):
        for _ in range(batch):
            ledger.count_step(step)
    assert ledger.live == 1  # pass 9 carried one
    ledger = AdaptiveDrafter.shared_state(None).value
    for step, batch in ((7, 4), (8, 3)):
        for _ in range(batch):
            ledger.count_step(step)
    assert ledger.live == 4  # pass 8's count is not complete yet


def test_a_sampled_request_starts_its_lookup_members_as_the_last_one_left_them():
    """The ledger keeps whether each look-up member was on when a sampled request ended: one that was
    starts the next sampled request drafting (verified from its first step), one that was off starts as
    dry-run probes (its dry runs cost nothing; at T=1 they keep creative text's passes plain). Starting
    every sampled request as probes cost suffix a third of its drafts on short chat answers at T=0.7."""
    truth = list(range(100, 300))
    ledger = AdaptiveDrafter.shared_state(None).value
    for right, starts_on in ((True, False), (True, True), (False, True), (False, False)):
        drafter = AdaptiveDrafter([Lookup(truth, right=right)], cost_model(per_token=0.1), ledger=ledger)
        drafter.begin(truth[:1], SamplingParams(temperature=1.0, max_new_tokens=100))
        monitor = drafter.members[0].monitor
        assert (monitor.mode is Mode.ON) is starts_on
        context = truth[:1]
        for _ in range(8):
            proposal = drafter.propose(context, 4)
            kept = len(proposal) if right else 0
            context = truth[: len(context) + kept + 1]
            drafter.accept(context, kept)
        drafter.end(context)
        assert ledger.sampled_on["lookup"] is right


class Partly(Lookup):
    """Right at the first token of every other draft, wrong elsewhere: alpha 1/3, below the 0.4 floor."""

    def propose(self, context, max_tokens):
        chain = super().propose(context, max_tokens).token_ids
        return DraftProposal(chain[:1] + [t + 1 for t in chain[1:]] if self.proposed % 2 else [t + 1 for t in chain])


@pytest.mark.parametrize("per_token, stays_on", [(0.02, True), (0.5, False)])
def test_a_lookup_member_is_judged_against_what_its_rows_cost(per_token, stays_on):
    """A look-up's drafting is free: once pass costs are measured it stays on down to the alpha at which one
    drafted token repays its row (c(2) / c(1) - 1, at least 0.05), not the fixed 0.4. Alpha 1/3 pays where
    a row costs 2% of a pass (a CPU's verify), not where it costs half."""
    truth = list(range(100, 300))
    drafter = AdaptiveDrafter([Partly(truth, right=True)], cost_model(per_token=per_token))
    run_script(drafter, truth, 12)
    monitor = drafter.members[0].monitor
    assert (monitor.mode is Mode.ON) is stays_on
    if stays_on:
        assert monitor.sums.alpha() < 0.4 and monitor.sums.steps >= 6


class PartlyModel(Partly):
    """``Partly`` as a model member: its drafting is priced."""

    lookup = False


class Clock:
    """adaptive's time.perf_counter: each reading ``step`` seconds after the last (a propose is timed by two)."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def perf_counter(self) -> float:
        self.now += self.step
        return self.now


def test_a_model_member_is_judged_against_what_its_rows_and_its_drafting_cost(monkeypatch):
    """A model member's floor prices its own seconds a drafted token: (c(2) + seconds) / c(1) - 1. At alpha 1/3,
    2% rows and ~2.5 ms a token against 1 s passes it stays on (the fixed 0.4 switched it off). (Where its
    drafting costs more, its timed steps realize < 1x and switch it off too: pass_cost's own test pins the
    seconds' part of the floor.)"""
    import specdec.drafters.adaptive as adaptive

    monkeypatch.setattr(adaptive, "time", Clock(0.01))
    truth = list(range(100, 300))
    drafter = AdaptiveDrafter([PartlyModel(truth, right=True)], cost_model(per_token=0.02))
    run_script(drafter, truth, 12)
    monitor = drafter.members[0].monitor
    assert monitor.mode is Mode.ON
    assert monitor.sums.alpha() < 0.4 and monitor.sums.steps >= 6


def test_a_greedy_requests_lookup_member_drafts_from_the_first_step():
    truth = list(range(100, 300))
    drafter = AdaptiveDrafter([Lookup(truth, right=True)], cost_model(per_token=0.1))
    drafter.begin(truth[:1], SamplingParams())
    assert drafter.members[0].monitor.mode is Mode.ON
    proposal = drafter.propose(truth[:1], 4)
    assert len(proposal) and proposal.token_ids == truth[1 : 1 + len(proposal)]


def test_a_member_whose_drafting_costs_more_than_it_saves_is_not_asked():
    """Each member is priced by its own measured seconds per propose (a running mean): a right member
    at alpha ~0.6 saves ~0.4 s a token over 1 s plain passes, so 5 s of drafting a step never pays."""
    truth = list(range(100, 300))
    drafter = AdaptiveDrafter([Script("cheap", truth, right=True), Script("dear", truth, right=True)],
                              cost_model(per_token=0.1))
    drafter.begin(truth[:1], SamplingParams(max_new_tokens=100))
    cheap, dear = drafter.members
    dear.draft_seconds = 5.0
    proposal = drafter.propose(truth[:1], 4)
    assert cheap.asked and not dear.asked and proposal.drafter == "cheap"


def test_a_members_draft_verified_alone_is_timed_into_its_monitor():
    """What a member's draft realized when verified alone: the step's drafting plus the verify pass
    at its measured cost, against plain passes for the tokens it committed; its monitor judges that
    speed as it judges alpha (tests/test_monitor.py: below 1x switches off). A draft merged with
    another member's, or not chosen, carries no timing."""
    truth = list(range(100, 300))
    drafter = AdaptiveDrafter([Script("alone", truth, right=True)], cost_model(per_token=0.1))
    drafter.begin(truth[:1], SamplingParams(max_new_tokens=100))
    n = len(drafter.propose(truth[:1], 4))  # (the trie keeps the best 3 of its 4)
    assert n >= 3
    drafter.accept(truth[:2], 0)  # none kept: 1 token for a 1 + 0.1 n s pass
    sums = drafter.members[0].monitor.sums
    assert sums.timed_steps == 1 and sums.plain_seconds == pytest.approx(1.0)
    assert 1.0 + 0.1 * n <= sums.seconds < 1.05 + 0.1 * n and sums.speedup < 1.0
    both = AdaptiveDrafter([Script("a", truth, right=True), Script("b", truth, right=False, k=2)],
                           cost_model(per_token=0.0))
    both.begin(truth[:1], SamplingParams(max_new_tokens=100))
    assert both.propose(truth[:1], 4).drafter == "a+b"
    both.accept(truth[:6], 4)
    assert [m.monitor.sums.timed_steps for m in both.members] == [0, 0]


@pytest.mark.parametrize("right", [False, True])
def test_a_member_that_did_not_pay_in_earlier_requests_starts_the_next_one_off(right):
    """Each request gets a fresh adaptive drafter; the engine's ``Ledger`` pools what members' drafts
    realized: one below 1x in the first request starts the second held off (its back-off carried
    over), one that paid starts it on; ``fresh_after`` requests in a row that timed nothing empty its samples,
    and an emptied ledger starts it on again."""
    truth = list(range(100, 300))
    ledger = AdaptiveDrafter.shared_state(None).value
    first = AdaptiveDrafter([Script("model", truth, right=right)], cost_model(per_token=0.1), ledger=ledger)
    run_script(first, truth, 4)
    first.end(truth[:10])
    assert len(ledger.timed["model"]) >= 3 and (ledger.speedup("model", 3) >= 1.0) is right

    def second_request() -> AdaptiveDrafter:
        drafter = AdaptiveDrafter([Script("model", truth, right=right)], cost_model(per_token=0.1), ledger=ledger)
        drafter.begin(truth[:1], SamplingParams(max_new_tokens=100))
        return drafter

    second = second_request()
    assert (second.members[0].monitor.mode is Mode.ON) is right
    assert bool(len(second.propose(truth[:1], 4))) is right
    if not right:
        assert second.members[0].monitor.backoff == first.members[0].monitor.backoff
    kept = len(ledger.timed["model"])
    for _ in range(ledger.fresh_after - 1):  # requests that timed nothing keep the verdict...
        second.end(truth[:1])
    assert len(ledger.timed["model"]) == kept
    second.end(truth[:1])  # ...until the fresh_after-th in a row empties it
    assert len(ledger.timed["model"]) == 0
    assert second_request().members[0].monitor.mode is Mode.ON


def test_a_datastore_makes_retrieval_a_member():
    assert SpecType.RETRIEVAL not in adaptive_members(SpecConfig())
    members = adaptive_members(SpecConfig(datastore="store.npz", draft_model="m"))
    assert members[-2:] == (SpecType.RETRIEVAL, SpecType.DRAFT_MODEL)
