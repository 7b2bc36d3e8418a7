"""The continuous-batching scheduler without HTTP: draft budget, joining and leaving, failures."""

from __future__ import annotations

import asyncio

import pytest

import specdec.server.scheduler as scheduler_mod
from specdec.budget import DraftBudget
from specdec.config import SamplingParams
from specdec.drafters.base import Drafter
from specdec.llm import LLM
from specdec.server.scheduler import QueueFullError, Scheduler


def test_draft_budget_table():
    budget = DraftBudget(draft_n_max=8, step_tokens=8)
    assert [budget(b) for b in (1, 2, 3, 4, 5, 8, 9, 32)] == [8, 4, 2, 2, 1, 1, 0, 0]
    assert [DraftBudget(8, 16)(b) for b in (1, 2, 4, 8, 16, 17)] == [8, 8, 4, 2, 1, 0]
    assert [DraftBudget(8, 64, max_batch=4)(b) for b in (1, 4, 5)] == [8, 8, 0]
    assert DraftBudget(8, 0)(1) == 0
    with pytest.raises(ValueError):
        DraftBudget(8, -1)


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama), spec="ngram", max_model_len=256, max_num_seqs=4, plan_drafts=False)


async def collect(req) -> tuple[list[list[int]], object]:
    outputs = [[] for _ in req.seqs]
    while True:
        event = await req.queue.get()
        for u in event.updates:
            outputs[u.index].extend(u.token_ids)
        if event.done:
            return outputs, event


def run_requests(llm: LLM, prompts: list[str], budget: DraftBudget, max_tokens: int = 10, **kw):
    """Submit one request per prompt at once; return (outputs, last events, scheduler)."""

    async def main():
        scheduler = Scheduler(llm.engine, llm.runner.num_slots, budget, **kw)
        scheduler.start()
        try:
            loop = asyncio.get_running_loop()
            params = SamplingParams(max_new_tokens=max_tokens)
            reqs = [scheduler.submit(f"r{i}", [llm.new_sequence(llm.encode(p), params)], loop)
                    for i, p in enumerate(prompts)]
            results = await asyncio.gather(*(collect(r) for r in reqs))
            return results, scheduler
        finally:
            await asyncio.to_thread(scheduler.stop)

    return asyncio.run(main())


def test_budget_applied_per_step_and_output_unchanged(llm, monkeypatch):
    prompts = ["a b c a b c a b", "one two one two one", "x y z", "hello hello hello"]
    want = [llm.generate(p, SamplingParams(max_new_tokens=10))[0].token_ids for p in prompts]
    seen = []  # (sequences in the step, draft budget, whether it gave them their first token)
    real_step = llm.engine.step

    def step(seqs, draft_budget=None):
        seen.append((len(seqs), draft_budget, all(s.num_output == 0 for s in seqs)))
        return real_step(seqs, draft_budget)

    monkeypatch.setattr(llm.engine, "step", step)
    budget = DraftBudget(draft_n_max=6, step_tokens=6, max_batch=3)
    results, scheduler = run_requests(llm, prompts, budget)
    assert [out[0] for out, _ in results] == want
    first = [(batch, k) for batch, k, is_first in seen if is_first]
    assert first == [(1, 0)] * len(prompts)  # each request's first token: its own pass, no draft
    assert all(k == budget(batch) for batch, k, is_first in seen if not is_first)
    assert {batch for batch, _, _ in seen} >= {4}  # the four requests ran together
    assert all(event.stats.new_tokens == 10 or event.updates[-1].finish_reason == "stop" for _, event in results)


class FailingDrafter(Drafter):
    name = "failing"

    def propose(self, context, max_tokens):
        raise RuntimeError("drafter exploded")


def test_drafter_failure_fails_only_its_request(llm, monkeypatch):
    # The failing drafter must be asked: dynamic K may skip drafting when passes are timed as dear.
    monkeypatch.setattr(llm.engine, "plan_drafts", False)

    async def main():
        scheduler = Scheduler(llm.engine, llm.runner.num_slots, DraftBudget(4, 16))
        scheduler.start()
        try:
            loop = asyncio.get_running_loop()
            params = SamplingParams(max_new_tokens=6)
            bad = llm.new_sequence(llm.encode("broken"), params)
            bad.drafter = FailingDrafter()
            bad_req = scheduler.submit("bad", [bad], loop)
            good_req = scheduler.submit("good", [llm.new_sequence(llm.encode("fine"), params)], loop)
            return await collect(bad_req), await collect(good_req), scheduler.snapshot()
        finally:
            await asyncio.to_thread(scheduler.stop)

    (_, bad_event), (good_out, good_event), snap = asyncio.run(main())
    assert bad_event.error and "drafter exploded" in bad_event.error
    assert good_event.error is None
    assert good_out[0] == llm.generate("fine", SamplingParams(max_new_tokens=6))[0].token_ids
    assert snap["free_slots"] == 4


def test_queue_bound_and_cancel_while_waiting(llm):
    async def main():
        scheduler = Scheduler(llm.engine, 1, DraftBudget(4, 4), max_queue=1)  # not started: nothing runs
        loop = asyncio.get_running_loop()
        params = SamplingParams(max_new_tokens=2)
        first = scheduler.submit("a", [llm.new_sequence(llm.encode("a"), params)], loop)
        scheduler.submit("b", [llm.new_sequence(llm.encode("b"), params)], loop)
        with pytest.raises(QueueFullError):
            scheduler.submit("c", [llm.new_sequence(llm.encode("c"), params)], loop)
        scheduler.cancel(first)
        scheduler.start()
        try:
            event = await first.queue.get()
            assert event.done and event.status == 499
            for _ in range(100):
                if scheduler.snapshot()["waiting_requests"] == 0 and scheduler.snapshot()["free_slots"] == 1:
                    break
                await asyncio.sleep(0.02)
            return scheduler.snapshot()
        finally:
            await asyncio.to_thread(scheduler.stop)

    snap = asyncio.run(main())
    assert snap["waiting_requests"] == 0 and snap["free_slots"] == 1


class AlwaysDrafter(Drafter):
    """Proposes as many tokens as allowed (all wrong or right, it does not matter)."""

    name = "always"

    def propose(self, context, max_tokens):
        from specdec.drafters.base import DraftProposal

        return DraftProposal([5] * max_tokens)


def test_drafting_never_pushes_a_neighbour_past_the_context(llm):
    """A sequence near the end of the context shares a pass with one that drafts the full K."""
    long_prompt = [7] * (llm.runner.max_seq_len - 3)

    async def main():
        scheduler = Scheduler(llm.engine, llm.runner.num_slots, DraftBudget(6, 64))
        loop = asyncio.get_running_loop()
        params = SamplingParams(max_new_tokens=8)
        near_end = scheduler.submit("end", [llm.new_sequence(long_prompt, params)], loop)
        drafty = llm.new_sequence(llm.encode("short"), params)
        drafty.drafter = AlwaysDrafter()
        busy = scheduler.submit("drafty", [drafty], loop)
        scheduler.start()  # both are admitted in the same turn and share every pass
        try:
            return await collect(near_end), await collect(busy)
        finally:
            await asyncio.to_thread(scheduler.stop)

    (_, end_event), (_, busy_event) = asyncio.run(main())
    assert end_event.error is None and busy_event.error is None
    assert busy_event.stats.drafted > 0


def test_a_request_arriving_mid_speculation_gets_its_first_token_in_one_turn(llm, monkeypatch):
    """Time to first token must not pay for speculation: a request that arrives while another
    decodes with drafts gets its first token in the next turn, from its prefill and one pass of
    its own row without a draft, while the running request goes on drafting in that turn."""
    monkeypatch.setattr(llm.engine, "plan_drafts", False)  # draft whatever the budget allows

    async def main():
        scheduler = Scheduler(llm.engine, llm.runner.num_slots, DraftBudget(4, 16))  # unstarted: driven by hand
        loop = asyncio.get_running_loop()
        busy_seq = llm.new_sequence(llm.encode("x"), SamplingParams(max_new_tokens=200, ignore_eos=True))
        busy_seq.drafter = AlwaysDrafter()
        busy = scheduler.submit("busy", [busy_seq], loop)
        for _ in range(3):
            scheduler.run_turn()
        await asyncio.sleep(0)  # let the loop deliver the events
        while not busy.queue.empty():
            busy.queue.get_nowait()
        new = scheduler.submit("new", [llm.new_sequence(llm.encode("a b c a b c a b"), SamplingParams())], loop)
        steps_before = scheduler.num_steps
        scheduler.run_turn()
        await asyncio.sleep(0)
        new_events = [new.queue.get_nowait() for _ in range(new.queue.qsize())]
        busy_events = [busy.queue.get_nowait() for _ in range(busy.queue.qsize())]
        return new_events, busy_events, scheduler.num_steps - steps_before

    new_events, busy_events, steps = asyncio.run(main())
    first = new_events[0].updates[0]
    assert len(first.token_ids) == 1
    assert first.step.num_drafted == 0 and first.step.pass_rows == 1  # its own row, nothing drafted
    assert steps == 2  # its first-token pass, then the batch's step
    assert len(new_events) == 2  # the batch's step in the same turn served it too
    assert [u.step.num_drafted for e in busy_events for u in e.updates] == [4]  # busy kept drafting


@pytest.mark.parametrize("seconds", [0.0, -1.0, float("inf"), float("nan")])
def test_prefill_seconds_must_be_a_finite_positive_number(llm, seconds):
    with pytest.raises(ValueError, match="prefill_seconds"):
        Scheduler(llm.engine, 1, DraftBudget(0), prefill_seconds=seconds)


@pytest.mark.parametrize(("quantization", "prefill_seconds"), [(None, None), ("q8_0", None), (None, 1e-9),
                                                            ("q8_0", 1e-9)])
def test_a_long_prompt_is_prefilled_in_chunks_between_other_requests_steps(tiny_llama, monkeypatch, quantization,
                                                                           prefill_seconds):
    """A 1300-token prompt joins a running request: it is cached in chunks of 512 tokens, and the running request
    decodes one step between them (it waited for the whole prefill before); the long request's greedy output is
    that of offline generation. With ``prefill_seconds``, over GGUF blocks (a prompt's bits the same in any chunks),
    the chunks after the first timed one are what that fits (here the least, patched to 100 tokens); float weights
    (BLAS: a row's bits depend on its pass) keep 512."""
    monkeypatch.setattr(scheduler_mod, "MIN_PREFILL_CHUNK", 100)
    llm = LLM(str(tiny_llama), spec="none", max_model_len=2048, max_num_seqs=2, quantization=quantization)
    long_prompt = [1000 + (i * 7) % 3000 for i in range(1300)]
    want = llm.generate([long_prompt], SamplingParams(max_new_tokens=4))[0].token_ids
    llm.forget_prefixes()  # over GGUF blocks its freed slot would serve the whole prompt again
    passes: list[int] = []
    real_run = llm.runner.run

    def run(inputs, *args, **kwargs):
        passes.append(sum(len(i.token_ids) for i in inputs))
        return real_run(inputs, *args, **kwargs)

    monkeypatch.setattr(llm.runner, "run", run)
    events: list[tuple[str, int]] = []

    async def main():
        sched = Scheduler(llm.engine, 2, DraftBudget(0), prefill_seconds=prefill_seconds)  # driven turn by turn
        loop = asyncio.get_running_loop()
        params = SamplingParams(max_new_tokens=40, ignore_eos=True)
        short = sched.submit("short", [llm.new_sequence(llm.encode("Go on:"), params)], loop)
        sched.run_turn()  # the short request: prefilled, first token, one step
        long = sched.submit("long", [llm.new_sequence(long_prompt, SamplingParams(max_new_tokens=4))], loop)
        passes.clear()
        for turn in range(3):
            sched.run_turn()
            await asyncio.sleep(0)  # deliver the turn's events
            for name, req in (("short", short), ("long", long)):
                while not req.queue.empty():
                    events.append((name, turn))
                    req.queue.get_nowait()
        while not long.done:
            sched.run_turn()
        return long

    long = asyncio.run(main())
    later = 100 if quantization and prefill_seconds else 512
    assert passes[:2] == [512, 1] and passes[2:4] == [later, 1]  # a chunk, then the short one's step
    assert sorted({t for name, t in events if name == "short"}) == [0, 1, 2]  # it decoded every turn
    assert long.seqs[0].output_ids == want
