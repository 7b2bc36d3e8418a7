"""CPU kernels (numba) for decode and verify passes: the products (float and quantized), their
epilogues (the LM head's argmax, the MLP's gated activation), the read floor. The decoder stack that
calls them (attention, norms, rope, ``decode_layers``) is ``decoder_kernels``.

``matmul`` (the products) keeps a block of 4 weight rows x 4 token rows in
registers (16 accumulators), so each weight row is read from memory once per
pass and each load feeds 2 FMAs; the two cores split the weight rows. Blocks
beyond the last weight or token row *clamp* to it (the duplicate results are
dropped), so every output element comes from the same 4x4 code.

Bit-identity. Each output element is one dot product whose summation order
depends only on its weight row and input row, never on how many rows share the pass or
where a row sits in its 4-row block; so a token's logits in a K-token verification pass
are bit-identical to the same token decoded alone
(``test_verify_rows_are_bit_identical_to_decoding_alone`` pins it).

Weights are float32, or bfloat16 as their raw uint16 bits (widened to float32 in
registers: reading half the bytes is what matters); arithmetic is float32.
"""

from __future__ import annotations

import ctypes

import numba
import numpy as np
import torch
from numba import njit, prange, types
from numba.extending import overload

from specdec.errors import ModelLoadError
from specdec.model.clib import cpu_has_amx, load_qkernels, numba_cache_dir
from specdec.model.layouts import K_LAYOUTS
from specdec.model.weight_names import GATE_UP_BLOCK, gate_up_block

if not numba.config.CACHE_DIR:  # unless the user chose one (NUMBA_CACHE_DIR): one folder per C build
    numba.config.CACHE_DIR = str(numba_cache_dir())

try:  # before any caller of its functions compiles
    load_qkernels().sd_set_threads(ctypes.c_int64(numba.get_num_threads()))
except ModelLoadError:  # no C compiler: backend.kernels_compile raises it again, and torch runs instead
    pass

_CHUNKS = 64  # units of parallel work per matmul (each with its own widening buffer)
_FLAGS = dict(fastmath=True, cache=True, boundscheck=False, error_model="numpy")


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor; a 16-bit float as its raw bits (numba has neither type; the element type
    tells the kernels which): bfloat16 in uint16, float16 (a KV cache's) in int16."""
    bits = {torch.bfloat16: np.uint16, torch.float16: np.int16}.get(t.dtype)
    return t.numpy() if bits is None else t.view(torch.int16).numpy().view(bits)


# -- float32 <-> stored element --------------------------------------------------------------
def _widen(src, dst):  # pragma: no cover - replaced by the overload below
    """dst[:] = src as float32 (src float32, or bfloat16 bits as uint16)."""


@overload(_widen, inline="always")
def _widen_impl(src, dst):
    if src.dtype == types.uint16:

        def widen(src, dst):
            bits = dst.view(np.uint32)
            for i in range(src.shape[0]):
                bits[i] = np.uint32(src[i]) << np.uint32(16)

        return widen

    def copy(src, dst):
        for i in range(src.shape[0]):
            dst[i] = src[i]

    return copy


# -- products ---------------------------------------------------------------------------------
@njit(inline="always", **_FLAGS)
def _block4x4(w, r0, r1, r2, r3, x, m0, out, n0):  # pragma: no cover - compiled
    """out[m0:m0+4, n0:n0+4] = x[m0:m0+4] @ w[(r0, r1, r2, r3)].T, rows past the end clamped."""
    M, K, N = x.shape[0], x.shape[1], out.shape[1]
    m1, m2, m3 = min(m0 + 1, M - 1), min(m0 + 2, M - 1), min(m0 + 3, M - 1)
    a00 = a01 = a02 = a03 = np.float32(0.0)
    a10 = a11 = a12 = a13 = np.float32(0.0)
    a20 = a21 = a22 = a23 = np.float32(0.0)
    a30 = a31 = a32 = a33 = np.float32(0.0)
    for k in range(K):
        w0, w1, w2, w3 = w[r0, k], w[r1, k], w[r2, k], w[r3, k]
        x0, x1, x2, x3 = x[m0, k], x[m1, k], x[m2, k], x[m3, k]
        a00 += w0 * x0
        a01 += w1 * x0
        a02 += w2 * x0
        a03 += w3 * x0
        a10 += w0 * x1
        a11 += w1 * x1
        a12 += w2 * x1
        a13 += w3 * x1
        a20 += w0 * x2
        a21 += w1 * x2
        a22 += w2 * x2
        a23 += w3 * x2
        a30 += w0 * x3
        a31 += w1 * x3
        a32 += w2 * x3
        a33 += w3 * x3
    nv = min(4, N - n0)
    for j in range(min(4, M - m0)):
        if j == 0:
            c0, c1, c2, c3 = a00, a01, a02, a03
        elif j == 1:
            c0, c1, c2, c3 = a10, a11, a12, a13
        elif j == 2:
            c0, c1, c2, c3 = a20, a21, a22, a23
        else:
            c0, c1, c2, c3 = a30, a31, a32, a33
        row = m0 + j
        out[row, n0] = c0
        if nv > 1:
            out[row, n0 + 1] = c1
        if nv > 2:
            out[row, n0 + 2] = c2
        if nv > 3:
            out[row, n0 + 3] = c3


def _weight_block(w, n0, buf):  # pragma: no cover - replaced by the overload below
    """The 4 weight rows from n0 (clamped) as float32: w itself, or widened into buf."""


@overload(_weight_block, inline="always")
def _weight_block_impl(w, n0, buf):
    if w.dtype == types.uint16:

        def widen(w, n0, buf):
            last = w.shape[0] - 1
            for i in range(4):
                _widen(w[min(n0 + i, last)], buf[i])
            return buf, 0, 1, 2, 3

        return widen

    def view(w, n0, buf):
        last = w.shape[0] - 1
        return w, n0, min(n0 + 1, last), min(n0 + 2, last), min(n0 + 3, last)

    return view


@njit(parallel=True, **_FLAGS)
def matmul(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """out[M, N] = x[M, K] @ w[N, K].T; w float32 or bfloat16 bits, x and out float32, C order."""
    n_out, k_in = w.shape
    n_blocks = (n_out + 3) // 4
    per_chunk = (n_blocks + _CHUNKS - 1) // _CHUNKS
    for chunk in prange(_CHUNKS):
        buf = np.empty((4, k_in), dtype=np.float32)
        for block in range(chunk * per_chunk, min(n_blocks, (chunk + 1) * per_chunk)):
            n0 = block * 4
            wb, r0, r1, r2, r3 = _weight_block(w, n0, buf)
            for m0 in range(0, x.shape[0], 4):
                _block4x4(wb, r0, r1, r2, r3, x, m0, out, n0)


# -- quantized products (GGUF blocks, qkernels.c) ---------------------------------------------
# qkernels.c's functions (the products; attention's jobs: decoder_kernels), resolved by name when numba
# compiles or loads a caller: the library is loaded at import (above).
_i = types.intp
_sd_prepare = types.ExternalFunction("sd_prepare", types.void(*([_i] * 12)))
_sd_qmatmul = types.ExternalFunction("sd_qmatmul", types.void(*([_i] * 21)))
_sd_dequantize_rows = types.ExternalFunction("sd_dequantize_rows", types.void(*([_i] * 11)))
_sd_span = types.ExternalFunction("sd_span", types.int64(_i, _i, _i, _i))
_sd_read = types.ExternalFunction("sd_read", types.uint64(_i, _i, _i))
_sd_threads = types.ExternalFunction("sd_threads", types.int64())  # numba's thread count, set at import (qkernels.c)
_sd_claim = types.ExternalFunction("sd_claim", types.int64(_i))
_sd_finish = types.ExternalFunction("sd_finish", types.void(_i))
_sd_await = types.ExternalFunction("sd_await", types.void(_i, types.int64))
_sd_gated = types.ExternalFunction("sd_gated", types.void(*([_i] * 6)))
_sd_stream_rows = types.ExternalFunction("sd_stream_rows", types.int64())
_sd_first_max = types.ExternalFunction("sd_first_max", types.int64(_i, _i))
_sd_softmax_blocks = types.ExternalFunction("sd_softmax_blocks", types.void(_i, _i, types.float32, _i, _i))
SOFTMAX_BLOCK = 64  # qkernels.c's: the columns of a block of ``softmax_blocks`` (row_dist.BLOCK)
# a product's unit of work: 16 weight rows, so interleaved groups stay whole and AMX pairs them
_UNIT = 16
# a quantized product's chunks, the most a thread takes at once (sd_span: its own run, then the others' tails);
# 32 slowed the 0.5B draft's 8-token pass. A small matrix gets fewer, of at least _CHUNK_BYTES of weights:
# each chunk starts its reads afresh (new streams for the prefetcher to find), and 16 chunks of SmolLM2's
# 200-350 KB attention matrices were a few KB each. Zen 2, `bench passes`, alternated three times: the
# 135M's 1-token pass 6.1-6.3 -> 5.5-5.8 ms, the 0.5B's 14.8-15.5 -> 13.8-14.5; the 1.5B's the same.
_QCHUNKS = 16
_CHUNK_BYTES = 131072
# activation rows per sweep over the weights in a long pass (a prompt's hundreds of rows): AMX tiles
# share each unpacked weight block among 64 rows (Qwen2.5-Coder-1.5B prefill of 512 tokens 5.47 ->
# 4.80 s on Sapphire Rapids against 16); elsewhere 16 rows keep the activations in a small L2
_QROWS = 64 if cpu_has_amx() else 16
_PARALLEL_PREPARE = 4  # activation rows from which every thread quantizes some inside the product's region
_QSWEEP = 32  # a pass up to this wide (decode, verify, a batch's drafts) sweeps the weights once


@njit(**_FLAGS)
def _activation_forms(fmt, segments):  # pragma: no cover - compiled
    """Which quantized activations sd_prepare must make for rows of these layouts: bit 0 the 32-value
    blocks (U4M, U8M, I8, the 32-value interleaved), bit 1 q8_K (layouts.K_LAYOUTS). A segment's rows share
    its first row's layout (``quant.segmented``), so a product looks at a few rows, not at every one of them
    (a scan of the fmt rows, vectorised, took 20 us for an LM head of 152K rows, ~0.1 ms of a 1.5B's pass)."""
    kq = False
    other = False
    for i in range(segments.shape[0]):
        if segments[i, 0] < fmt.shape[0]:  # (not padding)
            f = fmt[segments[i, 0]]
            is_k = False
            for layout in K_LAYOUTS:
                is_k |= f == layout
            kq |= is_k
            other |= not is_k
    return (2 if kq else 0) | (1 if other else 0)


@njit(parallel=True, **_FLAGS)
def qmatmul(q, s, m, fmt, segments, x, out, gated=None, softmax=None):  # pragma: no cover - compiled
    """out[M, N] = x[M, K] @ W.T for W in quantized layout (``quant.QuantArrays``: q uint8 bytes, s/m [N, *] float32,
    fmt [N] int8, segments; see qkernels.c); x and out float32, C order.

    A pass of up to _QSWEEP rows reads the weights once: a batch of 16 sequences that drafts a
    token is 17 rows, and sweeping the weights twice for it cost 38% more than 16 rows (SmolLM2,
    Zen 4). Longer passes (a prompt's hundreds of rows) go _QROWS at a time: each weight row
    then meets a few KB of activations in L1/L2 instead of streaming all of them from L3.
    Bit-identity does not depend on the split: each row's products are the same instructions.

    gated: (act [M, N / 2], gelu) for a ``w_gate_up`` matrix (``gated_product``): each span of whole 32-row
    block pairs then writes act(gate) * up of its columns too, while its output is in L1.
    softmax: (inv_t [M], top, sums) for an LM head whose sampled rows the verifier reads in blocks (``softmax_blocks``):
    each span of whole blocks writes their maxima and sums of terms too, on the thread that wrote them, from L1.
    """
    rows, k = x.shape
    n_out = fmt.shape[0]
    block = rows if rows <= _QSWEEP else _QROWS
    act = _activations(block, k)
    threads = _sd_threads()
    unit = _UNIT if gated is None else 2 * GATE_UP_BLOCK
    if softmax is not None:
        unit = SOFTMAX_BLOCK
    units = (n_out + unit - 1) // unit
    most = _span_cap(rows, units, max(threads, min(_QCHUNKS, q.size // _CHUNK_BYTES)))
    need = _activation_forms(fmt, segments)
    for r0 in range(0, rows, block):
        n_rows = min(block, rows - r0)
        dst = out[r0:]
        runs = _runs(units, threads)  # each block's sweep takes the units afresh
        # one iteration a thread (sd_span: its own run, then others' tails); from _PARALLEL_PREPARE rows
        # the threads first quantize the rows together. Two regions: one for every width, its claims skipped below
        # 4 rows, cost 1.1-1.4 us a product at 1-2 rows (Zen 4, alternated in one process, an empty numba cache)
        if n_rows >= _PARALLEL_PREPARE:
            ready = np.zeros(16, dtype=np.int64)  # the activation rows: [0] the next to claim, [8] those done
            for t in prange(threads):
                _prepare_share(x, r0, n_rows, act, need, ready)
                _take_spans(t, threads, runs, most, unit, q, s, m, fmt, segments, act, n_rows, dst, gated, r0, softmax)
        else:
            _prepare(x, r0, n_rows, act, 0, need)
            for t in prange(threads):
                _take_spans(t, threads, runs, most, unit, q, s, m, fmt, segments, act, n_rows, dst, gated, r0, softmax)


@njit(**_FLAGS)
def _take_spans(t, threads, runs, most, unit, q, s, m, fmt, segments, act, n_rows, dst, gated, r0,
                softmax):  # pragma: no cover - compiled
    """Thread t's spans of a product: its own run, then the others' tails (sd_span); with ``gated`` (qmatmul's),
    each span's activations of rows r0 .. r0 + n_rows, with ``softmax`` its blocks' maxima and sums."""
    span = _sd_span(runs.ctypes.data, t, threads, most)
    while span >= 0:
        n0, n1 = _span_rows(span, unit, fmt.shape[0])
        _qchunk(q, s, m, fmt, segments, act, n_rows, dst.ctypes.data, dst.shape[1], n0, n1)
        if gated is not None:
            for r in range(n_rows):
                gated_columns(dst[r], gated[1], gated[0][r0 + r], n0 // 2, n1 // 2)
        if softmax is not None:
            for r in range(n_rows):
                _softmax_columns(dst[r], softmax, r0 + r, n0, n1)
        span = _sd_span(runs.ctypes.data, t, threads, most)


@njit(**_FLAGS)
def _prepare_share(x, r0, n_rows, act, need, ready):  # pragma: no cover - compiled
    """Rows r0 .. r0 + n_rows of x quantized by every thread of a region, a row a claim (sd_claim); back once
    all are (sd_await). A row's quantized forms are sd_prepare's whichever thread makes them."""
    r = _sd_claim(ready.ctypes.data)
    while r < n_rows:
        _prepare(x, r0 + r, 1, act, r, need)
        _sd_finish(ready.ctypes.data + 64)
        r = _sd_claim(ready.ctypes.data)
    _sd_await(ready.ctypes.data + 64, n_rows)


@njit(parallel=True, **_FLAGS)
def read_bytes(buf, streams):  # pragma: no cover - compiled
    """The OR of buf's (uint8) 8-byte words, every thread reading its share as ``streams`` runs in turn
    (qkernels.c's sd_read): the read floor under a pass, in the order the products read weights."""
    threads = _sd_threads()
    share = buf.shape[0] // threads
    words = np.zeros(threads, dtype=np.uint64)
    for t in prange(threads):
        n = share if t < threads - 1 else buf.shape[0] - t * share
        words[t] = _sd_read(buf.ctypes.data + t * share, n, streams)
    acc = np.uint64(0)
    for t in range(threads):
        acc |= words[t]
    return acc


@njit(**_FLAGS)
def _runs(units, threads):  # pragma: no cover - compiled
    """sd_span's state: thread t's contiguous run of the units, its next (low 32 bits) and end (high 32)."""
    runs = np.empty(threads, dtype=np.int64)
    for t in range(threads):
        runs[t] = ((t + 1) * units // threads) << 32 | (t * units // threads)
    return runs


@njit(**_FLAGS)
def _activations(rows, k):  # pragma: no cover - compiled
    """Scratch for ``rows`` activation rows in every quantized form sd_prepare makes: the 32-value
    blocks (int8 values, scales, block sums, nibble-lane sums) and q8_K (values, scales, 16-value sums,
    and those sums as the 16-row tiles take them: qkernels.c's BW_WORDS words a row)."""
    return (np.empty((rows, k), dtype=np.int8), np.empty((rows, k // 4), dtype=np.float32),
            np.empty((rows, k // 32), dtype=np.float32), np.empty((rows, k // 4), dtype=np.int32),
            np.empty((rows, k), dtype=np.int8), np.empty((rows, max(1, k // 256)), dtype=np.float32),
            np.empty((rows, k // 16), dtype=np.int16), np.empty((rows, k // 64), dtype=np.int32))


@njit(**_FLAGS)
def _prepare(x, r0, n_rows, act, at, need):  # pragma: no cover - compiled
    """Rows r0 .. r0 + n_rows of x in the quantized forms ``need`` names (``_activation_forms``), into the
    activations' rows from ``at`` (sd_prepare's rows are independent of each other)."""
    xq, dx8, bs32, nxl, xk, dk, bk, bw = act
    _sd_prepare(x[r0:].ctypes.data, n_rows, x.shape[1], xq[at:].ctypes.data, dx8[at:].ctypes.data,
                bs32[at:].ctypes.data, nxl[at:].ctypes.data, xk[at:].ctypes.data, dk[at:].ctypes.data,
                bk[at:].ctypes.data, bw[at:].ctypes.data, need)


@njit(**_FLAGS)
def _span_cap(rows, units, chunks):  # pragma: no cover - compiled
    """The most units sd_span hands a thread at once for a product of ``rows`` activation rows: a ``chunks``-th, or
    all of them (its run in halving spans) where the build reads such a product with qkernels_x8.h's x8_streams
    (AVX2 without VNNI, 1-2 rows: sd_stream_rows). x8_streams reads a span as 4 runs in turn, and the capped spans of
    the 1.5B's q/k/v and output matrices (16 and 20 groups) left runs of 4-5 groups, too short for the hardware
    prefetcher: 17-19 GB/s a core against 29-34 for whole runs (scripts/tile_rate.c, both cores, Q4_K at 1 row, Zen 4).
    Whole passes of the 1.5B on the AVX2 build, capped / uncapped alternated in one process (the order swapped every
    round, 24 rounds): 1 and 2 tokens 1.034-1.043 and 1.032-1.033. On the AVX-512 build, which reads a group at a
    time, the same measure read 0.996-1.018 at 1, 2 and 4 tokens (the 0.5B's 1-token pass 0.996-1.001): left capped."""
    return units if rows <= _sd_stream_rows() else (units + chunks - 1) // chunks


@njit(**_FLAGS)
def _span_rows(span, unit, n_out):  # pragma: no cover - compiled
    """The weight rows n0:n1 of an sd_span span of ``unit``-row units."""
    return (span >> 32) * unit, min(n_out, (span & 0xFFFFFFFF) * unit)


@njit(**_FLAGS)
def _qchunk(q, s, m, fmt, segments, act, n_rows, out_ptr, out_stride, n0, n1, r0=0):  # pragma: no cover - compiled
    """Weight rows n0:n1 of the product over the activations' rows r0 .. r0 + n_rows: out_ptr's element (r, n) at
    (r - r0) * out_stride + n."""
    xq, dx8, bs32, nxl, xk, dk, bk, bw = act
    _sd_qmatmul(q.ctypes.data, segments.ctypes.data, segments.shape[0], s.ctypes.data, m.ctypes.data,
                fmt.ctypes.data, s.shape[1], xq.shape[1],
                _row(xq, r0), _row(dx8, r0), _row(bs32, r0), _row(nxl, r0), _row(xk, r0), _row(dk, r0),
                _row(bk, r0), _row(bw, r0), n_rows, out_ptr, out_stride, n0, n1)


@njit(inline="always", **_FLAGS)
def _row(a, r):  # pragma: no cover - compiled
    """The address of row r of a C-contiguous 2-D array."""
    return a.ctypes.data + r * a.strides[0]


# an LM head's spans in ``qmatmul_argmax`` (capped: _span_cap): at most 1,200 of 151,936 rows, [8, 1200] floats in
# L1/L2
_HEAD_CHUNKS = 128


@njit(parallel=True, **_FLAGS)
def qmatmul_argmax(q, s, m, fmt, segments, x, best, parent, token):  # pragma: no cover - compiled
    """best[M] = each row's argmax of x[M, K] @ W.T (``qmatmul``'s product, the same bits) without writing
    the [M, N] product: each span's part ([M, <= 1200] where capped) passes through a buffer of its own and leaves
    its row maxima, combined in column order. Ties go to the lower column, as torch.argmax (for
    finite logits).

    Greedy verification reads a row only where the walk reaches it: row r (parent[r] >= 0, a row of x) is reached
    only if its parent row's argmax is token[r]. That fails as soon as a span's maximum in the parent row beats
    the logit at token[r] (``_drafts_beaten``), found before the sweep; from then on r and its descendants leave
    the product (in a verify pass past the first rejected draft, most of the rows) and their best is -1. Every row
    the walk can reach keeps every column, and every logit is computed as in the whole product: the same bits.
    parent all -1: every row's argmax."""
    rows, k = x.shape
    n_out = fmt.shape[0]
    act = _activations(rows, k)
    units = (n_out + _UNIT - 1) // _UNIT
    most = _span_cap(rows, units, _HEAD_CHUNKS)
    top = np.empty((units, rows), dtype=np.float32)  # a span's maxima at its first unit
    at = np.empty((units, rows), dtype=np.int64)
    starts = np.zeros(units, dtype=np.bool_)
    need = _activation_forms(fmt, segments)
    _prepare(x, 0, rows, act, 0, need)
    bar, watch = _draft_logits(q, s, m, fmt, segments, act, parent, token)
    dead = np.zeros(rows, dtype=np.bool_)  # rows shown unreachable, by any thread
    threads = _sd_threads()
    runs = _runs(units, threads)
    for t in prange(threads):  # as qmatmul: each thread's run of spans, then the others' tails
        _argmax_spans(q, s, m, fmt, segments, x, need, act, runs, t, threads, most, parent, token, bar, watch, dead,
                      top, at, starts)
    live = np.empty(rows, dtype=np.int64)
    n_live = _live_rows(parent, dead, live, np.empty(rows, dtype=np.bool_))
    best[:] = -1
    for i in range(n_live):
        r = live[i]
        c = 0  # unit 0 always starts a span
        for u in range(1, units):
            if starts[u] and top[u, r] > top[c, r]:
                c = u
        best[r] = at[c, r]


@njit(**_FLAGS)
def _argmax_spans(q, s, m, fmt, segments, x, need, act, runs, t, threads, most, parent, token, bar, watch, dead, top,
                  at, starts):  # pragma: no cover - compiled
    """Thread t's spans of ``qmatmul_argmax``: each span's maxima of the live rows into top and at (rows by their
    index in x), then the drafts they beat marked dead. The live rows' activations, when rows leave, are quantized
    again from x into a thread's own scratch (sd_prepare's rows are independent: the same bytes)."""
    rows, k = x.shape
    n_out = fmt.shape[0]
    live = np.empty(rows, dtype=np.int64)  # the rows this thread computes, ascending
    flags = np.empty(rows, dtype=np.bool_)  # scratch of _live_rows and _drafts_beaten
    n_live = _live_rows(parent, dead, live, flags)
    mine = act if n_live == rows else _live_activations(x, need, live, n_live)  # the live rows', packed
    span = _sd_span(runs.ctypes.data, t, threads, most)
    while span >= 0:
        now = _live_rows(parent, dead, live, flags)
        if now != n_live:
            n_live = now
            mine = _live_activations(x, need, live, n_live)
        n0, n1 = _span_rows(span, _UNIT, n_out)
        part = np.empty((n_live, n1 - n0), dtype=np.float32)
        _qchunk(q, s, m, fmt, segments, mine, n_live, part.ctypes.data - 4 * n0, n1 - n0, n0, n1)
        u = span >> 32
        for i in range(n_live):
            j = _first_max(part[i])
            top[u, live[i]], at[u, live[i]] = part[i, j], n0 + j
        _drafts_beaten(parent, token, bar, watch, live, n_live, top[u], at[u], dead, flags)
        starts[u] = True
        span = _sd_span(runs.ctypes.data, t, threads, most)


@njit(**_FLAGS)
def _live_activations(x, need, live, n):  # pragma: no cover - compiled
    """Rows live[:n] of x quantized into activations of their own, in that order."""
    act = _activations(n, x.shape[1])
    for i in range(n):
        _prepare(x, live[i], 1, act, i, need)
    return act


@njit(**_FLAGS)
def _draft_logits(q, s, m, fmt, segments, act, parent, token):  # pragma: no cover - compiled
    """(bar, watch): bar[r] = the logit at token[r] in row parent[r], where watch[r] (parent[r] >= 0 and token[r] a
    column; fastmath: no NaN to mark the others): the unit holding it over the parent row alone, the bits the sweep
    gives it among every row (a row's logits do not depend on the rows beside it: tests/test_runner.py)."""
    rows = parent.shape[0]
    n_out = fmt.shape[0]
    bar = np.zeros(rows, dtype=np.float32)
    watch = np.zeros(rows, dtype=np.bool_)
    part = np.empty(_UNIT, dtype=np.float32)
    for r in range(rows):
        p = parent[r]
        if p >= 0 and 0 <= token[r] < n_out:
            watch[r] = True
            n0 = token[r] // _UNIT * _UNIT
            n1 = min(n_out, n0 + _UNIT)
            _qchunk(q, s, m, fmt, segments, act, 1, part.ctypes.data - 4 * n0, n1 - n0, n0, n1, p)
            bar[r] = part[token[r] - n0]
    return bar, watch


@njit(**_FLAGS)
def _live_rows(parent, dead, live, gone):  # pragma: no cover - compiled
    """live[:n] := the rows neither shown unreachable nor below one (parents come before their children); n.
    gone: scratch [rows]."""
    rows = parent.shape[0]
    n = 0
    for r in range(rows):
        gone[r] = dead[r] or (parent[r] >= 0 and gone[parent[r]])
        if not gone[r]:
            live[n] = r
            n += 1
    return n


@njit(**_FLAGS)
def _drafts_beaten(parent, token, bar, watch, live, n_live, top, at, dead, here):  # pragma: no cover - compiled
    """dead[c] := True for each watched child c of a live row whose span maximum (top, at: per row) beats the logit
    at c's token (bar[c]): a larger value, or an equal one at a lower column (argmax takes the first), so the
    parent's argmax is not token[c]. A span's first maximum beats it whenever any of the span's columns does. here:
    scratch [rows]."""
    here[:] = False
    for i in range(n_live):
        here[live[i]] = True
    for c in range(parent.shape[0]):
        p = parent[c]
        if watch[c] and here[p] and not dead[c] and (top[p] > bar[c] or (top[p] == bar[c] and at[p] < token[c])):
            dead[c] = True


@njit(**_FLAGS)
def _first_max(v):  # pragma: no cover - compiled
    """The first index of the largest value of v (contiguous; qkernels.c's sd_first_max, vectorised)."""
    return _sd_first_max(v.ctypes.data, v.shape[0])


@njit(**_FLAGS)
def _softmax_columns(row, softmax, r, n0, n1):  # pragma: no cover - compiled
    """Blocks n0 / 64 .. of row r's columns n0:n1 (n0 on a block's start) into softmax's top and sums, where
    softmax's inv_t[r] asks for them (> 0)."""
    inv_t, top, sums = softmax
    if inv_t[r] > 0:
        b = n0 // SOFTMAX_BLOCK
        _sd_softmax_blocks(row.ctypes.data + 4 * n0, n1 - n0, inv_t[r], _row(top, r) + 4 * b, _row(sums, r) + 4 * b)


@njit(parallel=True, **_FLAGS)
def softmax_blocks(logits, softmax):  # pragma: no cover - compiled
    """softmax = (inv_t [M] float32, top [M, B], sums [M, B]): for each row r of logits [M, V] with inv_t[r] > 0, each
    64-column block's largest logit and the sum of exp((logit - it) x inv_t[r]) over the block (qkernels.c's
    sd_softmax_blocks; B = ceil(V / 64)): a sampled row's distribution as ``row_dist.BlockDist`` reads it. A block's
    values do not depend on the columns computed with it: a quantized head's spans write the same bits."""
    for r in prange(logits.shape[0]):
        _softmax_columns(logits[r], softmax, r, 0, logits.shape[1])


@njit(parallel=True, **_FLAGS)
def argmax_rows(logits, best):  # pragma: no cover - compiled
    """best[M] = each row's ``_first_max`` of logits [M, N] (a float head's product, written whole)."""
    for r in prange(logits.shape[0]):
        best[r] = _first_max(logits[r])


@njit(**_FLAGS)
def dequantize_rows(q, s, m, fmt, segments, k, ids, out):  # pragma: no cover - compiled
    """out[i] = row ids[i] of the quantized matrix, as float32 (the embedding lookup)."""
    _sd_dequantize_rows(q.ctypes.data, segments.ctypes.data, segments.shape[0], s.ctypes.data, m.ctypes.data,
                        fmt.ctypes.data, s.shape[1], k,
                        ids.ctypes.data, ids.shape[0], out.ctypes.data)


def product(w, x, out):  # pragma: no cover - replaced by the overload below
    """out = x @ w.T for a float matrix (``matmul``) or a quantized one, a (q, s, m, fmt) tuple."""


@overload(product, inline="always")
def _product_impl(w, x, out):
    if isinstance(w, types.BaseTuple):
        return lambda w, x, out: qmatmul(w[0], w[1], w[2], w[3], w[4], x, out)
    return lambda w, x, out: matmul(w, x, out)


# -- the gated activation (an MLP's act(gate) * up) ----------------------------------------------
_gate_up_block = njit(cache=True)(gate_up_block)


@njit(**_FLAGS)
def gated_columns(gate_up, gelu, out, c0, c1):  # pragma: no cover - compiled
    """out[c0:c1] = act(gate) * up for columns c0:c1 (whole blocks) of one row of a ``w_gate_up`` product, whose
    gate and up halves alternate in blocks (``weight_names.gate_up_block``): qkernels.c's sd_gated, vectorised
    (libm's expf a value at a time was 214 us of an 8-row layer of Qwen2.5-Coder-1.5B, 6 ms of its 8-token pass;
    numba's loops over 16-value blocks did not vectorise: a row of 8,960 values 7.4 us there, 5.5 us in C, 4.7 in
    numba's single sweep of the old [gate | up] layout; the same bits as numba's blocks). A value's bits do not
    depend on the columns computed with it."""
    _sd_gated(gate_up.ctypes.data, c0, c1, _gate_up_block(out.shape[0]), gelu, out.ctypes.data)


# rows from which the gated activation runs on every core: a parallel region costs ~1 us (two threads, Zen 4)
# against ~4.9 us a row of Qwen2.5-Coder-1.5B's 8,960 values; alone against on both cores, best of 3 x 3,000
# in one process: 2 / 4 / 8 / 16 rows 9.3 / 17.7 / 35.4 / 76.8 -> 7.2 / 12.2 / 22.4 / 43.5 us (1 row 4.9 -> 7.2;
# measured on the numba sweep sd_gated replaced, 4.7 us a row against its 5.5)
_PARALLEL_ACTIVATIONS = 2


@njit(parallel=True, **_FLAGS)
def gated_activation(gate_up: np.ndarray, gelu: bool, out: np.ndarray) -> None:  # pragma: no cover
    """out = act(gate) * up for a ``w_gate_up`` product [N, 2 I] (``gated_columns``) where the product did not
    (a float matrix, or halves of one block each): a decode pass's row on this thread (a parallel region costs
    more than it does), a verify pass's or a prompt's rows on every core."""
    rows, inter = out.shape
    if rows < _PARALLEL_ACTIVATIONS:
        for r in range(rows):
            gated_columns(gate_up[r], gelu, out[r], 0, inter)
        return
    chunks = min(rows, _CHUNKS)
    per_chunk = (rows + chunks - 1) // chunks
    for chunk in prange(chunks):
        for r in range(chunk * per_chunk, min(rows, (chunk + 1) * per_chunk)):
            gated_columns(gate_up[r], gelu, out[r], 0, inter)


def gated_product(w, x, gelu, out, act):  # pragma: no cover - replaced by the overload below
    """out = x @ w.T for a ``w_gate_up`` matrix (``product``), then act = act(gate) * up (``gated_columns``): inside
    a quantized product each span's columns as soon as its tiles wrote them (in L1, on the thread that wrote
    them), where 16-row blocks let a span hold both halves of its columns; otherwise after the product."""


@overload(gated_product, inline="always")
def _gated_product_impl(w, x, gelu, out, act):
    if isinstance(w, types.BaseTuple):

        def quantized(w, x, gelu, out, act):
            if _gate_up_block(act.shape[1]) == GATE_UP_BLOCK:
                qmatmul(w[0], w[1], w[2], w[3], w[4], x, out, (act, gelu))
            else:
                qmatmul(w[0], w[1], w[2], w[3], w[4], x, out)
                gated_activation(out, gelu, act)

        return quantized

    def dense(w, x, gelu, out, act):
        matmul(w, x, out)
        gated_activation(out, gelu, act)

    return dense


def layer_weight(w, layer):  # pragma: no cover - replaced by the overload below
    """Layer ``layer``'s matrix of a stack: w[layer], or the (q, s, m, fmt, segments) of a quantized stack
    (``quant.stack``: q is every layer's bytes back to back, layer l's from w[4][l], placed by w[5][l];
    ``quant.stack_layer`` is the same outside compiled code)."""


@overload(layer_weight, inline="always")
def _layer_weight_impl(w, layer):
    if isinstance(w, types.BaseTuple):

        def quantized(w, layer):
            return (w[0][w[4][layer]:w[4][layer + 1]], w[1][layer], w[2][layer], w[3][layer], w[5][layer])

        return quantized
    return lambda w, layer: w[layer]


def stack_rows(w):  # pragma: no cover - replaced by the overload below
    """Output rows of a stacked matrix [layers, rows, ...], float or quantized."""


@overload(stack_rows, inline="always")
def _rows_impl(w):
    if isinstance(w, types.BaseTuple):
        return lambda w: w[3].shape[1]
    return lambda w: w.shape[1]
