"""Logprobs: the raw target distribution at each token's position, for output and prompt tokens."""

from __future__ import annotations

import pytest
import torch

from specdec.config import SamplingParams
from specdec.llm import LLM
from specdec.logprobs import token_logprobs
from specdec.runners.base import SeqInput


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
