"""Native runner: logits parity with transformers, batching, rollback, trees."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.model.kernels import as_numpy, few_rows_matmul
from specdec.runner import SeqInput, load_runner
from tests.conftest import TINY_CONFIGS


def hf_logits(folder, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("matmul", ["numpy", "torch"])
@pytest.mark.parametrize("arch", list(TINY_CONFIGS))
def test_logits_match_transformers_on_tiny_models(tiny_model_factory, arch, matmul):
    folder = tiny_model_factory(arch)
    ids = list(range(100, 130))
    ref = hf_logits(folder, ids)
    runner, _ = load_runner(str(folder), max_seq_len=256, matmul=matmul)
    slot = runner.allocate()
    # prefill 20 tokens, then a 10-token chain pass: both must match the full forward
    first = runner.run([SeqInput(slot, ids[:20])]).logits[0]
    rest = runner.run([SeqInput(slot, ids[20:])]).logits[0]
    ours = torch.cat([first, rest])
    assert (ours - ref).abs().max() < 1e-4 * max(1.0, ref.abs().max().item())



def test_default_model_logits_match_transformers(default_model_folder):
    ids = [1, 504, 3458, 282, 4649, 314, 216, 1035, 30, 2365, 17, 28, 29]
    ref = hf_logits(default_model_folder, ids)
    runner, _ = load_runner(None, max_seq_len=128)
    slot = runner.allocate()
    ours = torch.cat([runner.run([SeqInput(slot, ids[:8])]).logits[0]] +
                     [runner.run([SeqInput(slot, [t])]).logits[0] for t in ids[8:]])
    assert (ours - ref).abs().max() < 1e-3


def test_few_rows_matmul_matches_blas():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((10, 37), dtype=np.float32)  # 10 rows: two blocks of 4 and a tail of 2
    w_bf16 = torch.from_numpy(w).bfloat16()
    for m in (1, 3, 16):
        x = rng.standard_normal((m, 37), dtype=np.float32)
        out = np.empty((m, 10), dtype=np.float32)
        few_rows_matmul(w, x, out)
        np.testing.assert_allclose(out, x @ w.T, rtol=1e-5, atol=1e-5)
        few_rows_matmul(as_numpy(w_bf16), x, out)  # bfloat16 bits
        np.testing.assert_allclose(out, x @ w_bf16.float().numpy().T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", list(TINY_CONFIGS))
def test_verify_rows_are_bit_identical_to_decoding_alone(tiny_model_factory, arch, dtype):
    """CPU kernels: a token's logits in a chain, tree or batched pass have the same bits as
    when it is decoded alone, so greedy speculation cannot differ from plain decoding."""
    runner, _ = load_runner(str(tiny_model_factory(arch)), dtype=dtype, max_seq_len=256, num_slots=2,
                            matmul="numpy")
    draft = [7, 300, 41, 5, 999, 12, 64, 8]

    def alone(slot: int, tokens: list[int]) -> torch.Tensor:
        start = runner.lengths[slot]
        rows = [runner.run([SeqInput(slot, [t])]).logits[0][0] for t in tokens]
        runner.commit(slot, start, [])
        return torch.stack(rows)

    a, b = runner.allocate(), runner.allocate()
    runner.run([SeqInput(a, list(range(100, 140)), all_logits=False)])
    runner.run([SeqInput(b, list(range(500, 517)), all_logits=False)])
    start_a, start_b = runner.lengths[a], runner.lengths[b]
    chain = runner.run([SeqInput(a, draft)]).logits[0]
    runner.commit(a, start_a, [])
    assert torch.equal(chain, alone(a, draft))
    # tree root -> {7 -> 41, 300 -> 5}: node 4 (5) sees root and 300 only
    tree = runner.run([SeqInput(a, [draft[0], 7, 300, 41, 5], [-1, 0, 0, 1, 2])]).logits[0]
    runner.commit(a, start_a, [])
    assert torch.equal(tree[[0, 2, 4]], alone(a, [draft[0], 300, 5]))
    batched = runner.run([SeqInput(a, draft[:3]), SeqInput(b, draft[:6])]).logits
    runner.commit(a, start_a, [])
    runner.commit(b, start_b, [])
    assert torch.equal(batched[0], alone(a, draft[:3]))
    assert torch.equal(batched[1], alone(b, draft[:6]))


def test_batch_of_different_lengths_matches_single_sequences(tiny_llama):
    runner, _ = load_runner(str(tiny_llama), max_seq_len=128, num_slots=3)
    prompts = [list(range(50, 61)), list(range(70, 74)), list(range(90, 97))]
    steps = [[5, 6, 7], [8], [9, 10]]  # different widths in one pass: rows are padded
    single = []
    for p, s in zip(prompts, steps, strict=True):
        slot = runner.allocate()
        runner.run([SeqInput(slot, p)])
        single.append(runner.run([SeqInput(slot, s)]).logits[0])
        runner.free(slot)
    slots = [runner.allocate() for _ in prompts]
    runner.run([SeqInput(sl, p, all_logits=False) for sl, p in zip(slots, prompts, strict=True)])
    batched = runner.run([SeqInput(sl, s) for sl, s in zip(slots, steps, strict=True)]).logits
    for a, b in zip(single, batched, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_tree_pass_then_compaction_equals_fresh_forward(tiny_llama):
    runner, _ = load_runner(str(tiny_llama), max_seq_len=128)
    prompt = list(range(200, 212))
    slot = runner.allocate()
    runner.run([SeqInput(slot, prompt[:-1])])
    # root -> {a -> b, c -> d -> e}; keep the path root, c, d
    tokens, parents = [prompt[-1], 31, 32, 33, 34, 35], [-1, 0, 1, 0, 3, 4]
    tree_logits = runner.run([SeqInput(slot, tokens, parents)]).logits[0]
    fresh = hf_logits(tiny_llama, [*prompt, 33, 34, 35])
    for node, row in ((0, -4), (3, -3), (4, -2), (5, -1)):  # each node sees only its ancestors
        assert torch.allclose(tree_logits[node], fresh[row], atol=1e-4)
    runner.commit(slot, len(prompt) - 1, [0, 3, 4])
    after = runner.run([SeqInput(slot, [35])]).logits[0][0]
    assert torch.allclose(after, fresh[-1], atol=1e-4)  # compacted KV == a fresh forward


def test_generic_runner_for_other_architectures(tiny_model_factory, tmp_path, default_model_folder):
    """A GPT-2 model is not native: the generic runner serves it, chains only, still exact."""
    import shutil

    from transformers import GPT2Config, GPT2LMHeadModel

    from specdec.config import SamplingParams
    from specdec.engine import Engine, Sequence
    from specdec.generic_runner import GenericRunner

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=49152, n_embd=32, n_layer=2, n_head=2, n_positions=256, eos_token_id=2)
    GPT2LMHeadModel(cfg).save_pretrained(tmp_path, safe_serialization=True)
    for f in default_model_folder.iterdir():
        if f.name.startswith("tokenizer"):
            shutil.copy(f, tmp_path / f.name)
    runner, _ = load_runner(str(tmp_path), max_seq_len=256)
    assert isinstance(runner, GenericRunner)
    prompt = [7, 8, 9, 7, 8, 9, 7, 8]
    ref = hf_logits(tmp_path, prompt)
    slot = runner.allocate()
    ours = torch.cat([runner.run([SeqInput(slot, prompt[:5])]).logits[0],
                      runner.run([SeqInput(slot, prompt[5:])]).logits[0]])
    assert torch.allclose(ours, ref, atol=1e-4)
    runner.free(slot)

    from specdec.config import SpecConfig, SpecType
    from specdec.drafters.registry import DraftResources

    engine = Engine(runner, draft_n_max=4)
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    plain = Sequence(prompt, params)
    list(engine.generate(plain))
    spec = DraftResources(SpecConfig(types=(SpecType.NGRAM_MAP_K4V,)), runner, None).new_drafter()
    fast = Sequence(prompt, params, drafter=spec)  # k4v trees fall back to their first path
    list(engine.generate(fast))
    assert fast.output_ids == plain.output_ids
