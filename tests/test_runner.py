"""Native runner: logits parity with transformers, batching, rollback, trees."""

from __future__ import annotations

import pytest
import torch

from specdec.runner import SeqInput, load_runner
from tests.conftest import TINY_CONFIGS


def hf_logits(folder, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("arch", list(TINY_CONFIGS))
def test_logits_match_transformers_on_tiny_models(tiny_model_factory, arch):
    folder = tiny_model_factory(arch)
    ids = list(range(100, 130))
    ref = hf_logits(folder, ids)
    runner, _ = load_runner(str(folder), max_seq_len=256)
    slot = runner.allocate()
    # prefill 20 tokens, then a 10-token chain pass: both must match the full forward
    first = runner.run([SeqInput(slot, ids[:20])]).logits[0]
    rest = runner.run([SeqInput(slot, ids[20:])]).logits[0]
    ours = torch.cat([first, rest])
    assert (ours - ref).abs().max() < 1e-4 * max(1.0, ref.abs().max().item())

