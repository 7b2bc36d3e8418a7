"""A float32 matrix product for a few rows that reads the weights once (numba).

Verification multiplies a handful of token rows by every weight matrix. BLAS sgemm
first packs the whole weight into a scratch layout, which doubles the memory
traffic of a product that is bound by memory traffic, and sgemv per row reads the
weights once per row. This kernel walks the weight four output rows at a time and
dots them with every input row while they sit in L1. Whole default model (540 MB
of float32 weights) on this project's 2-core EPYC, ms for all matmuls of one pass:

    rows            1     2     4     8     9    16
    sgemv per row  30    47    78   135   147   242
    sgemm          37    78    82    76    90   117
    this kernel    28    31    40    57    62    97

Each output element is one dot product whose summation order depends only on its
weight row and input row, never on how many rows are in the pass; so a row's
result in a K-token verification pass is bit-identical to the same row decoded alone.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

FEW_ROWS = 16  # beyond this, sgemm's blocking wins


@njit(parallel=True, fastmath=True, cache=True, boundscheck=False)
def few_rows_matmul(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """out[M, N] = x[M, K] @ w[N, K].T for small M; w and x C-contiguous float32."""
    n_out, k_in = w.shape
    for block in prange((n_out + 3) // 4):
        n0 = block * 4
        if n0 + 4 <= n_out:
            for m in range(x.shape[0]):
                a0 = np.float32(0.0)
                a1 = np.float32(0.0)
                a2 = np.float32(0.0)
                a3 = np.float32(0.0)
                for k in range(k_in):
                    xv = x[m, k]
                    a0 += w[n0, k] * xv
                    a1 += w[n0 + 1, k] * xv
                    a2 += w[n0 + 2, k] * xv
                    a3 += w[n0 + 3, k] * xv
                out[m, n0] = a0
                out[m, n0 + 1] = a1
                out[m, n0 + 2] = a2
                out[m, n0 + 3] = a3
        else:  # the last 1-3 weight rows
            for n in range(n0, n_out):
                for m in range(x.shape[0]):
                    acc = np.float32(0.0)
                    for k in range(k_in):
                        acc += w[n, k] * x[m, k]
                    out[m, n] = acc


@njit(parallel=True, fastmath=True, cache=True, boundscheck=False)
def attention(
    q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, slots: np.ndarray, mask: np.ndarray,
    scale: float, out: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Masked attention of new queries over cached keys and values, one query row at a time.

    q [B, T, Hq, D]; k_cache, v_cache [slots, Hkv, max_len, D]; slots [B]; mask [B, T, L]
    (True = visible); out [B, T, Hq, D]. A row's result depends only on its query,
    its visible keys and values, never on T or L: the same bits whether the token is
    decoded alone or verified among drafts (torch's SDPA blocks over queries and keys).
    """
    n_batch, n_new, n_heads, dim = q.shape
    n_keys = mask.shape[2]
    group = n_heads // k_cache.shape[1]
    for job in prange(n_batch * n_new * n_heads):
        b = job // (n_new * n_heads)
        t = (job // n_heads) % n_new
        h = job % n_heads
        s, kh = slots[b], h // group
        scores = np.empty(n_keys, dtype=np.float32)
        top = np.float32(-np.inf)
        for key in range(n_keys):
            if mask[b, t, key]:
                dot = np.float32(0.0)
                for d in range(dim):
                    dot += q[b, t, h, d] * k_cache[s, kh, key, d]
                scores[key] = dot * scale
                top = max(top, scores[key])
        total = np.float32(0.0)
        acc = np.zeros(dim, dtype=np.float32)
        for key in range(n_keys):
            if mask[b, t, key]:
                e = np.float32(np.exp(scores[key] - top))
                total += e
                for d in range(dim):
                    acc[d] += e * v_cache[s, kh, key, d]
        for d in range(dim):
            out[b, t, h, d] = acc[d] / total
