"""CUDA: the torch backend on a GPU (skipped without one; scripts/gpu_check.sh runs these)."""

from __future__ import annotations

import pytest
import torch

from specdec.config import SamplingParams
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
        fast = LLM(folder, device="cuda", spec=spec).generate(prompt, params)[0].token_ids
        assert fast == plain, spec
