"""CPU kernels (numba) for decode and verify passes: the fused decoder stack and its parts.

A decode or verify pass runs a few rows (one per new token, over any mix of
sequences, chains and trees) through every layer. Done op by op in torch, each
of a layer's ~20 small ops pays dispatch and threading overhead; ``decode_layers``
runs the whole stack as one compiled call instead: per layer an RMSNorm, the
fused q/k/v product, q/k norms, rope, the cache write, attention, the output
projection, the residual, and the MLP.

``matmul`` (the products) keeps a block of 4 weight rows x 4 token rows in
registers (16 accumulators), so each weight row is read from memory once per
pass and each load feeds 2 FMAs; the two cores split the weight rows. Blocks
beyond the last weight or token row *clamp* to it (the duplicate results are
dropped), so every output element comes from the same 4x4 code.

``attention`` works per (8 rows of a sequence, KV head, 512-key chunk), each job
in C (qkernels_attention.h): every query head of the KV group meets the chunk's
keys and values while they sit in L1, so a chunk of the cache is read once per
8 rows, not once per row and head. Long contexts split into fixed key chunks that
both cores share; each row's chunks are combined in key order (softmax
rescaling), so the split never depends on the pass either.

Bit-identity. Each output element is one dot product whose summation order
depends only on its weight row and input row (for attention: its query and its
visible keys, one after another in key order, wherever they sit in the cache), never on
how many rows share the pass or where a row sits in its 4-row block; so a token's logits in a K-token verification pass
are bit-identical to the same token decoded alone
(``test_verify_rows_are_bit_identical_to_decoding_alone`` pins it).

Weights are float32, or bfloat16 as their raw uint16 bits (widened to float32 in
registers: reading half the bytes is what matters); arithmetic is float32. The
KV cache is float32 or bfloat16 bits likewise (written with round-to-nearest-even).
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np
import torch
from numba import njit, prange, types
from numba.extending import overload

from specdec.errors import ModelLoadError
from specdec.model.clib import cpu_has_amx, load_qkernels, numba_cache_dir

if not numba.config.CACHE_DIR:  # unless the user chose one (NUMBA_CACHE_DIR): one folder per C build
    numba.config.CACHE_DIR = str(numba_cache_dir())

try:
    load_qkernels()  # before any caller of its functions compiles
except ModelLoadError:  # no C compiler: backend.kernels_compile raises it again, and torch runs instead
    pass

_CHUNKS = 64  # units of parallel work per matmul (each with its own widening buffer)
_ATTENTION_ROWS = 8  # query rows per attention job: more jobs for two cores, few re-reads of the cache
_KEY_CHUNK = 512  # keys per attention job (split-K); fixed boundaries keep every row's bits
_FLAGS = dict(fastmath=True, cache=True, boundscheck=False, error_model="numpy")


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor; bfloat16 (which NumPy lacks) as its raw uint16 bits."""
    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()


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


def _store(dst, src):  # pragma: no cover - replaced by the overload below
    """dst[:] = src (float32) in dst's element type (bfloat16 bits: round to nearest even)."""


@overload(_store, inline="always")
def _store_impl(dst, src):
    if dst.dtype == types.uint16:

        def store(dst, src):
            wide = np.empty(dst.shape[0], dtype=np.float32)
            for i in range(dst.shape[0]):
                wide[i] = src[i]
            bits = wide.view(np.uint32)
            for i in range(dst.shape[0]):
                b = bits[i]
                dst[i] = np.uint16((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))

        return store

    def store(dst, src):
        for i in range(dst.shape[0]):
            dst[i] = src[i]

    return store


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
# qkernels.c's functions (the products here, attention's jobs below), resolved by name when numba
# compiles or loads a caller: the library is loaded at import (above).
_i = types.intp
_sd_prepare = types.ExternalFunction("sd_prepare", types.void(*([_i] * 11)))
_sd_qmatmul = types.ExternalFunction("sd_qmatmul", types.void(*([_i] * 19)))
_sd_dequantize_rows = types.ExternalFunction("sd_dequantize_rows", types.void(*([_i] * 10)))
_sd_attend = types.ExternalFunction("sd_attend", types.void(*([_i] * 9), types.float64, *([_i] * 4)))
_sd_take = types.ExternalFunction("sd_take", types.int64(_i, _i, _i))
_sd_read = types.ExternalFunction("sd_read", types.uint64(_i, _i, _i))
# units of parallel work per quantized product: each thread's run, then the others' tails (sd_take);
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
_QSWEEP = 32  # a pass up to this wide (decode, verify, a batch's drafts) sweeps the weights once


@njit(**_FLAGS)
def _activation_forms(fmt):  # pragma: no cover - compiled
    """Which quantized activations sd_prepare must make for rows of these layouts: bit 0 the 32-value
    blocks (U4M, U8M, I8, the 32-value interleaved), bit 1 q8_K (the K-quant layouts: quant.py's 4-8, 13, 14).
    Every product scans its fmt (152K rows for the LM head), so the loop has no branch and no early
    exit: it vectorizes, 20 us for those rows where a loop that stopped once both were seen took 170."""
    kq = np.uint8(0)
    other = np.uint8(0)
    for i in range(fmt.shape[0]):
        f = fmt[i]
        is_k = np.uint8((f >= 4) & (f <= 8)) | np.uint8(f >= 13)
        kq |= is_k
        other |= is_k ^ np.uint8(1)
    return (2 if kq else 0) | (1 if other else 0)


@njit(parallel=True, **_FLAGS)
def qmatmul(q, s, m, fmt, x, out):  # pragma: no cover - compiled
    """out[M, N] = x[M, K] @ W.T for W in quantized layout (q [N, *] uint8, s/m [N, *] float32,
    fmt [N] int8; see qkernels.c); x and out float32, C order.

    A pass of up to _QSWEEP rows reads the weights once: a batch of 16 sequences that drafts a
    token is 17 rows, and sweeping the weights twice for it cost 38% more than 16 rows (SmolLM2,
    Zen 4). Longer passes (a prompt's hundreds of rows) go _QROWS at a time: each weight row
    then meets a few KB of activations in L1/L2 instead of streaming all of them from L3.
    Bit-identity does not depend on the split: each row's products are the same instructions.
    """
    rows, k = x.shape
    n_out = q.shape[0]
    block = rows if rows <= _QSWEEP else _QROWS
    act = _activations(block, k)
    threads = numba.get_num_threads()
    chunks = max(threads, min(_QCHUNKS, q.size // _CHUNK_BYTES))
    per = _chunk_rows(n_out, chunks)
    need = _activation_forms(fmt)
    for r0 in range(0, rows, block):
        n_rows = min(block, rows - r0)
        _prepare(x, r0, n_rows, act, need)
        dst = out[r0:]
        runs = _runs(chunks, threads)  # each block's sweep takes the chunks afresh
        for t in prange(threads):  # one iteration a thread (sd_take: its own run of chunks, then others' tails)
            chunk = _sd_take(runs.ctypes.data, t, threads)
            while chunk >= 0:
                n0 = chunk * per
                if n0 < n_out:
                    _qchunk(q, s, m, fmt, act, n_rows, dst.ctypes.data, out.shape[1], n0, min(n_out, n0 + per))
                chunk = _sd_take(runs.ctypes.data, t, threads)


@njit(parallel=True, **_FLAGS)
def read_bytes(buf, streams):  # pragma: no cover - compiled
    """The OR of buf's (uint8) 8-byte words, every thread reading its share as ``streams`` runs in turn
    (qkernels.c's sd_read): the read floor under a pass, in the order the products read weights."""
    threads = numba.get_num_threads()
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
    """sd_take's state: thread t's contiguous run of the units, its next (low 32 bits) and end (high 32)."""
    runs = np.empty(threads, dtype=np.int64)
    for t in range(threads):
        runs[t] = ((t + 1) * units // threads) << 32 | (t * units // threads)
    return runs


@njit(**_FLAGS)
def _activations(rows, k):  # pragma: no cover - compiled
    """Scratch for ``rows`` activation rows in every quantized form sd_prepare makes: the 32-value
    blocks (int8 values, scales, block sums, nibble-lane sums) and q8_K (values, scales, 16-value sums)."""
    return (np.empty((rows, k), dtype=np.int8), np.empty((rows, k // 4), dtype=np.float32),
            np.empty((rows, k // 32), dtype=np.float32), np.empty((rows, k // 4), dtype=np.int32),
            np.empty((rows, k), dtype=np.int8), np.empty((rows, max(1, k // 256)), dtype=np.float32),
            np.empty((rows, k // 16), dtype=np.int16))


@njit(**_FLAGS)
def _prepare(x, r0, n_rows, act, need):  # pragma: no cover - compiled
    xq, dx8, bs32, nxl, xk, dk, bk = act
    _sd_prepare(x[r0:].ctypes.data, n_rows, x.shape[1], xq.ctypes.data, dx8.ctypes.data, bs32.ctypes.data,
                nxl.ctypes.data, xk.ctypes.data, dk.ctypes.data, bk.ctypes.data, need)


@njit(**_FLAGS)
def _chunk_rows(n_out, chunks):  # pragma: no cover - compiled
    """Weight rows per chunk: a multiple of 16, so interleaved groups stay whole and AMX pairs them."""
    return (n_out + 16 * chunks - 1) // (16 * chunks) * 16


@njit(**_FLAGS)
def _qchunk(q, s, m, fmt, act, n_rows, out_ptr, out_stride, n0, n1):  # pragma: no cover - compiled
    """Weight rows n0:n1 of the product: out_ptr's element (r, n) at r * out_stride + n."""
    xq, dx8, bs32, nxl, xk, dk, bk = act
    _sd_qmatmul(q.ctypes.data, s.ctypes.data, m.ctypes.data, fmt.ctypes.data, q.shape[1], s.shape[1], xq.shape[1],
                xq.ctypes.data, dx8.ctypes.data, bs32.ctypes.data, nxl.ctypes.data, xk.ctypes.data, dk.ctypes.data,
                bk.ctypes.data, n_rows, out_ptr, out_stride, n0, n1)


_HEAD_CHUNKS = 128  # an LM head's chunks in ``qmatmul_argmax``: 1,200 of 151,936 rows, [8, 1200] floats in L1/L2


@njit(parallel=True, **_FLAGS)
def qmatmul_argmax(q, s, m, fmt, x, best):  # pragma: no cover - compiled
    """best[M] = each row's argmax of x[M, K] @ W.T (``qmatmul``'s product, the same bits) without writing
    the [M, N] product: each chunk's [M, ~1200] part passes through a small buffer and leaves its row
    maxima, combined in chunk order. Ties go to the lower column, as torch.argmax (for finite logits)."""
    rows, k = x.shape
    n_out = q.shape[0]
    act = _activations(rows, k)
    per = _chunk_rows(n_out, _HEAD_CHUNKS)
    chunks = (n_out + per - 1) // per
    top = np.empty((chunks, rows), dtype=np.float32)
    at = np.empty((chunks, rows), dtype=np.int64)
    _prepare(x, 0, rows, act, _activation_forms(fmt))
    threads = numba.get_num_threads()
    runs = _runs(chunks, threads)
    for t in prange(threads):  # as qmatmul: each thread's run of chunks, then the others' tails
        chunk = _sd_take(runs.ctypes.data, t, threads)
        while chunk >= 0:
            n0, n1 = chunk * per, min(n_out, (chunk + 1) * per)
            part = np.empty((rows, n1 - n0), dtype=np.float32)
            _qchunk(q, s, m, fmt, act, rows, part.ctypes.data - 4 * n0, n1 - n0, n0, n1)  # part[r, n - n0]
            for r in range(rows):
                j = _first_max(part[r])
                top[chunk, r], at[chunk, r] = part[r, j], n0 + j
            chunk = _sd_take(runs.ctypes.data, t, threads)
    for r in range(rows):
        c = 0
        for chunk in range(1, chunks):
            if top[chunk, r] > top[c, r]:
                c = chunk
        best[r] = at[c, r]


@njit(**_FLAGS)
def _first_max(v):  # pragma: no cover - compiled
    """The first index of v's largest value."""
    j = 0
    for i in range(1, v.shape[0]):
        if v[i] > v[j]:
            j = i
    return j


@njit(parallel=True, **_FLAGS)
def argmax_rows(logits, best):  # pragma: no cover - compiled
    """best[M] = each row's ``_first_max`` of logits [M, N] (a float head's product, written whole)."""
    for r in prange(logits.shape[0]):
        best[r] = _first_max(logits[r])


@njit(**_FLAGS)
def dequantize_rows(q, s, m, fmt, k, ids, out):  # pragma: no cover - compiled
    """out[i] = row ids[i] of the quantized matrix, as float32 (the embedding lookup)."""
    _sd_dequantize_rows(q.ctypes.data, s.ctypes.data, m.ctypes.data, fmt.ctypes.data, q.shape[1], s.shape[1], k,
                        ids.ctypes.data, ids.shape[0], out.ctypes.data)


def product(w, x, out):  # pragma: no cover - replaced by the overload below
    """out = x @ w.T for a float matrix (``matmul``) or a quantized one, a (q, s, m, fmt) tuple."""


@overload(product, inline="always")
def _product_impl(w, x, out):
    if isinstance(w, types.BaseTuple):
        return lambda w, x, out: qmatmul(w[0], w[1], w[2], w[3], x, out)
    return lambda w, x, out: matmul(w, x, out)


def layer_weight(w, layer):  # pragma: no cover - replaced by the overload below
    """Layer ``layer``'s matrix of a stack: w[layer], or the (q, s, m, fmt) of a quantized stack
    (``quant.stack``: q is every layer's bytes back to back, at w[4][layer], w[5][layer] wide;
    ``quant.stack_layer`` is the same outside compiled code)."""


@overload(layer_weight, inline="always")
def _layer_weight_impl(w, layer):
    if isinstance(w, types.BaseTuple):

        def quantized(w, layer):
            rows = w[3].shape[1]
            q = w[0][w[4][layer]:w[4][layer + 1]].reshape((rows, w[5][layer]))
            return (q, w[1][layer], w[2][layer], w[3][layer])

        return quantized
    return lambda w, layer: w[layer]


def stack_rows(w):  # pragma: no cover - replaced by the overload below
    """Output rows of a stacked matrix [layers, rows, ...], float or quantized."""


@overload(stack_rows, inline="always")
def _rows_impl(w):
    if isinstance(w, types.BaseTuple):
        return lambda w: w[3].shape[1]
    return lambda w: w.shape[1]


# -- attention --------------------------------------------------------------------------------
@njit(fastmath={"nnan", "ninf", "nsz", "arcp", "contract"}, cache=True, boundscheck=False, error_model="numpy")
def exp_shifted(x: np.ndarray, shift: float, out: np.ndarray, scale: np.ndarray) -> None:  # pragma: no cover
    """out[i] = exp(x[i] - shift) for i < len(x), vectorised (libm's exp is one call per value; the
    gated activation's exp; qkernels_attention.h's exp8 has the same constants).

    Cephes' expf: 2^n * p(r) with x = n ln2 + r, |r| <= ln2 / 2; about 1 ulp. Elementwise
    and without reassociation, so a value's bits never depend on where it sits in the block.
    """
    n = x.shape[0]  # scale: int32 scratch of at least n
    for i in range(n):
        v = min(max(x[i] - np.float32(shift), np.float32(-87.0)), np.float32(88.0))
        k = np.floor(v * np.float32(1.44269504088896341) + np.float32(0.5))
        r = v - k * np.float32(0.693359375) + k * np.float32(2.12194440e-4)
        p = np.float32(1.9875691500e-4)
        p = p * r + np.float32(1.3981999507e-3)
        p = p * r + np.float32(8.3334519073e-3)
        p = p * r + np.float32(4.1665795894e-2)
        p = p * r + np.float32(1.6666665459e-1)
        p = p * r + np.float32(5.0000001201e-1)
        out[i] = p * (r * r) + r + np.float32(1.0)
        scale[i] = (np.int32(k) + np.int32(127)) << np.int32(23)
    factor = scale.view(np.float32)
    for i in range(n):
        out[i] *= factor[i]


@njit(parallel=True, **_FLAGS)
def attention(
    q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, row_slot: np.ndarray, row_pos: np.ndarray,
    seq_rows: np.ndarray, mask: np.ndarray, window: int, scale: float, out: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Masked attention of the pass's query rows over their sequences' cached keys and values.

    q [N, Hq, D] float32; k_cache, v_cache [slots, Hkv, max_len, D]; row_slot, row_pos [N];
    seq_rows [S + 1]: rows of sequence s are seq_rows[s]:seq_rows[s + 1] (one slot);
    mask [N, L] (True = visible); window > 0 also hides keys at or beyond ``window``
    positions back; out [N, Hq, D] float32.
    """
    n_heads, dim = q.shape[1], q.shape[2]
    n_kv = k_cache.shape[1]
    group = n_heads // n_kv
    n_keys = mask.shape[1]
    # jobs: (row chunk of one sequence, KV head, key chunk); a chunk's rows share its cache reads
    chunk_start = np.empty(seq_rows[-1] + 1, dtype=np.int64)
    chunk_end = np.empty(seq_rows[-1] + 1, dtype=np.int64)
    n_chunks = 0
    for s in range(seq_rows.shape[0] - 1):
        for r in range(seq_rows[s], seq_rows[s + 1], _ATTENTION_ROWS):
            chunk_start[n_chunks], chunk_end[n_chunks] = r, min(r + _ATTENTION_ROWS, seq_rows[s + 1])
            n_chunks += 1
    n_parts = (n_keys + _KEY_CHUNK - 1) // _KEY_CHUNK
    most = _ATTENTION_ROWS * group
    part_top = np.empty((n_chunks * n_kv * n_parts, most), dtype=np.float32)
    part_total = np.empty((n_chunks * n_kv * n_parts, most), dtype=np.float32)
    part_acc = np.empty((n_chunks * n_kv * n_parts, most, dim), dtype=np.float32)
    for job in prange(n_chunks * n_kv * n_parts):
        c, kvh, part = job // (n_kv * n_parts), (job // n_parts) % n_kv, job % n_parts
        first, n_rows = chunk_start[c], (chunk_end[c] - chunk_start[c]) * group
        _attend_part(q, k_cache, v_cache, row_slot[first], kvh, first, n_rows, group, row_pos, mask, window,
                     scale, part * _KEY_CHUNK, min(n_keys, (part + 1) * _KEY_CHUNK),
                     part_top[job], part_total[job], part_acc[job])
        if n_parts == 1:  # one key chunk: done here, without a second parallel region
            for i in range(n_rows):
                r, h = first + i // group, kvh * group + i % group
                for d in range(dim):
                    out[r, h, d] = part_acc[job, i, d] / part_total[job, i]
    if n_parts == 1:
        return
    for job in prange(n_chunks * n_kv):
        c, kvh = job // n_kv, job % n_kv
        first, n_rows = chunk_start[c], (chunk_end[c] - chunk_start[c]) * group
        for i in range(n_rows):
            r, h = first + i // group, kvh * group + i % group
            top = np.float32(-np.inf)
            for part in range(n_parts):
                if part_total[job * n_parts + part, i] > 0:
                    top = max(top, part_top[job * n_parts + part, i])
            total = np.float32(0.0)
            for d in range(dim):
                out[r, h, d] = 0.0
            for part in range(n_parts):  # in key order: a key chunk no row sees adds nothing
                p = job * n_parts + part
                if part_total[p, i] > 0:
                    f = np.float32(np.exp(part_top[p, i] - top))
                    total += part_total[p, i] * f
                    for d in range(dim):
                        out[r, h, d] += part_acc[p, i, d] * f
            for d in range(dim):
                out[r, h, d] /= total


@njit(**_FLAGS)
def _attend_part(q, k_cache, v_cache, slot, kvh, first, n_rows, group, row_pos, mask, window, scale,
                 k_start, k_end, top, total, acc):  # pragma: no cover - compiled
    """Softmax parts of keys k_start:k_end for n_rows row-heads: max score, sum of weights and
    weighted values relative to that max (combined across key chunks by ``attention``); the
    arithmetic is qkernels_attention.h's (sd_attend)."""
    dim = q.shape[2]
    lo, hi = k_end, k_start  # the span of keys some row sees: a prompt's causal rows (and a batch's shorter
    for i in range(n_rows // group):  # sequences) see no key past their own, and no score outside it is needed
        r = first + i
        for key in range(k_start, k_end):
            if mask[r, key] and (window <= 0 or row_pos[r] - key < window):
                lo, hi = min(lo, key), max(hi, key + 1)
    if hi <= lo:  # no row sees a key of this chunk: it adds nothing (kernels.attention skips total 0)
        top[:n_rows], total[:n_rows] = -np.inf, 0.0
        return
    k_start, n_keys = lo, hi - lo
    qg = np.empty((n_rows, dim), dtype=np.float32)
    for i in range(n_rows):
        qg[i] = q[first + i // group, kvh * group + i % group]
    seen = np.empty((n_rows // group, n_keys), dtype=np.uint8)  # which keys each query row sees
    for i in range(n_rows // group):
        r = first + i
        for j in range(n_keys):
            key = k_start + j
            seen[i, j] = mask[r, key] and (window <= 0 or row_pos[r] - key < window)
    scores = np.empty((n_rows, (n_keys + 7) // 8 * 8), dtype=np.float32)
    keys, values = k_cache[slot, kvh, k_start:], v_cache[slot, kvh, k_start:]
    _sd_attend(qg.ctypes.data, n_rows, group, dim, keys.ctypes.data, values.ctypes.data,
               1 if k_cache.itemsize == 2 else 0, n_keys, seen.ctypes.data, scale, scores.ctypes.data,
               top.ctypes.data, total.ctypes.data, acc.ctypes.data)


# -- the fused decoder stack ------------------------------------------------------------------
@njit(inline="always", **_FLAGS)
def _rms_norm(v: np.ndarray, w: np.ndarray, eps: float, out: np.ndarray) -> None:  # pragma: no cover
    """out = v / sqrt(mean(v^2) + eps) * w for one vector (out may be v)."""
    n = v.shape[0]
    ss = np.float32(0.0)
    for i in range(n):
        ss += v[i] * v[i]
    inv = np.float32(1.0) / np.sqrt(ss / np.float32(n) + np.float32(eps))
    for i in range(n):
        out[i] = v[i] * inv * w[i]


@njit(**_FLAGS)
def rms_norm_rows(x: np.ndarray, w: np.ndarray, eps: float, out: np.ndarray) -> None:  # pragma: no cover
    """RMSNorm row by row (any row count: same bits)."""
    for r in range(x.shape[0]):
        _rms_norm(x[r], w, eps, out[r])


@njit(inline="always", **_FLAGS)
def _rope(v: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> None:  # pragma: no cover
    """Rotate the pairs (2i, 2i + 1) of one head by the position's angles."""
    for i in range(cos.shape[0]):
        a, b = v[2 * i], v[2 * i + 1]
        v[2 * i] = a * cos[i] - b * sin[i]
        v[2 * i + 1] = a * sin[i] + b * cos[i]


@njit(inline="always", **_FLAGS)
def _add_rows(x: np.ndarray, y: np.ndarray) -> None:  # pragma: no cover
    for r in range(x.shape[0]):
        for i in range(x.shape[1]):
            x[r, i] += y[r, i]


_PARALLEL_ACTIVATIONS = 64  # rows from which the gated activation runs on every core (a prompt's)


@njit(**_FLAGS)
def _gated_row(gate_up: np.ndarray, gelu: bool, out: np.ndarray, z: np.ndarray,
               bits: np.ndarray) -> None:  # pragma: no cover
    """out = act(gate) * up for one row; z, bits: scratch of out's length.

    Both activations are gate x sigmoid(c z): silu z = g, c = 1; gelu (tanh approximation, as Gemma's
    gelu_pytorch_tanh, since 0.5 (1 + tanh y) = sigmoid(2 y)) z = g + 0.044715 g^3, c = 2 sqrt(2 / pi).
    exp through ``exp_shifted``, vectorised: libm's expf a value at a time was 214 us of an 8-row
    layer (Qwen2.5-Coder-1.5B's 8960 values a row), 6 ms of its 8-token pass.
    """
    inter = out.shape[0]
    gate, up = gate_up[:inter], gate_up[inter:]  # slices: an index like inter + i would not vectorise
    if gelu:
        for i in range(inter):
            g = gate[i]
            z[i] = np.float32(-1.5957691216057308) * (g + np.float32(0.044715) * g * g * g)
    else:
        for i in range(inter):
            z[i] = -gate[i]
    exp_shifted(z, 0.0, out, bits)  # out = exp(-c z) (into another array than z: aliasing stops vectorising)
    for i in range(inter):
        out[i] = gate[i] / (np.float32(1.0) + out[i]) * up[i]


@njit(parallel=True, **_FLAGS)
def gated_activation(gate_up: np.ndarray, gelu: bool, out: np.ndarray) -> None:  # pragma: no cover
    """out = act(gate) * up for gate_up = [gate | up] [N, 2 I] (``_gated_row``): a decode or verify
    pass's few rows on this thread (a parallel region costs more than they do), a prompt's on every core."""
    rows, inter = out.shape
    if rows < _PARALLEL_ACTIVATIONS:
        z = np.empty(inter, dtype=np.float32)
        bits = np.empty(inter, dtype=np.int32)
        for r in range(rows):
            _gated_row(gate_up[r], gelu, out[r], z, bits)
        return
    per_chunk = (rows + _CHUNKS - 1) // _CHUNKS
    for chunk in prange(_CHUNKS):
        z = np.empty(inter, dtype=np.float32)
        bits = np.empty(inter, dtype=np.int32)
        for r in range(chunk * per_chunk, min(rows, (chunk + 1) * per_chunk)):
            _gated_row(gate_up[r], gelu, out[r], z, bits)


class RowLayout(NamedTuple):
    """Where each of a pass's N rows sits (``decode_layers``' rows; built by the runner).

    slots, positions, write_at: [N] int64, a row's cache row, rope position and cache entry;
    seq_rows: [S + 1], rows of sequence s are seq_rows[s]:seq_rows[s + 1]; mask: [N, L] bool,
    True where a row may attend to a cache entry.
    """

    slots: np.ndarray
    positions: np.ndarray
    write_at: np.ndarray
    seq_rows: np.ndarray
    mask: np.ndarray


class LayerWeights(NamedTuple):
    """Every layer's weights, stacked [num_layers, ...]: the matrices float (float32, or bfloat16
    bits) or ``quant.stack``'s arrays (read through ``layer_weight``); the rest float32.

    wqkv [(Hq + 2 Hkv) D, H], bqkv [(Hq + 2 Hkv) D], wo [H, Hq D], w_gate_up [2 I, H], w_down [H, I]
    per layer; norms [4, H] = (attn, mlp, post_attn, post_mlp); qk_norms [2, D] = (q, k).
    """

    wqkv: np.ndarray | tuple
    bqkv: np.ndarray
    wo: np.ndarray | tuple
    w_gate_up: np.ndarray | tuple
    w_down: np.ndarray | tuple
    norms: np.ndarray
    qk_norms: np.ndarray


class RopeTables(NamedTuple):
    """[max_len, D / 2] float32 rotation factors by position; the local ones for sliding layers."""

    cos: np.ndarray
    sin: np.ndarray
    cos_local: np.ndarray
    sin_local: np.ndarray


class Arch(NamedTuple):
    """The architecture's sizes and switches (the config flags ``decode_layers`` reads)."""

    sliding: np.ndarray  # [num_layers] bool: the layer attends within ``window`` keys
    window: int
    n_heads: int
    n_kv: int
    eps: float
    scale: float  # attention's q.k scale
    has_bias: bool  # bqkv is added
    qk_norm: bool  # q and k RMS-normed per head
    sandwich: bool  # post_attn / post_mlp norms
    gelu: bool  # gelu (tanh) gate, else silu


@njit(**_FLAGS)  # serial glue: only the products and attention inside launch threads
def decode_layers(x, rows, weights, k_cache, v_cache, rope, arch, run_layer, hidden_at, hidden):  # pragma: no cover
    """Run the rows x [N, H] (``rows``: a ``RowLayout``) through every layer l with run_layer[l]
    in place, writing their K/V to the cache; a layer not run passes x through and writes no K/V
    (a layer-skipping draft).

    weights: ``LayerWeights``; k_cache[l], v_cache[l] [slots, Hkv, max_len, D]; rope: ``RopeTables``;
    arch: ``Arch``. hidden[hidden_at[l]] receives x after layer l where hidden_at[l] >= 0.
    """
    row_slot, row_pos, row_write, seq_rows, mask = rows
    wqkv, bqkv, wo, w_gate_up, w_down, norms, qk_norms = weights
    cos, sin, cos_local, sin_local = rope
    sliding, window, n_heads, n_kv, eps, scale, has_bias, qk_norm, sandwich, gelu = arch
    n_rows, size = x.shape
    dim = cos.shape[1] * 2
    q_size, kv_size = n_heads * dim, n_kv * dim
    inter = stack_rows(w_gate_up) // 2
    h = np.empty((n_rows, size), dtype=np.float32)
    qkv = np.empty((n_rows, q_size + 2 * kv_size), dtype=np.float32)
    attn = np.empty((n_rows, n_heads, dim), dtype=np.float32)
    proj = np.empty((n_rows, size), dtype=np.float32)
    gate_up = np.empty((n_rows, 2 * inter), dtype=np.float32)
    act = np.empty((n_rows, inter), dtype=np.float32)
    for layer in range(norms.shape[0]):
        if not run_layer[layer]:
            if hidden_at[layer] >= 0:
                hidden[hidden_at[layer]] = x
            continue
        rms_norm_rows(x, norms[layer, 0], eps, h)
        product(layer_weight(wqkv, layer), h, qkv)
        for r in range(n_rows):
            if has_bias:
                for i in range(qkv.shape[1]):
                    qkv[r, i] += bqkv[layer, i]
            local = sliding[layer]
            c = cos_local[row_pos[r]] if local else cos[row_pos[r]]
            s = sin_local[row_pos[r]] if local else sin[row_pos[r]]
            for head in range(n_heads + n_kv):
                v = qkv[r, head * dim:(head + 1) * dim]
                if qk_norm:
                    _rms_norm(v, qk_norms[layer, 0 if head < n_heads else 1], eps, v)
                _rope(v, c, s)
            slot, at = row_slot[r], row_write[r]
            for kvh in range(n_kv):
                k_off = q_size + kvh * dim
                _store(k_cache[layer, slot, kvh, at], qkv[r, k_off:k_off + dim])
                _store(v_cache[layer, slot, kvh, at], qkv[r, k_off + kv_size:k_off + kv_size + dim])
        q = qkv[:, :q_size].copy().reshape((n_rows, n_heads, dim))
        attention(q, k_cache[layer], v_cache[layer], row_slot, row_pos, seq_rows, mask,
                  window if sliding[layer] else 0, scale, attn)
        product(layer_weight(wo, layer), attn.reshape((n_rows, q_size)), proj)
        if sandwich:
            rms_norm_rows(proj, norms[layer, 2], eps, proj)
        _add_rows(x, proj)
        rms_norm_rows(x, norms[layer, 1], eps, h)
        product(layer_weight(w_gate_up, layer), h, gate_up)
        gated_activation(gate_up, gelu, act)
        product(layer_weight(w_down, layer), act, proj)
        if sandwich:
            rms_norm_rows(proj, norms[layer, 3], eps, proj)
        _add_rows(x, proj)
        if hidden_at[layer] >= 0:
            hidden[hidden_at[layer]] = x
