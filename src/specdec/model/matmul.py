"""Matrix-product backends for the decoder's linear layers, picked by measurement.

PyTorch's CPU wheels call MKL for float32 matmuls. On AMD CPUs MKL takes a slow
generic path: measured on this project's 2-core EPYC (AVX2), a [8, 576] x
[576, 3072] product took 1.9 ms through ``F.linear`` but 0.66 ms through
NumPy's OpenBLAS. The "numpy" backend multiplies NumPy views of the weights: our
few-row kernel (``kernels``) for decoding and verification, OpenBLAS for prefill.
The runner times both backends on the model's own shapes at load time and keeps
the faster; on CUDA or for weights other than float32 and bfloat16 it is always torch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from specdec.model.kernels import FEW_ROWS, as_numpy, matmul_kernel

Linear = Callable[[torch.Tensor], torch.Tensor]


def torch_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
    return lambda x: F.linear(x, weight, bias)


def numpy_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
    """y = x @ weight.T (+ bias): our few-row kernel up to FEW_ROWS tokens, else BLAS.

    Decoding and verification passes are a few rows (see ``kernels``); prefill is many,
    where NumPy's sgemm on the transposed view is fastest. bfloat16 weights are read as
    their raw bits by the kernel (widened per call for sgemm); products accumulate in
    float32 and are rounded back to the weight's dtype. Zero-copy for float32.
    """
    bf16 = weight.dtype == torch.bfloat16
    w_t = weight.contiguous()
    w = as_numpy(w_t)  # [out, in]
    b = None if bias is None else bias.float().numpy()
    kernel, n_out = matmul_kernel(w), w.shape[0]

    def linear(x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        if bf16:
            x2 = x2.float()
        xn = x2.numpy() if x2.is_contiguous() else x2.contiguous().numpy()
        if xn.shape[0] <= FEW_ROWS:
            y = np.empty((xn.shape[0], n_out), dtype=np.float32)
            kernel(w, xn, y)
        else:  # bfloat16: widened per call (prefill is compute-bound)
            y = np.matmul(xn, w_t.float().numpy().T if bf16 else w.T)
        if b is not None:
            y += b
        out = torch.from_numpy(y).view(*x.shape[:-1], n_out)
        return out.to(torch.bfloat16) if bf16 else out

    return linear


def pick_backend(weight: torch.Tensor, widths: tuple[int, ...] = (1, 8), rounds: int = 5) -> str:
    """'numpy' (our kernels and NumPy's BLAS) when it beats torch on this weight for these token counts.

    SPECDEC_MATMUL=torch|numpy overrides the measurement. The two candidates are timed
    in alternation and each keeps its best round, so a burst of load from another
    process skews both alike instead of deciding the outcome.
    """
    forced = os.environ.get("SPECDEC_MATMUL")
    if forced in MAKERS:
        return forced
    if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16):
        return "torch"
    fns = {name: make(weight) for name, make in MAKERS.items()}
    inputs = [torch.randn(1, t, weight.shape[1], dtype=weight.dtype) for t in widths]
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for x in inputs:
                fn(x)
            best[name] = min(best[name], time.perf_counter() - start)
    return min(best, key=best.get)


MAKERS = {"torch": torch_linear, "numpy": numpy_linear}
