"""GGUF blocks run as they are: repacking, the integer-dot products, GGUF loading, and the
quantized model's rows (bit-identical at any pass width) and logits (close to float)."""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGUFWriter, quants
from gguf import GGMLQuantizationType as T

from specdec.model import clib, kernels, quant
from specdec.model.backend import CPU_KERNELS
from specdec.model.gguf_weights import load_gguf_weights
from specdec.model.quant import SUPPORTED, QuantMatrix
from specdec.model.transformer import Transformer
from specdec.model.weights import load_state_dict, read_model_config
from specdec.runners.base import SeqInput
from specdec.runners.load import load_runner
from specdec.runners.native import NativeRunner
from specdec.tree import DraftTree
from specdec.verify import verify_argmax
from tests.test_runner import assert_verify_rows_bit_identical

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler for the quantized kernels"
)


def _random_blocks(qtype: T, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Rows of valid ``qtype`` blocks: gguf's quantizer where it has one, else random bits with
    sane float16 scales (any bit pattern of a K-quant block is a valid block)."""
    block, size = GGML_QUANT_SIZES[qtype]
    if qtype not in (T.Q4_K, T.Q5_K, T.Q6_K):
        return quants.quantize(rng.standard_normal((rows, k)).astype(np.float32), qtype)
    data = rng.integers(0, 256, size=(rows, k // block, size), dtype=np.uint8)
    scale = lambda lo, hi: (rng.random((rows, k // block)) * (hi - lo) + lo).astype(np.float16)  # noqa: E731
    if qtype == T.Q6_K:
        data[:, :, 208:210] = scale(1e-3, 1e-2).view(np.uint8).reshape(rows, -1, 2)
    else:
        data[:, :, 0:2] = scale(1e-3, 1e-2).view(np.uint8).reshape(rows, -1, 2)
        data[:, :, 2:4] = scale(0, 1e-2).view(np.uint8).reshape(rows, -1, 2)
    return data.reshape(rows, -1)


@pytest.fixture(scope="module", autouse=True)
def _kernels_built():
    clib.load_qkernels()  # the C library must be loaded before numba links the quantized products


def test_a_product_hands_out_every_unit_once_and_its_runs_last_spans_shrink():
    """sd_span (kernels.qmatmul's work split): thread 0 takes its own run front to back, at most `most` units a span
    and halving near the run's end, then thread 1's run from the back; every unit once."""
    span = clib.load_qkernels().sd_span
    span.restype, span.argtypes = ctypes.c_int64, [ctypes.c_void_p] + [ctypes.c_int64] * 3
    runs = kernels._runs(100, 2)
    taken = []
    while (got := span(runs.ctypes.data, 0, 2, 8)) >= 0:
        taken.append((got >> 32, got & 0xFFFFFFFF))
    assert [b - a for a, b in taken[:9]] == [8, 8, 8, 8, 8, 5, 3, 1, 1]  # its own run, units 0-49
    assert taken[9] == (92, 100)  # then thread 1's last units
    units = [u for a, b in taken for u in range(a, b)]
    assert sorted(units) == list(range(100)) and max(b - a for a, b in taken) == 8
    assert span(runs.ctypes.data, 1, 2, 8) == -1


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda t: t.name)
def test_repacked_blocks_dequantize_to_ggufs_values(qtype):
    rng = np.random.default_rng(int(qtype))
    data = _random_blocks(qtype, 24, 512, rng)
    qm = QuantMatrix.from_blocks(data, qtype, 512)
    assert np.array_equal(qm.dense(), quants.dequantize(data, qtype).reshape(24, 512))


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda t: t.name)
def test_integer_dot_product_matches_dequantize_then_matmul(qtype):
    """Activations are quantized per 32 values to int8 (llama.cpp's q8_0): a relative error of
    ~1/127 per block, never more than 2% of the largest output here."""
    rng = np.random.default_rng(100 + int(qtype))
    data = _random_blocks(qtype, 40, 512, rng)
    qm = QuantMatrix.from_blocks(data, qtype, 512)
    x = rng.standard_normal((9, 512)).astype(np.float32)
    out = np.empty((9, 40), dtype=np.float32)
    kernels.qmatmul(*qm.arrays(), x, out)
    want = x @ quants.dequantize(data, qtype).reshape(40, 512).T
    assert np.abs(out - want).max() < 0.02 * np.abs(want).max()


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda t: t.name)
def test_quantized_product_rows_have_the_bits_of_a_row_alone(qtype):
    """Tiles of 4 rows share the weight unpacking only: every row's bits equal its product alone,
    at every pass width and position in a tile (the property greedy speculation rests on)."""
    rng = np.random.default_rng(200 + int(qtype))
    qm = QuantMatrix.from_blocks(_random_blocks(qtype, 37, 256, rng), qtype, 256)
    x = rng.standard_normal((11, 256)).astype(np.float32)
    alone = np.empty((1, 37), dtype=np.float32)
    for m in (2, 4, 5, 11):
        out = np.empty((m, 37), dtype=np.float32)
        kernels.qmatmul(*qm.arrays(), x[:m], out)
        for r in range(m):
            kernels.qmatmul(*qm.arrays(), np.ascontiguousarray(x[r : r + 1]), alone)
            assert np.array_equal(alone[0], out[r])


X8_TYPES = (T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_0, T.Q5_0, T.Q4_0, T.Q4_1, T.Q5_1)


@pytest.mark.parametrize("gelu", [False, True], ids=["silu", "gelu"])
def test_a_gate_up_products_activation_has_the_bits_of_the_activation_after_it(gelu):
    """``qmatmul``'s gated epilogue (each span's act(gate) * up, right after its tiles; ``kernels.gated_product``)
    equals the product and then ``gated_activation`` bit for bit at every width (1-3 rows, the shared quantizing
    from 4, several sweeps past 32), the values act(gate) * up of the halves ``gate_up_order`` put in blocks."""
    from specdec.model.weight_names import gate_up_order

    rng = np.random.default_rng(7)
    inter = 320  # 20 blocks of 16: many spans
    order = gate_up_order(inter)
    qm = QuantMatrix.from_blocks(_random_blocks(T.Q4_K, 2 * inter, 256, rng), T.Q4_K, 256)
    arrays = qm.permute_rows(order).interleaved(wide=clib.wide_groups()).arrays()
    x = rng.standard_normal((40, 256)).astype(np.float32)
    for m in (1, 3, 4, 8, 40):
        fused, act = np.empty((m, 2 * inter), dtype=np.float32), np.empty((m, inter), dtype=np.float32)
        kernels.qmatmul(*arrays, x[:m], fused, (act, gelu))
        out, after = np.empty_like(fused), np.empty_like(act)
        kernels.qmatmul(*arrays, x[:m], out)
        kernels.gated_activation(out, gelu, after)
        assert np.array_equal(fused, out) and np.array_equal(act.view(np.uint32), after.view(np.uint32))
        natural = torch.from_numpy(out[:, np.argsort(order)])
        gate, up = natural[:, :inter], natural[:, inter:]
        act_fn = (lambda g: torch.nn.functional.gelu(g, approximate="tanh")) if gelu else torch.nn.functional.silu
        torch.testing.assert_close(torch.from_numpy(act), act_fn(gate) * up, rtol=1e-4, atol=1e-4)


def test_the_argmax_scan_is_the_first_maximum_at_every_length():
    """``kernels._first_max`` (sd_first_max: vector lanes, then a scalar tail) gives numpy's argmax, the first of
    equal maxima, whether the ties sit in one lane, in different lanes or in the tail."""
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 15, 16, 17, 31, 32, 33, 47, 100, 1200, 1201):
        rows = rng.integers(-3, 4, (40, n)).astype(np.float32)  # few values: many ties
        best = np.empty(40, dtype=np.int64)
        kernels.argmax_rows(rows, best)
        assert np.array_equal(best, rows.argmax(axis=1)), n


@pytest.mark.parametrize("qtype", X8_TYPES, ids=lambda t: t.name)
def test_argmax_epilogue_is_the_products_argmax_with_ties_to_the_lower_id(qtype):
    """``qmatmul_argmax`` (the LM head's greedy epilogue) gives torch.argmax of ``qmatmul``'s product
    for 1 to 9 rows; a row copied to a lower and a higher id, in other chunks, ties: the lowest wins."""
    rng = np.random.default_rng(300 + int(qtype))
    data = _random_blocks(qtype, 4096, 256, rng)
    x = rng.standard_normal((9, 256)).astype(np.float32)
    out = np.empty((9, 4096), dtype=np.float32)
    kernels.qmatmul(*QuantMatrix.from_blocks(data, qtype, 256).interleaved(wide=clib.wide_groups()).arrays(), x, out)
    top = int(out[0].argmax())
    data[[3, 4090]] = data[top]  # row 0's maximum three times: ids 3, top and 4090
    arrays = QuantMatrix.from_blocks(data, qtype, 256).interleaved(wide=clib.wide_groups()).arrays()
    kernels.qmatmul(*arrays, x, out)
    for m in (1, 2, 9):
        best = np.empty(m, dtype=np.int64)
        kernels.qmatmul_argmax(*arrays, x[:m], best, np.full(m, -1), np.zeros(m, dtype=np.int64))
        assert list(best) == torch.from_numpy(out[:m]).argmax(-1).tolist()
    assert best[0] == 3 and out[0, 3] == out[0, 4090] == out[0].max()


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_argmax_epilogue_leaves_out_only_the_rows_greedy_verification_cannot_reach(qtype):
    """Given each row's parent row and token, ``qmatmul_argmax`` gives the argmax of every row the greedy walk
    reaches (each token on its way its parent row's argmax) and -1 for every other: a chain accepted to its fourth
    draft, a tie lost to the lower id, a rejected sibling beside an accepted one, a subtree under a rejection."""
    rng = np.random.default_rng(700 + int(qtype))
    data = _random_blocks(qtype, 4096, 256, rng)
    x = rng.standard_normal((12, 256)).astype(np.float32)
    x[7] = x[0]
    out = np.empty((12, 4096), dtype=np.float32)
    kernels.qmatmul(*QuantMatrix.from_blocks(data, qtype, 256).interleaved(wide=clib.wide_groups()).arrays(), x, out)
    data[[3, 4090]] = data[int(out[0].argmax())]  # rows 0's and 7's maximum at ids 3 and 4090 too: 3 wins the tie
    arrays = QuantMatrix.from_blocks(data, qtype, 256).interleaved(wide=clib.wide_groups()).arrays()
    kernels.qmatmul(*arrays, x, out)
    top = out.argmax(axis=1)
    assert top[0] == top[7] == 3 and out[7, 4090] == out[7, 3]
    # rows 0-6 a chain whose drafts 1-4 are their parents' argmax and 5's is not, 6 under 5; 7 a second root with
    # children 8 (the tie's higher id: rejected) and 9 (accepted), 10 under 8, 11 under 9
    parent = np.array([-1, 0, 1, 2, 3, 4, 5, -1, 7, 7, 8, 9])
    token = np.array([0, *top[:4], (top[4] + 1) % 4096, top[5], 0, 4090, 3, top[8], top[9]])
    reached = [True] * 5 + [False, False, True, False, True, False, True]
    best = np.empty(12, dtype=np.int64)
    kernels.qmatmul_argmax(*arrays, x, best, parent, token)
    assert list(best) == [int(t) if r else -1 for t, r in zip(top, reached, strict=True)]


@pytest.mark.parametrize("quantization", ["none", "q8_0"])
def test_a_pass_asked_for_argmax_gives_its_logits_argmax(tiny_model_factory, quantization):
    """``run(argmax=True)`` (greedy verification: the LM head keeps row maxima only) gives the tokens the
    same pass's logits would, on a chain, a tree and a batch, float and quantized heads."""
    runner, _ = load_runner(str(tiny_model_factory("qwen2")), max_seq_len=256, num_slots=2, quantization=quantization)
    a, b = runner.allocate(), runner.allocate()
    for slot in (a, b):
        runner.run([SeqInput(slot, [5, 17, 99, 4, 61], all_logits=False)])
    passes = ([SeqInput(a, [7, 31, 32, 33])], [SeqInput(a, [7, 31, 32, 33, 34], [-1, 0, 1, 0, 3])],
              [SeqInput(a, [7, 8]), SeqInput(b, [9, 10, 11])])
    for seqs in passes:
        want = runner.run(seqs).logits
        for s in seqs:
            runner.truncate(s.slot, 5)
        got = runner.run(seqs, argmax=True)
        for s in seqs:
            runner.truncate(s.slot, 5)
        assert got.logits == [] and got.argmax is not None
        assert [g.tolist() for g in got.argmax] == [w.argmax(-1).tolist() for w in want]


@pytest.mark.parametrize("quantization", ["none", "q8_0"])
def test_a_pass_asked_for_softmax_blocks_gives_those_of_its_logits(tiny_model_factory, quantization):
    """``run(blocks=...)`` (a sampled verify pass, ``row_dist.BlockDist``): the same logits, and each asked
    sequence's rows' blocks as sd_softmax_blocks makes them from those logits, bit for bit (a quantized head sums
    them span by span in its sweep, a float head after its product); None where a sequence asked none."""
    from specdec.config import SamplingParams
    from specdec.row_dist import BlockDist, inverse_temperature

    runner, _ = load_runner(str(tiny_model_factory("qwen2")), max_seq_len=256, num_slots=2, quantization=quantization)
    a, b = runner.allocate(), runner.allocate()
    for slot in (a, b):
        runner.run([SeqInput(slot, [5, 17, 99, 4, 61], all_logits=False)])
    passes = ([SeqInput(a, [7])], [SeqInput(a, [7, 31, 32, 33, 34], [-1, 0, 1, 0, 3])],
              [SeqInput(a, [7, 8]), SeqInput(b, [9, 10, 11])])
    for seqs in passes:
        want = runner.run(seqs).logits
        for s in seqs:
            runner.truncate(s.slot, 5)
        temperatures = [0.7, 0.0][: len(seqs)] if len(seqs) > 1 else [1.3]
        inv = [float(inverse_temperature(t)) if t else 0.0 for t in temperatures]
        got = runner.run(seqs, blocks=inv)
        for s in seqs:
            runner.truncate(s.slot, 5)
        assert got.blocks is not None
        for logits, w, summed, t in zip(got.logits, want, got.blocks, temperatures, strict=True):
            assert torch.equal(logits, w)
            if not t:
                assert summed is None
                continue
            for r in range(len(logits)):
                alone = BlockDist(logits[r].numpy(), SamplingParams(temperature=t))
                fused = BlockDist(logits[r].numpy(), SamplingParams(temperature=t), (summed[0][r], summed[1][r]))
                assert np.array_equal(alone.weights, fused.weights) and np.array_equal(alone.factor, fused.factor)


@pytest.mark.parametrize("quantization", ["none", "q8_0"])
def test_a_verify_pass_gives_the_argmax_of_every_row_greedy_verification_reaches(tiny_model_factory, quantization):
    """``run(argmax=True, path_only=True)`` (the engine's greedy verify pass) gives the argmax of each row the walk
    reaches and, where the head is quantized, -1 for a rejected draft and its subtree: the same walk."""
    runner, _ = load_runner(str(tiny_model_factory("qwen2")), max_seq_len=256, num_slots=1, quantization=quantization)
    a = runner.allocate()
    runner.run([SeqInput(a, [5, 17, 99, 4, 61], all_logits=False)])
    first = int(runner.run([SeqInput(a, [7])]).logits[0][0].argmax())
    runner.truncate(a, 5)
    second = int(runner.run([SeqInput(a, [7, first])]).logits[0][1].argmax())
    runner.truncate(a, 5)
    # 0 -> first (accepted) -> second (accepted) -> row 2's argmax + 1 (rejected); 0 -> first + 1 (rejected) -> 41
    third = (int(runner.run([SeqInput(a, [7, first, second])]).logits[0][2].argmax()) + 1) % runner.config.vocab_size
    runner.truncate(a, 5)
    tokens, parents = [7, first, second, third, (first + 1) % runner.config.vocab_size, 41], [-1, 0, 1, 2, 0, 4]
    seq = SeqInput(a, tokens, parents)
    want = runner.run([seq]).logits[0].argmax(-1).tolist()
    runner.truncate(a, 5)
    got = runner.run([seq], argmax=True, path_only=True).argmax[0].tolist()
    assert got[:3] == want[:3]
    assert got[3:] == ([-1, -1, -1] if quantization == "q8_0" else want[3:])
    tree = DraftTree(tokens, parents)
    assert verify_argmax(tree, got) == verify_argmax(tree, want)


# The K-quants' interleaved layouts in NumPy, as quant.py packed them before qkernels.c's sd_pack_q45k and
# sd_pack_q6k: the reference the C packers are held to, byte for byte.
def _k4_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes [..., 12] -> 8 six-bit scales and 8 mins [..., 8] (llama.cpp's get_scale_min_k4)."""
    p = packed.astype(np.uint8)
    sc = np.concatenate([p[..., 0:4] & 63, (p[..., 8:12] & 15) | ((p[..., 0:4] >> 6) << 4)], axis=-1)
    mn = np.concatenate([p[..., 4:8] & 63, (p[..., 8:12] >> 4) | ((p[..., 4:8] >> 6) << 4)], axis=-1)
    return sc, mn


def _q4k_x8(b: np.ndarray) -> np.ndarray:
    """Q4_K super-blocks of groups of n = 8 or 16 rows [G, n, nsb, 144] -> Q4KX8 [G, nsb, 8 x 148] or
    Q4KX16 [G, nsb, 16 x 148] (qkernels_x8.h, qkernels_x16.h)."""
    b = b.transpose(0, 2, 1, 3)  # [G, nsb, row, 144]
    G, nsb, n = b.shape[:3]
    sc, mn = _k4_scales(b[..., 4:16])  # [G, nsb, row, 8]
    qs = b[..., 16:].reshape(G, nsb, n, 4, 8, 4).transpose(0, 1, 3, 4, 2, 5)  # [.., pair, step, row, 4]
    return np.concatenate([
        b[..., 0:2].reshape(G, nsb, 2 * n), b[..., 2:4].reshape(G, nsb, 2 * n),
        sc.transpose(0, 1, 3, 2).reshape(G, nsb, 8 * n), mn.transpose(0, 1, 3, 2).reshape(G, nsb, 8 * n),
        qs.reshape(G, nsb, 128 * n),
    ], axis=-1)


def _q5k_x8(b: np.ndarray) -> np.ndarray:
    """Q5_K super-blocks of groups of n = 8 or 16 rows [G, n, nsb, 176] -> Q5KX8 [G, nsb, 8 x 180] or Q5KX16
    [G, nsb, 16 x 180]: Q4KX8's or Q4KX16's fields with the high bits (qh) a step at a time, as the nibbles,
    between the mins and the nibbles (qkernels_x8.h, qkernels_x16.h)."""
    G, n, nsb = b.shape[:3]
    as_q4 = _q4k_x8(np.concatenate([b[..., :16], b[..., 48:]], axis=-1))  # d, dmin, scales, qs: Q4_K's fields
    qh = b[..., 16:48].transpose(0, 2, 1, 3).reshape(G, nsb, n, 8, 4).transpose(0, 1, 3, 2, 4)  # [.., step, row, 4]
    return np.concatenate([as_q4[..., : 20 * n], qh.reshape(G, nsb, 32 * n), as_q4[..., 20 * n :]], axis=-1)


def _q6k_values(b: np.ndarray) -> np.ndarray:
    """Q6_K super-blocks [..., 210] -> their 256 values 0..63 [..., 256] (before the -32)."""
    ql, qh = b[..., 0:128], b[..., 128:192]
    halves = []
    for n in range(2):
        lo, hi = ql[..., 64 * n : 64 * n + 64], qh[..., 32 * n : 32 * n + 32]
        for quarter in range(4):
            low = lo[..., 32 * (quarter & 1) : 32 * (quarter & 1) + 32]
            low = low & 15 if quarter < 2 else low >> 4
            halves.append(low | (((hi >> (2 * quarter)) & 3) << 4))
    return np.concatenate(halves, axis=-1)


def _q6k_x8(b: np.ndarray) -> np.ndarray:
    """Q6_K super-blocks of groups of n = 8 or 16 rows [G, n, nsb, 210] -> Q6KX8 [G, nsb, 8 x 210] or
    Q6KX16 [G, nsb, 16 x 210] (qkernels_x8.h, qkernels_x16.h). A step's three parts: Q6KX8's B0, B1, B2
    (chunk cc < 3 whole in bits 0..5 of Bcc, chunk 3's 2-bit fields in bits 6..7 of B0, B1, B2: a step
    unpacks in 11 operations, not 17); Q6KX16's L0, L1, H (4-bit halves and the high bits)."""
    b = b.transpose(0, 2, 1, 3)  # [G, nsb, row, 210]
    G, nsb, n = b.shape[:3]
    v = _q6k_values(b).reshape(G, nsb, n, 2, 4, 8, 4)  # [.., row, quad, chunk in quad, step, 4]
    if n == 8:
        parts = [v[:, :, :, :, cc] | (((v[:, :, :, :, 3] >> (2 * cc)) & 3) << 6) for cc in range(3)]
    else:
        low, high = v & 15, v >> 4
        parts = [low[:, :, :, :, 0] | (low[:, :, :, :, 1] << 4), low[:, :, :, :, 2] | (low[:, :, :, :, 3] << 4),
                 high[:, :, :, :, 0] | (high[:, :, :, :, 1] << 2) | (high[:, :, :, :, 2] << 4)
                 | (high[:, :, :, :, 3] << 6)]  # [G, nsb, row, quad, step, 4] each
    body = np.stack(parts, axis=4)  # [G, nsb, row, quad, part, step, 4]
    body = body.transpose(0, 1, 3, 5, 4, 2, 6)  # [G, nsb, quad, step, part, row, 4]
    return np.concatenate([
        b[..., 208:210].reshape(G, nsb, 2 * n), b[..., 192:208].transpose(0, 1, 3, 2).reshape(G, nsb, 16 * n),
        body.reshape(G, nsb, 192 * n).astype(np.uint8),
    ], axis=-1)


@pytest.mark.parametrize("n", [8, 16])
@pytest.mark.parametrize(("qtype", "layout", "reference"),
                         [(T.Q4_K, quant.Q4KX8, _q4k_x8), (T.Q5_K, quant.Q5KX8, _q5k_x8),
                          (T.Q6_K, quant.Q6KX8, _q6k_x8)], ids=["Q4_K", "Q5_K", "Q6_K"])
def test_k_quant_groups_pack_in_c_as_the_numpy_reference(qtype, layout, reference, n):
    """sd_pack_q45k and sd_pack_q6k (quant._pack) write each listed group's run of the output rows as the NumPy
    layouts above, groups in any order, rows wider than the packed ones, and touch nothing else."""
    rng = np.random.default_rng(n + int(qtype))
    size = quant.SUPER_BLOCK[{T.Q4_K: quant.Q4K, T.Q5_K: quant.Q5K, T.Q6_K: quant.Q6K}[qtype]]
    unit = quant.SUPER_BLOCK[layout]
    rows, k = 4 * n, 768  # 3 super-blocks a row
    width = 3 * unit + 40  # the output rows 40 bytes wider than the packed ones
    mat = QuantMatrix.from_blocks(_random_blocks(qtype, rows, k, rng), qtype, k)
    out = np.full((rows, width), 0xAB, dtype=np.uint8)
    groups = np.array([2, 0, 3])
    quant._pack(mat, layout if n == 8 else quant.WIDE[layout], groups, n, out)
    want = reference(mat.q[:, : 3 * size].reshape(4, n, 3, size))  # [G, nsb, unit n]
    runs = out.reshape(4, n * width)
    for g in range(4):
        if g in groups:
            assert np.array_equal(runs[g, : 3 * unit * n], want[g].reshape(-1)), g
            assert (runs[g, 3 * unit * n:] == 0xAB).all()
        else:
            assert (runs[g] == 0xAB).all()


# The 32-value types' interleaved layouts in NumPy, as quant.py packed them before qkernels.c's sd_pack_blocks.
def _block_values(mat: QuantMatrix, rows: np.ndarray) -> np.ndarray:
    """Rows of a 32-value layout as the integers the interleaved kernels multiply: [rows, k / 32, 32]
    (Q8_0 signed, U4M 0..15, U8M 0..31)."""
    q = mat.q[rows]
    nb = mat.k // 32
    if mat.fmt[rows[0]] == quant.U4M:
        b = q[:, : mat.k // 2].reshape(len(rows), nb // 2, 32)
        v = np.stack([b & 15, b >> 4], axis=2)  # byte j: block 2p's value j low, block 2p + 1's high
    elif mat.fmt[rows[0]] == quant.I8:
        v = (q[:, : mat.k].astype(np.int16) - 128).astype(np.int8).view(np.uint8)
    else:
        v = q[:, : mat.k]
    return v.reshape(len(rows), nb, 32)


def _x8_blocks(mat: QuantMatrix, narrow: int, rows: np.ndarray, groups: int) -> np.ndarray:
    """Rows of one 32-value type, n = 8 or 16 a group -> the group's blocks [G, nb, n x BLOCK[narrow]]
    (qkernels_x8.h; qkernels_x16.h: every per-row run n rows wide)."""
    nb, n = mat.k // 32, len(rows) // groups
    v = _block_values(mat, rows).reshape(groups, n, nb, 8, 4)  # [G, row, block, step, 4]
    d = mat.s[rows, :nb].astype(np.float16).reshape(groups, n, nb).transpose(0, 2, 1)  # [G, block, row]
    parts = [np.ascontiguousarray(d).view(np.uint8).reshape(groups, nb, 2 * n)]
    if narrow in (quant.Q41X8, quant.Q51X8):
        mn = mat.m[rows, :nb].astype(np.float16).reshape(groups, n, nb).transpose(0, 2, 1)
        parts.append(np.ascontiguousarray(mn).view(np.uint8).reshape(groups, nb, 2 * n))
    steps = v.transpose(0, 2, 3, 1, 4)  # [G, block, step, row, 4]
    if narrow == quant.Q80X8:
        parts.append(steps.reshape(groups, nb, 32 * n))
    else:
        if narrow in (quant.Q50X8, quant.Q51X8):  # bit t of byte 4 i + u: the fifth bit of row i's value 4 t + u
            high = ((v >> 4) & 1).transpose(0, 2, 1, 4, 3)  # [G, block, row, u, step]
            parts.append(np.packbits(high, axis=-1, bitorder="little").reshape(groups, nb, 4 * n))
        low = steps & 15
        parts.append((low[:, :, :4] | (low[:, :, 4:] << 4)).reshape(groups, nb, 16 * n))
    return np.concatenate(parts, axis=-1).astype(np.uint8)


@pytest.mark.parametrize("n", [8, 16])
@pytest.mark.parametrize(("qtype", "layout"), [(T.Q8_0, quant.Q80X8), (T.Q5_0, quant.Q50X8), (T.Q4_0, quant.Q40X8),
                                               (T.Q4_1, quant.Q41X8), (T.Q5_1, quant.Q51X8)],
                         ids=["Q8_0", "Q5_0", "Q4_0", "Q4_1", "Q5_1"])
def test_block_groups_pack_in_c_as_the_numpy_reference(qtype, layout, n):
    """sd_pack_blocks (quant._pack) writes each listed group's run of the output rows as the NumPy layout above,
    groups in any order, rows wider than the packed ones, and touches nothing else."""
    rng = np.random.default_rng(n + int(qtype))
    rows, k = 4 * n, 256
    unit = quant.BLOCK[layout] * (k // 32)
    width = unit + 40
    mat = QuantMatrix.from_blocks(_random_blocks(qtype, rows, k, rng), qtype, k)
    out = np.full((rows, width), 0xAB, dtype=np.uint8)
    groups = np.array([2, 0, 3])
    quant._pack(mat, layout if n == 8 else quant.WIDE[layout], groups, n, out)
    want = _x8_blocks(mat, layout, np.arange(rows), 4)  # [G, nb, n x size]
    runs = out.reshape(4, n * width)
    for g in range(4):
        if g in groups:
            assert np.array_equal(runs[g, : unit * n], want[g].reshape(-1)), g
            assert (runs[g, unit * n:] == 0xAB).all()
        else:
            assert (runs[g] == 0xAB).all()


@pytest.mark.parametrize("wide", [False, True], ids=["x8", "x16"])
@pytest.mark.parametrize("qtype", X8_TYPES, ids=lambda t: t.name)
def test_interleaved_rows_dequantize_and_multiply_as_ggufs_blocks(qtype, wide):
    """Groups of 8 rows packed at load (Q4KX8, Q5KX8, Q6KX8, Q80X8, Q50X8, Q40X8, Q41X8, Q51X8; wide: pairs
    as Q4KX16, Q6KX16, Q80X16, ...): the same values (a row not in a whole group keeps its layout), products
    within the activations' rounding of the dense product, and every row's bits those of its product
    alone at every pass width and tile position."""
    rng = np.random.default_rng(300 + int(qtype))
    data = _random_blocks(qtype, 45, 512, rng)
    qm = QuantMatrix.from_blocks(data, qtype, 512).interleaved(wide=wide)
    assert np.count_nonzero(np.isin(qm.fmt, quant.INTERLEAVED)) == 40  # 5 whole groups of 8
    if wide:  # 2 of 16 at rows 0 and 16, 1 of 8 at 32
        assert list(np.unique(qm.fmt[:40], return_counts=True)[1]) == [8, 32]
    dense = quants.dequantize(data, qtype).reshape(45, 512)
    assert np.array_equal(qm.dense(), dense)
    whole = QuantMatrix.from_blocks(data[:40], qtype, 512).interleaved(wide=wide)  # every row in a group: their
    assert whole.s.shape == whole.m.shape == (40, 1)  # scales in q, no float per 32 values kept beside them
    assert np.array_equal(whole.dense(), dense[:40])
    x = rng.standard_normal((13, 512)).astype(np.float32)
    out = np.empty((13, 45), dtype=np.float32)
    kernels.qmatmul(*qm.arrays(), x, out)
    assert np.abs(out - x @ dense.T).max() < 0.02 * np.abs(x @ dense.T).max()
    alone = np.empty((1, 45), dtype=np.float32)
    x = np.concatenate([x, rng.standard_normal((27, 512)).astype(np.float32)])
    for m in (1, 3, 4, 5, 6, 7, 9, 13, 16, 17, 40):  # 5-8: one AVX-512 tile; 16 on: AMX tiles where the CPU has them
        wide = np.empty((m, 45), dtype=np.float32)
        kernels.qmatmul(*qm.arrays(), x[:m], wide)
        for r in range(m):
            kernels.qmatmul(*qm.arrays(), np.ascontiguousarray(x[r : r + 1]), alone)
            assert np.array_equal(alone[0], wide[r])
    with pytest.raises(ValueError, match="groups of 8 or 16"):
        qm.permute_rows(np.arange(45)[::-1])


@pytest.mark.parametrize("qtype, wide", [(t, w) for w in (False, True) for t in X8_TYPES],
                         ids=lambda v: v.name if isinstance(v, T) else ("x16" if v else "x8"))
def test_streamed_groups_have_the_bits_of_a_wider_pass(qtype, wide):
    """A 1-2 row pass reads a chunk's interleaved groups as a few runs advanced about 1 KB at a time
    (qkernels_x8.h's x8_streams, where the AVX2 kernels run; an even and an uneven split here), the
    partial sums carried between turns, and AVX-512 multiplies a 16-row Q4_K group's 1-2 rows a
    sub-block pair at a time (qkernels_x16.h's X16_PAIR_ROWS; a 16-row 32-value group's 1-2 rows in 4 or 2
    sums a row): each row's bits stay those of the same
    row in a 3-row pass, which multiplies one group, one sub-block at a time."""
    rng = np.random.default_rng(41 + int(qtype))
    for n_rows in (1024, 1004):  # chunks of whole groups split into runs; the last with loose rows
        qm = QuantMatrix.from_blocks(_random_blocks(qtype, n_rows, 768, rng), qtype, 768).interleaved(wide=wide)
        x = rng.standard_normal((3, 768)).astype(np.float32)
        three = np.empty((3, n_rows), dtype=np.float32)
        kernels.qmatmul(*qm.arrays(), x, three)
        for m in (1, 2):
            narrow = np.empty((m, n_rows), dtype=np.float32)
            kernels.qmatmul(*qm.arrays(), x[:m], narrow)
            assert np.array_equal(narrow, three[:m])


_X8_PRODUCTS = """
import sys, numpy as np
from gguf import GGMLQuantizationType as T
from specdec.model import clib, kernels
from specdec.model.quant import QuantMatrix
from tests.test_quant import _random_blocks
clib.load_qkernels()
rng, out = np.random.default_rng(9), []
# the 16-row layouts too (AVX-512's; every other build multiplies them in portable C)
types = (T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_0, T.Q5_0, T.Q4_0, T.Q4_1, T.Q5_1)
for qtype, wide in [(t, w) for t in types for w in (False, True)]:
    # 512 rows: a thread's 256 in spans of 16, 8, 4, 2 groups, which 1-2 row passes read as runs (AVX2's x8_streams)
    qm = QuantMatrix.from_blocks(_random_blocks(qtype, 512, 1024, rng), qtype, 1024).interleaved(wide=wide)
    assert qm.fmt[0] >= 7, (qtype, qm.fmt[0])  # interleaved
    x = rng.standard_normal((17, 1024)).astype(np.float32)
    for rows in (1, 2, 11, 17):  # AVX2: 1, 2 and 8 + 3 (its narrow Q4_K tile up to 4 rows); 4 + 4 + 3; AMX 16 + 1
        y = np.empty((rows, 512), dtype=np.float32)
        kernels.qmatmul(*qm.arrays(), x[:rows], y)
        out.append(y.ravel())
# a sampled row's softmax blocks (exp16 / exp8 / exp1), a tail block and -inf logits among them
logits = rng.standard_normal((3, 1000)).astype(np.float32) * 4
logits[0, 5] = logits[2, 64:128] = -np.inf
softmax = (np.array([1.43, 0.5, 1.0], dtype=np.float32), np.empty((3, 16), np.float32), np.empty((3, 16), np.float32))
kernels.softmax_blocks(logits, softmax)
np.save(sys.argv[1], np.concatenate(out + [softmax[1].ravel(), softmax[2].ravel()]))
print(clib.isa())
"""


def test_interleaved_products_have_the_same_bits_on_every_isa(tmp_path):
    """The interleaved kernels' integers are exact and their float steps the same fused operations in
    the same order on every path, so every build this CPU runs (its own; AVX-512 without AMX; AVX2 with
    and without VNNI; portable C) gives the same bits: an AMX machine checks its tiles this way, an
    AVX-512 VNNI one its zmm tiles, an AVX-VNNI one its vpdpbusd tiles. A sampled row's softmax blocks too."""
    import os
    import subprocess
    import sys

    results = {}
    builds = (("native", ""), ("no-amx", "-mno-amx-tile -mno-amx-int8"), ("avx2", "-mno-avx512f"),
              ("avx2-novnni", "-mno-avx512f -mno-avxvnni"), ("scalar", "-mno-avx2 -mno-avx512f"))
    for name, flags in builds:
        env = {**os.environ, "SPECDEC_QKERNELS_CFLAGS": flags}
        done = subprocess.run([sys.executable, "-c", _X8_PRODUCTS, str(tmp_path / f"{name}.npy")], env=env,
                              capture_output=True, text=True, timeout=600,
                              cwd=os.path.dirname(os.path.dirname(__file__)))
        assert done.returncode == 0, done.stderr[-2000:]
        results[name] = (done.stdout.strip(), np.load(tmp_path / f"{name}.npy"))
    assert results["scalar"][0] == "scalar"
    assert np.isfinite(results["native"][1][:-96]).all() and np.abs(results["native"][1]).max() > 0
    for name, (isa, products) in results.items():  # e.g. avx512-vnni, avx2-vnni, avx2, scalar on a VNNI CPU
        assert np.array_equal(products, results["scalar"][1]), f"{name} ({isa}) differs from the portable C bits"


def test_mixed_layouts_in_one_matrix():
    """A fused q/k/v matrix may mix block types (Q4_K_M keeps attn_v in Q6_K): rows keep their own."""
    rng = np.random.default_rng(7)
    parts = [(T.Q4_K, 16), (T.Q6_K, 8), (T.Q8_0, 8)]
    blocks = [(_random_blocks(t, n, 256, rng), t) for t, n in parts]
    fused = QuantMatrix.concat([QuantMatrix.from_blocks(b, t, 256) for b, t in blocks]).interleaved(wide=False)
    assert list(fused.fmt) == [quant.Q4KX8] * 16 + [quant.Q6KX8] * 8 + [quant.Q80X8] * 8
    wide = QuantMatrix.concat([QuantMatrix.from_blocks(b, t, 256) for b, t in blocks]).interleaved(wide=True)
    assert list(wide.fmt) == [quant.Q4KX16] * 16 + [quant.Q6KX8] * 8 + [quant.Q80X8] * 8  # 8 Q6_K rows: no pair
    assert np.array_equal(wide.dense(), fused.dense())
    dense = np.concatenate([quants.dequantize(b, t).reshape(-1, 256) for b, t in blocks])
    assert np.array_equal(fused.dense(), dense)
    # each part at its own bytes a row, none padded to the widest (quant.segmented)
    assert fused.arrays().q.size == fused.nbytes < fused.q.size
    x = rng.standard_normal((3, 256)).astype(np.float32)
    out = np.empty((3, 32), dtype=np.float32)
    kernels.qmatmul(*fused.arrays(), x, out)
    assert np.abs(out - x @ dense.T).max() < 0.02 * np.abs(x @ dense.T).max()


@pytest.mark.parametrize("quantization", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_verify_rows_bit_identical_with_quantized_weights(tiny_model_factory, arch, quantization):
    """A quantized target keeps the guarantee: a token's logits in a chain, tree or batched pass have
    the bits of decoding it alone."""
    runner, _ = load_runner(str(tiny_model_factory(arch)), max_seq_len=256, num_slots=2, quantization=quantization)
    assert runner.weights_label.startswith("gguf") and runner.kv_cache_label == "float16"  # auto: as llama.cpp
    assert_verify_rows_bit_identical(runner)


@pytest.mark.parametrize("kv_cache_dtype", ["float32", "bfloat16"])
def test_verify_rows_bit_identical_with_quantized_weights_and_another_cache(tiny_model_factory, kv_cache_dtype):
    """--kv-cache-dtype on the integer-dot kernels (whose default cache is float16, the other tests'): each row
    still has the bits of decoding it alone."""
    runner, _ = load_runner(str(tiny_model_factory("qwen2")), max_seq_len=256, num_slots=2, quantization="q4_1",
                            kv_cache_dtype=kv_cache_dtype)
    assert runner.kv_cache_label == kv_cache_dtype
    assert_verify_rows_bit_identical(runner)


def _write_gguf(path, folder, arch: str, matrix_type: T, f16_names: tuple[str, ...] = ()) -> None:
    """The tiny model as llama.cpp's converter stores it: GGUF names, q/k rows interleaved for the
    llama architecture, matrices in ``matrix_type`` blocks (the ``f16_names`` in float16)."""
    from safetensors.torch import load_file

    hf = {k.removeprefix("model."): v.float().numpy() for k, v in load_file(folder / "model.safetensors").items()}
    cfg, _ = read_model_config(folder)
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    writer = GGUFWriter(str(path), arch)

    def interleave(w: np.ndarray, heads: int) -> np.ndarray:  # llama.cpp's permute()
        return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    def add(name: str, w: np.ndarray) -> None:
        if w.ndim == 2 and name not in f16_names:
            writer.add_tensor(name, quants.quantize(w, matrix_type), raw_dtype=matrix_type)
        elif w.ndim == 2:
            writer.add_tensor(name, w.astype(np.float16))
        else:
            writer.add_tensor(name, w.astype(np.float32))

    add("token_embd.weight", hf.pop("embed_tokens.weight"))
    add("output_norm.weight", hf.pop("norm.weight"))
    if "lm_head.weight" in hf:
        add("output.weight", hf.pop("lm_head.weight"))
    for i in range(cfg.num_layers):
        for hf_name, gguf_name in names.items():
            w = hf.pop(f"layers.{i}.{hf_name}.weight")
            if gguf_name == "attn_q":
                w = interleave(w, cfg.num_heads)
            elif gguf_name == "attn_k":
                w = interleave(w, cfg.num_kv_heads)
            add(f"blk.{i}.{gguf_name}.weight", w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_file_loads_as_blocks_and_matches_the_float_model(tiny_llama, tmp_path, capfd):
    """Names, llama.cpp's q/k interleave and the fused rows, read from a real GGUF file: logits
    close to the float model's; a matrix type without integer kernel (F16) dequantised with a notice."""
    path = tmp_path / "tiny.gguf"
    _write_gguf(path, tiny_llama, "llama", T.Q8_0, f16_names=("blk.1.ffn_down.weight",))
    cfg, _ = read_model_config(tiny_llama)
    weights = load_gguf_weights(path, cfg)
    assert "F16 matrices have no integer kernel" in capfd.readouterr().err
    assert isinstance(weights["layers.0.wqkv"], QuantMatrix) and isinstance(weights["embed"], QuantMatrix)
    assert isinstance(weights["layers.1.w_down"], torch.Tensor)
    quantized = NativeRunner(Transformer(cfg, weights, CPU_KERNELS, 128), cfg, torch.float32, torch.device("cpu"), 128)
    floats = Transformer(cfg, load_state_dict(tiny_llama, cfg, torch.float32), CPU_KERNELS, 128)
    reference = NativeRunner(floats, cfg, torch.float32, torch.device("cpu"), 128)
    ids = [1, 504, 3458, 282, 4649, 314, 216, 1035]
    got = quantized.run([SeqInput(quantized.allocate(), ids)]).logits[0]
    want = reference.run([SeqInput(reference.allocate(), ids)]).logits[0]
    assert (got - want).abs().max() < 0.05 * want.abs().max()


def test_default_model_blocks_close_to_the_float_model():
    """The default GGUF run as blocks vs dequantised to float32: a different numeric model (int8
    activations, like llama.cpp's), measured in docs/performance.md; here it must stay close."""
    ids = [1, 504, 3458, 282, 4649, 314, 216, 1035, 30, 2365, 17, 28, 29]
    blocks, _ = load_runner(None, max_seq_len=64)
    floats, _ = load_runner(None, max_seq_len=64, quantization="none")
    assert blocks.weights_label.startswith("gguf Q") and not floats.weights_label.startswith("gguf")
    assert blocks.weight_bytes() < floats.weight_bytes() / 4
    got = blocks.run([SeqInput(blocks.allocate(), ids)]).logits[0]
    want = floats.run([SeqInput(floats.allocate(), ids)]).logits[0]
    assert (got - want).abs().max() < 0.1 * want.abs().max()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.75


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_long_prompt_runs_in_chunks_with_the_bits_of_one_pass(tiny_model_factory, arch):
    """A prompt longer than QUANTIZED_PREFILL_ROWS is prefilled in passes of that many tokens: the
    last token's logits equal decoding it after the rest, and hidden states cover every token. Its
    rows' attention skips the keys no row of a job sees (the causal future, past a sliding window):
    the seen keys' bits are unchanged."""
    runner, _ = load_runner(str(tiny_model_factory(arch)), max_seq_len=1024, quantization="q8_0")
    ids = [(37 * i) % 40000 + 3 for i in range(601)]
    slot = runner.allocate()
    out = runner.run([SeqInput(slot, ids, all_logits=False)], hidden_layers=(0, -1))
    assert runner.lengths[slot] == 601 and out.logits[0].shape[0] == 1
    assert [h.shape[0] for h in out.hidden[0]] == [601, 601]
    runner.truncate(slot, 600)
    step = runner.run([SeqInput(slot, ids[600:])])
    assert torch.equal(step.logits[0][-1], out.logits[0][-1])


K_ARCHS = {"llama": dict(model_type="llama"), "qwen2": dict(model_type="qwen2"),
           "gemma3": dict(model_type="gemma3_text", sliding_window=8, layer_types=None, query_pre_attn_scalar=64)}


def _write_k_quant_gguf(folder, arch: str) -> tuple:
    """A random model of ``arch`` whose every matrix is a K-quant (rows of 256 and 512 values), the
    types rotating over tensors and layers: q/k/v of one layer mix Q4_K, Q5_K and Q6_K in one fused
    matrix and stacked layers differ in width. Returns (GGUF path, our config)."""
    from transformers import AutoConfig

    extra = dict(K_ARCHS[arch])
    hf = AutoConfig.for_model(extra.pop("model_type"), vocab_size=1024, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                              max_position_embeddings=512, tie_word_embeddings=arch != "qwen2", **extra)
    hf.save_pretrained(folder)
    cfg, _ = read_model_config(folder)
    rng = np.random.default_rng(len(arch))
    writer = GGUFWriter(str(folder / "k.gguf"), arch)
    types = [T.Q4_K, T.Q5_K, T.Q6_K]

    def matrix(name: str, rows: int, k: int, qtype: T) -> None:
        data = _random_blocks(qtype, rows, k, rng)
        scale = 2e-4 if qtype == T.Q6_K else 1e-3  # keep activations finite over the layers
        field = slice(208, 210) if qtype == T.Q6_K else slice(0, 2)
        blocks = data.reshape(rows, k // 256, -1)
        blocks[:, :, field] = (rng.random((rows, k // 256)) * scale + scale / 10).astype(np.float16).view(
            np.uint8).reshape(rows, -1, 2)
        writer.add_tensor(name, blocks.reshape(rows, -1), raw_dtype=qtype)

    def vector(name: str, n: int, mean: float = 1.0) -> None:
        writer.add_tensor(name, (mean + 0.1 * rng.standard_normal(n)).astype(np.float32))

    h, i_size, q, kv = 256, 512, 4 * 64, 2 * 64
    matrix("token_embd.weight", 1024, h, T.Q4_K)
    vector("output_norm.weight", h, 0.0 if arch == "gemma3" else 1.0)
    if not hf.tie_word_embeddings:
        matrix("output.weight", 1024, h, T.Q6_K)
    for layer in range(2):
        p = f"blk.{layer}."
        for j, (name, rows, k) in enumerate([("attn_q", q, h), ("attn_k", kv, h), ("attn_v", kv, h),
                                             ("attn_output", h, q), ("ffn_gate", i_size, h),
                                             ("ffn_up", i_size, h), ("ffn_down", h, i_size)]):
            matrix(p + name + ".weight", rows, k, types[(j + layer) % 3])
        norm = 0.0 if arch == "gemma3" else 1.0
        for name in ("attn_norm", "ffn_norm", *(("post_attention_norm", "post_ffw_norm") if arch == "gemma3" else ())):
            vector(p + name + ".weight", h, norm)
        if arch == "qwen2":
            for name, n in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
                vector(p + name + ".bias", n, 0.0)
        if arch == "gemma3":
            vector(p + "attn_q_norm.weight", 64, 0.0)
            vector(p + "attn_k_norm.weight", 64, 0.0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return folder / "k.gguf", cfg


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_k_quant_model_verify_rows_bit_identical(tmp_path, arch):
    """Q4_K/Q5_K/Q6_K super-blocks kept as they are, at model level: a GGUF file of each layout
    whose matrices are all K-quants (mixed within fused q/k/v and across layers) loads in its
    compact form and a token's logits in chain, tree, batched and wide passes have the bits of
    decoding it alone."""
    path, cfg = _write_k_quant_gguf(tmp_path, arch)
    weights = load_gguf_weights(path, cfg)
    stacked = Transformer(cfg, weights, CPU_KERNELS, 256)
    assert set(stacked.block_types) == {"Q4_K", "Q5_K", "Q6_K"}
    runner = NativeRunner(stacked, cfg, torch.float32, torch.device("cpu"), 256, num_slots=2)
    # the super-blocks' own bytes (Q6_K 210 per 256 values; Q4_K and Q5_K interleaved 148 and 180: their
    # packed scales unpacked), not widened scales; stacked layers keep their own widths (ffn_down: Q4_K in
    # layer 0, Q5_K in layer 1), and a fused q/k/v's rows theirs (quant.segmented: no padding between its parts)
    wqkv, down = runner.fused.weights.wqkv, runner.fused.weights.w_down
    assert [len(set(widths) - {0}) for widths in wqkv.segments[:, :, 2]] == [3, 3]  # Q4_K, Q5_K and Q6_K rows
    assert list(np.diff(wqkv.at)) == [int(quant.row_bytes(fmt, cfg.hidden_size).sum()) for fmt in wqkv.fmt]
    assert list(down.segments[:, 0, 2]) == [2 * 148, 2 * 180]
    assert down.q.nbytes == 256 * (2 * 148 + 2 * 180)
    # interleaved at load: 16 rows a group for the AVX-512 kernels
    wide = clib.wide_groups()
    assert set(runner.fused.weights.w_down[3][0]) == {quant.Q4KX16 if wide else quant.Q4KX8}
    assert set(runner.fused.weights.w_down[3][1]) == {quant.Q5KX16 if wide else quant.Q5KX8}
    logits = runner.run([SeqInput(runner.allocate(), [3, 40, 500])]).logits[0]
    assert torch.isfinite(logits).all() and logits.std() > 0
    runner.free(0)
    assert_verify_rows_bit_identical(runner)


@pytest.mark.parametrize("isa, flags", [("avx2", "-mno-avx512f -mno-avxvnni"), ("scalar", "-mno-avx2 -mno-avx512f")])
def test_k_quant_model_bit_identity_on_the_narrower_paths(isa, flags):
    """The same model-level check with the kernels built for AVX2 alone (what most CPUs run) and
    for none (portable C), each in a process of its own: an AVX-512 machine tests them too."""
    import os
    import subprocess
    import sys

    if isa == "avx2" and clib.isa() == "scalar":
        pytest.skip("no AVX2 on this CPU")
    code = (f"import sys, pytest; from specdec.model import clib; assert clib.isa() == {isa!r}, clib.isa(); "
            "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', "
            "'tests/test_quant.py::test_k_quant_model_verify_rows_bit_identical']))")
    env = {**os.environ, "SPECDEC_QKERNELS_CFLAGS": flags}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                          cwd=os.path.dirname(os.path.dirname(__file__)))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "3 passed" in done.stdout
