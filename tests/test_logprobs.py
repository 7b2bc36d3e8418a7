"""Logprobs at each token's position, for output and prompt tokens: raw by default, or vLLM's other modes."""

from __future__ import annotations

import pytest
import torch

from specdec.config import SamplingParams
from specdec.llm import LLM
from specdec.logprobs import JSON_LOGPROB_FLOOR, LogprobsMode, json_logprob, output_logprobs, token_logprobs
from specdec.runners.base import SeqInput
from specdec.sampling import probs_from_logits
from specdec.tree import DraftTree


def test_token_logprobs_values_ranks_and_top():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 3.0, 1.0]])
    out = token_logprobs(logits, [1, 2], k=2)
    expected = torch.log_softmax(logits, dim=-1)
    assert [t.token_id for t in out] == [1, 2]
    assert out[0].logprob == float(expected[0, 1]) and out[0].rank == 2
    assert out[1].rank == 1
    assert [tok for tok, _ in out[0].top] == [0, 1] and out[0].top[0][1] == float(expected[0, 0])
    assert token_logprobs(logits, [3, 3], k=0)[1].top == ()
    assert token_logprobs(logits, [], k=3) == []


@pytest.fixture(scope="module")
def tiny(tiny_llama) -> LLM:
    return LLM(str(tiny_llama), max_model_len=256)


def test_output_and_prompt_logprobs_match_a_full_forward(tiny):
    prompt = [5, 6, 7, 8, 9, 10]
    out = tiny.generate(prompt, SamplingParams(max_new_tokens=6, ignore_eos=True, logprobs=3, prompt_logprobs=2))[0]
    choice = out.choices[0]
    assert len(choice.logprobs) == 6 and len(out.prompt_logprobs) == len(prompt)
    assert out.prompt_logprobs[0] is None
    slot = tiny.runner.allocate()
    try:
        logits = tiny.runner.run([SeqInput(slot, [*prompt, *choice.token_ids])]).logits[0]
    finally:
        tiny.runner.free(slot)
    ref = torch.log_softmax(logits.float(), dim=-1)
    all_ids = [*prompt, *choice.token_ids]
    for pos in range(1, len(all_ids)):
        got = out.prompt_logprobs[pos] if pos < len(prompt) else choice.logprobs[pos - len(prompt)]
        assert got.token_id == all_ids[pos]
        assert abs(got.logprob - float(ref[pos - 1, all_ids[pos]])) < 1e-4
        assert got.top[0][0] == int(ref[pos - 1].argmax())
    assert all(t.rank == 1 for t in choice.logprobs)  # greedy picks the raw argmax (no processors)


def test_logprobs_off_by_default_and_streamed(tiny):
    assert tiny.generate([5, 6], SamplingParams(max_new_tokens=3))[0].choices[0].logprobs is None
    events = list(tiny.stream([5, 6], SamplingParams(max_new_tokens=4, ignore_eos=True, logprobs=0)))
    streamed = [lp for e in events for lp in e.logprobs]
    assert [lp.token_id for lp in streamed] == [t for e in events for t in e.token_ids]


@pytest.mark.parametrize("value", [-1, 21])
def test_logprobs_out_of_range_is_refused(value):
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=value)


# -- vLLM's logprobs modes ---------------------------------------------------------------------------
def test_output_logprobs_in_each_mode():
    raw = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.5, 3.0, 1.0]])
    processed = raw.clone()
    processed[:, 0] -= 5.0  # a penalty on token 0
    ids = [1, 2]
    greedy = SamplingParams(logprobs=2)
    lp = output_logprobs(raw, processed, ids, greedy, LogprobsMode.RAW_LOGPROBS)
    assert [t.logprob for t in lp] == torch.log_softmax(raw, -1).gather(1, torch.tensor([[1], [2]]))[:, 0].tolist()
    logits = output_logprobs(raw, processed, ids, greedy, LogprobsMode.RAW_LOGITS)
    assert [t.logprob for t in logits] == [1.0, 3.0] and logits[0].rank == 2 and logits[0].top[0] == (0, 2.0)
    done = output_logprobs(raw, processed, ids, greedy, LogprobsMode.PROCESSED_LOGPROBS)
    assert done[0].rank == 1 and done[0].logprob == float(torch.log_softmax(processed, -1)[0, 1])
    assert output_logprobs(raw, processed, ids, greedy, LogprobsMode.PROCESSED_LOGITS)[0].top[0] == (1, 1.0)
    # Sampling: temperature applied, tokens top-k drops at -inf (in JSON: vLLM's floor).
    sampled = SamplingParams(temperature=0.5, top_k=2, logprobs=3)
    out = output_logprobs(raw, processed, ids, sampled, LogprobsMode.PROCESSED_LOGITS)
    assert out[1].logprob == 6.0 and out[1].top[2][1] == float("-inf")
    out = output_logprobs(raw, processed, ids, sampled, LogprobsMode.PROCESSED_LOGPROBS)
    kept = torch.tensor([1.0, 0.0]) / 0.5  # row 0 keeps tokens 1 and 2
    assert abs(out[0].logprob - float(torch.log_softmax(kept, -1)[0])) < 1e-6
    assert json_logprob(out[0].top[2][1]) == JSON_LOGPROB_FLOOR and json_logprob(-1.5) == -1.5


def test_processed_logprobs_are_the_distribution_sampled_from_under_speculation(tiny_llama):
    """Sampled with penalties, top-k and a drafter: each entry is log p of the processed distribution
    at its position, recomputed here from a full forward pass (tokens top-k drops at -inf)."""
    llm = LLM(str(tiny_llama), spec="ngram", max_model_len=256, logprobs_mode="processed_logprobs",
              plan_drafts=False)
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    params = SamplingParams(max_new_tokens=10, ignore_eos=True, temperature=0.8, top_k=4, seed=3, logprobs=5,
                            presence_penalty=1.0, repetition_penalty=1.3)
    out = llm.generate(prompt, params)[0]
    choice = out.choices[0]
    assert out.stats.drafted > 0  # verify passes with drafts scored some of the tokens
    slot = llm.runner.allocate()
    try:
        logits = llm.runner.run([SeqInput(slot, [*prompt, *choice.token_ids])]).logits[0]
    finally:
        llm.runner.free(slot)
    procs = llm.processors(prompt, params)
    for i, (tok, entry) in enumerate(zip(choice.token_ids, choice.logprobs, strict=True)):
        tokens = [*prompt, *choice.token_ids[:i]]
        row = logits[len(tokens) - 1 : len(tokens)]
        p = probs_from_logits(procs.apply(row, DraftTree.chain(tokens[-1], []), tokens), params)[0]
        procs.advance([tok])
        assert entry.token_id == tok and abs(entry.logprob - float(torch.log(p[tok]))) < 1e-5
        assert entry.logprob != float(torch.log_softmax(row.float(), -1)[0, tok])  # not the raw one
        assert [t for t, _ in entry.top[:4]] == torch.topk(p, 4).indices.tolist()
        assert entry.top[4][1] == float("-inf")  # top_k=4: the fifth is out


def test_unknown_logprobs_mode_is_refused(tiny_llama):
    with pytest.raises(ValueError, match="unknown logprobs mode 'sampled'; choose from: raw_logprobs"):
        LLM(str(tiny_llama), max_model_len=64, logprobs_mode="sampled")


# -- max_new_tokens 0: scoring a prompt (what echo with max_tokens 0 serves) --------------------------
def test_scoring_a_prompt_generates_nothing(tiny):
    prompt = [5, 6, 7, 8, 9, 10]
    scored = tiny.generate(prompt, SamplingParams(max_new_tokens=0, prompt_logprobs=2, logprobs=1))[0]
    assert scored.choices[0].token_ids == [] and scored.choices[0].text == ""
    assert scored.choices[0].finish_reason == "length" and scored.choices[0].logprobs == []
    full = tiny.generate(prompt, SamplingParams(max_new_tokens=3, prompt_logprobs=2))[0]
    assert scored.prompt_logprobs == full.prompt_logprobs and len(scored.prompt_logprobs) == len(prompt)
    assert scored.stats.new_tokens == 0 and scored.stats.target_forwards == 1  # the prefill alone
    events = list(tiny.stream(prompt, SamplingParams(max_new_tokens=0, prompt_logprobs=0)))
    assert len(events) == 1 and events[0].finished and events[0].token_ids == [] and events[0].stats is not None
    one = tiny.generate([7], SamplingParams(max_new_tokens=0, prompt_logprobs=1))[0]  # nothing to prefill
    assert one.prompt_logprobs == [None] and one.choices[0].finish_reason == "length"


@pytest.mark.parametrize("kw", [dict(max_new_tokens=0), dict(max_new_tokens=-1, prompt_logprobs=1)])
def test_max_new_tokens_zero_needs_prompt_logprobs(kw):
    with pytest.raises(ValueError, match=r"max_new_tokens must be >= 1 \(0 only with prompt_logprobs"):
        SamplingParams(**kw)
