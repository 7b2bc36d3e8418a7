"""CPU kernels (numba) for decode and verify passes: few-row matmul and row-wise attention.

Verification multiplies a handful of token rows by every weight matrix. BLAS sgemm
first packs the whole weight into a scratch layout, which doubles the memory
traffic of a product that is bound by memory traffic, and sgemv per row reads the
weights once per row. ``few_rows_matmul`` walks the weight four output rows at a
time and dots them with every input row while they sit in L1. Whole default model
(540 MB of float32 weights) on this project's 2-core EPYC, ms for all matmuls of
one pass:

    rows            1     2     4     8     9    16
    sgemv per row  30    47    78   135   147   242
    sgemm          37    78    82    76    90   117
    this kernel    28    31    40    57    62    97

Both kernels take float32 or bfloat16 data (bfloat16 as its uint16 bits, widened to
float32 in registers: this CPU has no bf16 arithmetic, and reading half the bytes is
what matters) and accumulate in float32.

Each output element is one dot product whose summation order depends only on its
weight row and input row (for attention: its query and its visible keys), never on
how many rows are in the pass; so a token's result in a K-token verification pass
is bit-identical to the same token decoded alone.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

FEW_ROWS = 16  # beyond this many rows, sgemm's blocking wins
_CHUNKS = 64  # units of parallel work per matmul (each with its own widening buffer)


def _vector_f32(src, buf):  # pragma: no cover - replaced by the overload below
    """A 1-D row as float32 (widened into ``buf`` when it holds bfloat16 bits)."""


@overload(_vector_f32, inline="always")
def _vector_f32_impl(src, buf):
    if src.dtype == types.uint16:

        def widen(src, buf):
            for d in range(src.shape[0]):
                buf[d] = np.uint32(src[d]) << np.uint32(16)
            return buf.view(np.float32)

        return widen
    return lambda src, buf: src


@njit(fastmath=True, cache=True, boundscheck=False, inline="always")
def _dot_rows(w: np.ndarray, r0: int, n: int, x: np.ndarray, out: np.ndarray, n0: int) -> None:  # pragma: no cover
    """out[:, n0:n0 + n] = x @ w[r0:r0 + n].T for n <= 4 float32 weight rows."""
    k_in = w.shape[1]
    if n == 4:
        for m in range(x.shape[0]):
            a0 = np.float32(0.0)
            a1 = np.float32(0.0)
            a2 = np.float32(0.0)
            a3 = np.float32(0.0)
            for k in range(k_in):
                xv = x[m, k]
                a0 += w[r0, k] * xv
                a1 += w[r0 + 1, k] * xv
                a2 += w[r0 + 2, k] * xv
                a3 += w[r0 + 3, k] * xv
            out[m, n0] = a0
            out[m, n0 + 1] = a1
            out[m, n0 + 2] = a2
            out[m, n0 + 3] = a3
    else:  # the last 1-3 weight rows
        for i in range(n):
            for m in range(x.shape[0]):
                acc = np.float32(0.0)
                for k in range(k_in):
                    acc += w[r0 + i, k] * x[m, k]
                out[m, n0 + i] = acc


@njit(parallel=True, fastmath=True, cache=True, boundscheck=False)
def _matmul_f32(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    n_out = w.shape[0]
    for block in prange((n_out + 3) // 4):
        n0 = block * 4
        _dot_rows(w, n0, min(4, n_out - n0), x, out, n0)


@njit(parallel=True, fastmath=True, cache=True, boundscheck=False)
def _matmul_bf16(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    n_out, k_in = w.shape
    n_blocks = (n_out + 3) // 4
    per_chunk = (n_blocks + _CHUNKS - 1) // _CHUNKS
    for chunk in prange(_CHUNKS):
        buf = np.empty((4, k_in), dtype=np.uint32)  # one widening buffer per chunk of blocks
        wide = buf.view(np.float32)
        for block in range(chunk * per_chunk, min(n_blocks, (chunk + 1) * per_chunk)):
            n0 = block * 4
            n = min(4, n_out - n0)
            for i in range(n):
                for k in range(k_in):
                    buf[i, k] = np.uint32(w[n0 + i, k]) << np.uint32(16)
            _dot_rows(wide, 0, n, x, out, n0)


def as_numpy(t):
    """A NumPy view of a CPU tensor; bfloat16 (which NumPy lacks) as its raw uint16 bits."""
    import torch

    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()


def few_rows_matmul(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out[M, N] = x[M, K] @ w[N, K].T for small M; w float32 or bfloat16 bits (uint16),
    x and out float32, all C-contiguous."""
    matmul_kernel(w)(w, x, out)


def matmul_kernel(w: np.ndarray):
    """The compiled few-row kernel for ``w``'s dtype (bind it once: no per-call dispatch)."""
    return _matmul_bf16 if w.dtype == np.uint16 else _matmul_f32


@njit(parallel=True, fastmath=True, cache=True, boundscheck=False)
def attention(
    q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, slots: np.ndarray, mask: np.ndarray,
    scale: float, out: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Masked attention of new queries over cached keys and values, one query row at a time.

    q [B, T, Hq, D] float32; k_cache, v_cache [slots, Hkv, max_len, D] float32 or
    bfloat16 bits; slots [B]; mask [B, T, L] (True = visible); out [B, T, Hq, D] float32.
    A row's result depends only on its query and its visible keys and values, never
    on T or L (torch's SDPA blocks over queries and keys, so its rows do).
    """
    n_batch, n_new, n_heads, dim = q.shape
    n_keys = mask.shape[2]
    group = n_heads // k_cache.shape[1]
    for job in prange(n_batch * n_new * n_heads):
        b = job // (n_new * n_heads)
        t = (job // n_heads) % n_new
        h = job % n_heads
        s, kh = slots[b], h // group
        buf = np.empty(dim, dtype=np.uint32)
        scores = np.empty(n_keys, dtype=np.float32)
        top = np.float32(-np.inf)
        for key in range(n_keys):
            if mask[b, t, key]:
                k_row = _vector_f32(k_cache[s, kh, key], buf)
                dot = np.float32(0.0)
                for d in range(dim):
                    dot += q[b, t, h, d] * k_row[d]
                scores[key] = dot * scale
                top = max(top, scores[key])
        total = np.float32(0.0)
        acc = np.zeros(dim, dtype=np.float32)
        for key in range(n_keys):
            if mask[b, t, key]:
                v_row = _vector_f32(v_cache[s, kh, key], buf)
                e = np.float32(np.exp(scores[key] - top))
                total += e
                for d in range(dim):
                    acc[d] += e * v_row[d]
        for d in range(dim):
            out[b, t, h, d] = acc[d] / total
