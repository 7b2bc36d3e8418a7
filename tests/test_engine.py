"""The engine's one draft -> verify -> commit loop: what each step reports, stops and the stats it keeps.

Losslessness per drafter is tests/test_lossless.py's; this file pins the loop itself on the tiny
random Llama: plain decoding is the step with an empty draft, a rejection costs one truncate and no
extra pass, max_new_tokens cuts inside an accepted draft, and SpecStats adds up the StepResults.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from specdec.config import SamplingParams
from specdec.drafters.base import DraftProposal
from specdec.engine import Engine, SequenceState, StepResult
from specdec.llm import LLM
from tests.test_lossless import ReplayDrafter, greedy
from tests.test_pass_cost import FixedCost

PROMPT = [5, 17, 300, 42, 17, 300, 42, 99]


@pytest.fixture(scope="module")
def tiny(tiny_llama) -> LLM:
    return LLM(str(tiny_llama), max_model_len=256)


def steps_of(engine: Engine, seq: SequenceState) -> list[StepResult]:
    return list(engine.generate(seq))


@pytest.fixture(scope="module")
def reference(tiny) -> list[int]:
    seq = SequenceState(PROMPT, greedy(24))
    steps_of(Engine(tiny.runner), seq)
    return seq.output_ids


def test_plain_decoding_is_one_token_a_step_with_an_empty_draft(tiny, reference):
    seq = SequenceState(PROMPT, greedy(24))
    steps = steps_of(Engine(tiny.runner), seq)
    assert seq.output_ids == reference and len(reference) == 24
    decode_steps = [s for s in steps if s.pass_rows]
    assert all(s.num_drafted == 0 and s.drafter is None and not s.origins for s in steps)
    assert all(len(s.token_ids) == 1 for s in decode_steps)
    st = seq.stats
    assert (st.drafted, st.accepted, st.drafts) == (0, 0, 0)
    # prefill (none where the reference left the prompt cached in the slot), then one pass per decode step
    prefilled = st.cached_prompt_tokens < len(PROMPT) - 1
    assert st.target_forwards == prefilled + st.decode_passes
    assert st.mean_accepted_len == pytest.approx(1.0)
    assert seq.finish_reason == "length"


@pytest.mark.parametrize("wrong_at", [0, 2, 5])
def test_a_rejection_costs_a_truncate_and_the_stats_add_up(tiny, reference, wrong_at):
    engine = Engine(tiny.runner, draft_n_max=6, plan_drafts=False)
    seq = SequenceState(PROMPT, greedy(24), drafter=ReplayDrafter(reference, len(PROMPT), wrong_at))
    steps = steps_of(engine, seq)
    assert seq.output_ids == reference  # the corrupted token never survives
    drafted = [s for s in steps if s.num_drafted]
    assert drafted, "the replay drafter must have drafted"
    for s in drafted:
        assert s.num_accepted <= wrong_at  # nothing past the corrupted token is kept
        assert len(s.token_ids) <= s.num_accepted + 1  # accepted, then one recovered or bonus token
        if s.num_accepted < s.num_drafted and s.finish_reason is None:
            assert s.rejected_ids  # the turned-down part is reported, not silently dropped
    st = seq.stats
    assert st.drafted == sum(s.num_drafted for s in steps)
    assert st.accepted == sum(s.num_accepted for s in steps)
    assert st.new_tokens == sum(len(s.token_ids) for s in steps) == len(reference)
    assert st.decode_tokens == st.decode_passes * st.mean_accepted_len
    assert st.target_forwards == (st.cached_prompt_tokens < len(PROMPT) - 1) + st.decode_passes  # one a step


def test_a_freed_slot_serves_the_next_prompt_that_starts_the_same(tiny_llama, tiny):
    """Over quantized blocks the fused runner's K/V of a token are the same bits whichever pass wrote them, so
    a freed slot keeps its tokens' entries and the next request that starts with them prefills only the rest
    (llama-server's prompt cache, vLLM's prefix caching): a second turn re-reads nothing of the first. The
    output and its logprobs are those a cold slot gives; a request that wants its prompt's logprobs runs every
    prompt token. Float weights keep nothing: their long prompts go to BLAS, whose bits depend on the pass."""
    assert not tiny.runner.keeps_prefixes
    runner = LLM(str(tiny_llama), max_model_len=256, quantization="q8_0").runner
    assert runner.keeps_prefixes
    engine = Engine(runner)

    def generate(prompt, **params):
        seq = SequenceState(prompt, SamplingParams(max_new_tokens=8, ignore_eos=True, **params))
        steps_of(engine, seq)
        return seq

    runner.forget_prefixes()
    first = generate(PROMPT)
    second_turn = [*first.tokens, 7, 8, 9]
    runner.forget_prefixes()
    cold = generate(second_turn, logprobs=2)
    assert cold.stats.cached_prompt_tokens == 0
    generate(PROMPT)
    warm = generate(second_turn, logprobs=2)
    assert warm.stats.cached_prompt_tokens == len(first.tokens) - 1  # all it cached (the last token: no pass)
    assert warm.output_ids == cold.output_ids and warm.logprobs == cold.logprobs
    other = generate(PROMPT[:5] + [11, 12, 13])
    assert other.stats.cached_prompt_tokens == 5
    generate(PROMPT)
    scored = generate(PROMPT, prompt_logprobs=1)
    assert scored.stats.cached_prompt_tokens == 0 and len(scored.prompt_logprobs) == len(PROMPT)


def test_max_new_tokens_cuts_inside_an_accepted_draft(tiny, reference):
    engine = Engine(tiny.runner, draft_n_max=8, plan_drafts=False)
    seq = SequenceState(PROMPT, greedy(5), drafter=ReplayDrafter(reference, len(PROMPT), wrong_at=99))
    steps = steps_of(engine, seq)
    assert seq.output_ids == reference[:5]
    assert seq.finish_reason == "length" and steps[-1].finish_reason == "length"
    assert seq.stats.new_tokens == 5


class SelfSwitching(ReplayDrafter):
    """Always wrong at its first token; says it switches itself off (as adaptive does with its members)."""

    switches_itself = True


@pytest.mark.parametrize("switches_itself", [False, True])
def test_the_sequence_monitor_holds_off_only_drafters_that_do_not_switch_themselves(tiny, reference, monkeypatch,
                                                                                   switches_itself):
    """A drafter whose first token is always wrong is held off by the sequence's monitor (alpha 0); one that
    switches its own members is left to do so: a second switch, with its own floor and one-miss probes, held
    adaptive off at T=0.7 where its members' drafts paid. (Pass costs fixed, a row at 2% of a pass: the
    planner keeps drafting whatever the machine's load.)"""
    monkeypatch.setattr(tiny.runner, "pass_cost", FixedCost({t: 1.0 + 0.02 * (t - 1) for t in (1, 2, 3, 4)}))
    kind = SelfSwitching if switches_itself else ReplayDrafter
    seq = SequenceState(PROMPT, greedy(24), drafter=kind(reference, len(PROMPT), wrong_at=0))
    steps_of(Engine(tiny.runner, draft_n_max=2), seq)
    assert seq.output_ids == reference and seq.stats.drafted >= 3  # it drafted, and nothing wrong survived
    if switches_itself:
        assert seq.monitor.mode.value == "on" and seq.stats.spec_off_steps == 0 and seq.monitor.sums.steps >= 3
    else:
        assert seq.stats.spec_off_steps > 0


class RightEveryFourth(ReplayDrafter):
    """One token a step, right in every fourth: alpha 0.25."""

    def propose(self, context, max_tokens):
        done = len(context) - self.prompt_len
        true = self.reference[done : done + 1]
        if not true or done % 4 == 0:
            return DraftProposal(true)
        return DraftProposal([(true[0] + 1) % 49152])


@pytest.mark.parametrize("row_cost, stays_on", [(0.02, True), (0.5, False)])
def test_the_sequence_monitor_judges_alpha_against_what_a_drafted_row_costs(tiny, reference, monkeypatch,
                                                                            row_cost, stays_on):
    """Alpha 0.25 repays a row that costs 2% of a pass (a CPU's verify of one more token), not one that costs
    half: the floor is c(2) / c(1) - 1 (at least 0.05) with drafting free, not a fixed 0.4."""
    monkeypatch.setattr(tiny.runner, "pass_cost", FixedCost({t: 1.0 + row_cost * (t - 1) for t in (1, 2, 3, 4)}))
    seq = SequenceState(PROMPT, greedy(24), drafter=RightEveryFourth(reference, len(PROMPT), wrong_at=0))
    steps_of(Engine(tiny.runner, draft_n_max=1), seq)
    assert seq.output_ids == reference and seq.stats.drafted >= 3
    assert (seq.stats.spec_off_steps == 0) is stays_on


def test_warmup_freezes_the_loaded_heap_out_of_the_collector(tiny_llama):
    """A full collection scanned every object of a loaded model (SmolLM2-135M: ~760K, 0.3-0.4 s a pause);
    after ``warmup`` the collector skips what was loaded, and what is made later is collected as before."""
    llm = LLM(str(tiny_llama), max_model_len=64)
    assert any(o is llm.runner for o in gc.get_objects())
    llm.warmup()
    assert gc.get_freeze_count() > 0
    assert not any(o is llm.runner for o in gc.get_objects())

    class Node:
        pass

    node = Node()
    node.me = node  # a cycle made after the freeze: only the collector frees it
    gone = weakref.ref(node)
    del node
    gc.collect()
    assert gone() is None
