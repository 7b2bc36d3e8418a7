"""Matrix-product backends for the decoder's linear layers, picked by measurement.

PyTorch's CPU wheels call MKL for float32 matmuls. On AMD CPUs MKL takes a slow
generic path: measured on this project's 2-core EPYC (AVX2), a [8, 576] x
[576, 3072] product took 1.9 ms through ``F.linear`` but 0.66 ms through
NumPy's OpenBLAS. The "numpy" backend multiplies NumPy views of the weights: our
few-row kernel (``kernels``) for decoding and verification, OpenBLAS for prefill.
The runner times both backends on the model's own shapes at load time and keeps
the faster; on CUDA or for non-float32 weights it is always torch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from specdec.model.kernels import FEW_ROWS, few_rows_matmul

Linear = Callable[[torch.Tensor], torch.Tensor]


def torch_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
    return lambda x: F.linear(x, weight, bias)


def numpy_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
    """y = x @ weight.T (+ bias): our few-row kernel up to FEW_ROWS tokens, else NumPy's BLAS.

    Decoding and verification passes are a few rows (see ``kernels``); prefill is many,
    where BLAS sgemm on the transposed view is fastest. Zero-copy in and out.
    """
    w = weight.contiguous().numpy()  # [out, in]
    b = None if bias is None else bias.numpy()

    def linear(x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        xn = x2.numpy() if x2.is_contiguous() else x2.contiguous().numpy()
        if xn.shape[0] <= FEW_ROWS:
            y = np.empty((xn.shape[0], w.shape[0]), dtype=np.float32)
            few_rows_matmul(w, xn, y)
        else:
            y = np.matmul(xn, w.T)
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
