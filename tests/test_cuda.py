"""CUDA: the torch backend on a GPU (skipped without one; scripts/gpu_check.sh runs these)."""

from __future__ import annotations

import pytest
import torch

from specdec.config import SamplingParams, SpecConfig, SpecType, StructuredKind, StructuredOutput
from specdec.llm import LLM
from specdec.runners.base import SeqInput
from specdec.runners.load import load_runner

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")]


def test_cuda_logits_match_cpu(tiny_model_factory):
    folder = str(tiny_model_factory("qwen3"))
    ids = list(range(100, 140))
    cpu, _ = load_runner(folder, max_seq_len=128, device="cpu", backend="torch")
    gpu, _ = load_runner(folder, max_seq_len=128, device="cuda")
    assert gpu.backend == "torch"
    logits = []
    for runner in (cpu, gpu):
        slot = runner.allocate()
        runner.run([SeqInput(slot, ids[:30], all_logits=False)])
        logits.append(runner.run([SeqInput(slot, ids[30:])]).logits[0].cpu())
    assert torch.allclose(logits[0], logits[1], atol=1e-3)


def test_cuda_speculation_matches_plain_greedy(tiny_model_factory):
    folder = str(tiny_model_factory("llama"))
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    prompt = "a b c a b c a b c a b"
    plain = LLM(folder, device="cuda", spec="none").generate(prompt, params)[0].token_ids
    for spec in ("ngram", "adaptive"):
        fast = LLM(folder, device="cuda", spec=spec, plan_drafts=False).generate(prompt, params)[0]
        assert fast.token_ids == plain, spec
        assert fast.stats.drafted > 0, spec


def test_cuda_processors_grammars_and_logprobs_keep_speculation_lossless(tiny_model_factory):
    # Penalties, logit bias, a grammar's mask and logprobs meet the verify rows on the GPU (the processors'
    # state lives on the CPU). Suffix drafts the penalised cycle; under the grammar the target drafts for
    # itself (the grammar cuts what it cannot produce).
    folder = str(tiny_model_factory("llama", seed=2, bigram=True))
    prompt = "a b c a b c a b c a b"
    cases = [("suffix", dict(logit_bias={10: 20.0, 11: 20.0, 12: 20.0}, frequency_penalty=0.9, presence_penalty=0.5,
                             repetition_penalty=1.2, min_tokens=12, bad_words=("the",))),
             (SpecConfig(types=(SpecType.DRAFT_MODEL,), draft_model=folder),
              dict(structured=StructuredOutput(StructuredKind.REGEX, r"[a-z]{2,6}( [a-z]{2,6}){3,12}\.")))]
    for spec, case in cases:
        params = SamplingParams(max_new_tokens=24, logprobs=2, **case)
        plain = LLM(folder, device="cuda", spec="none").generate(prompt, params)[0]
        fast = LLM(folder, device="cuda", spec=spec, plan_drafts=False).generate(prompt, params)[0]
        assert fast.token_ids == plain.token_ids, case
        assert len(fast.choices[0].logprobs) == len(fast.token_ids), case
        assert fast.stats.accepted > 0, case
