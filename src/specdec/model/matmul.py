"""Matrix-product backends for the decoder's linear layers, picked by measurement.

PyTorch's CPU wheels call MKL for float32 matmuls. On AMD CPUs MKL takes a slow
generic path: measured on this project's 2-core EPYC (AVX2), a [8, 576] x
[576, 3072] product took 1.9 ms through ``F.linear`` but 0.66 ms through
NumPy's OpenBLAS. So the runner times both on the model's own shapes at load
time and keeps the faster; on CUDA or for non-float32 weights it is always torch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

Linear = Callable[[torch.Tensor], torch.Tensor]


def torch_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
    return lambda x: F.linear(x, weight, bias)


def numpy_linear(weight: torch.Tensor, bias: torch.Tensor | None = None, dual: bool = True) -> Linear:
    """y = x @ weight.T (+ bias) through NumPy's BLAS; zero-copy in and out.

    One token (plain decoding) is a matrix-vector product, fastest on the row-major
    [out, in] weight (sgemv: 17.9 GB/s vs 14.1 GB/s for a 1-row sgemm, measured here);
    several tokens (verification) are fastest on a contiguous [in, out] copy (~20%
    faster than the transposed view). ``dual`` keeps both layouts, at twice the memory.
    """
    w = weight.contiguous().numpy()  # [out, in]
    w_t = np.ascontiguousarray(w.T) if dual else w.T  # [in, out]
    b = None if bias is None else bias.numpy()

    def linear(x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        xn = x2.numpy() if x2.is_contiguous() else x2.contiguous().numpy()
        y = np.matmul(w, xn[0])[None] if xn.shape[0] == 1 else np.matmul(xn, w_t)
        if b is not None:
            y += b
        return torch.from_numpy(y).view(*x.shape[:-1], w.shape[0])

    return linear


def pick_backend(weight: torch.Tensor, widths: tuple[int, ...] = (1, 8), rounds: int = 5) -> str:
    """'numpy' when NumPy's BLAS beats torch on this weight for the given token counts.

    SPECDEC_MATMUL=torch|numpy overrides the measurement. The two candidates are timed
    in alternation and each keeps its best round, so a burst of load from another
    process skews both alike instead of deciding the outcome.
    """
    forced = os.environ.get("SPECDEC_MATMUL")
    if forced in MAKERS:
        return forced
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return "torch"
    fns = {name: make(weight) for name, make in MAKERS.items()}
    inputs = [torch.randn(1, t, weight.shape[1]) for t in widths]
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for x in inputs:
                fn(x)
            best[name] = min(best[name], time.perf_counter() - start)
    return min(best, key=best.get)


MAKERS = {"torch": torch_linear, "numpy": numpy_linear}
