"""The engine's one draft -> verify -> commit loop: what each step reports, stops and the stats it keeps.

Losslessness per drafter is tests/test_lossless.py's; this file pins the loop itself on the tiny
random Llama: plain decoding is the step with an empty draft, a rejection costs one truncate and no
extra pass, max_new_tokens cuts inside an accepted draft, and SpecStats adds up the StepResults.
"""

from __future__ import annotations

import pytest

from specdec.engine import Engine, SequenceState, StepResult
from specdec.llm import LLM
from tests.test_lossless import ReplayDrafter, greedy

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
    assert st.target_forwards == 1 + st.decode_passes  # prefill, then one pass per decode step
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
    assert st.target_forwards == 1 + st.decode_passes  # no pass beyond one per step


def test_max_new_tokens_cuts_inside_an_accepted_draft(tiny, reference):
    engine = Engine(tiny.runner, draft_n_max=8, plan_drafts=False)
    seq = SequenceState(PROMPT, greedy(5), drafter=ReplayDrafter(reference, len(PROMPT), wrong_at=99))
    steps = steps_of(engine, seq)
    assert seq.output_ids == reference[:5]
    assert seq.finish_reason == "length" and steps[-1].finish_reason == "length"
    assert seq.stats.new_tokens == 5
