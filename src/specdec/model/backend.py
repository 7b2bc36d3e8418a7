"""How the decoder's products and attention run: one object, chosen when the model is built.

- ``torch``: ``F.linear`` and SDPA for every pass (CUDA, or any dtype).
- ``cpu-kernels``: decode and verify passes run the whole layer stack as one
  compiled call (``decoder_kernels.decode_layers``: few-row products that read each
  weight once, row-wise attention, bit-identical rows at any width); prefill's
  many rows go through NumPy's BLAS (PyTorch's CPU wheels call MKL, which takes a
  slow generic path on AMD CPUs) and torch's SDPA.

``auto`` is ``cpu-kernels`` on a CPU for float32 and bfloat16 weights, else ``torch``; and
``torch``, with one notice line, where the kernels do not compile on this machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from specdec.errors import ModelLoadError
from specdec.log import get_logger
from specdec.model import kernels
from specdec.model.clib import load_qkernels
from specdec.model.kernels import as_numpy

logger = get_logger(__name__)

Linear = Callable[[torch.Tensor], torch.Tensor]
BACKENDS = ("auto", "cpu-kernels", "torch")


@dataclass(frozen=True)
class Backend:
    name: str
    fused: bool  # decode/verify passes through decoder_kernels.decode_layers

    def linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
        return blas_linear(weight, bias) if self.fused else (lambda x: F.linear(x, weight, bias))


TORCH = Backend("torch", fused=False)
CPU_KERNELS = Backend("cpu-kernels", fused=True)


def make_backend(name: str, dtype: torch.dtype, device: torch.device) -> Backend:
    if name not in BACKENDS:
        raise ModelLoadError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    kernels_fit = device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)
    if name == "cpu-kernels" and not kernels_fit:
        raise ModelLoadError(f"the cpu-kernels backend runs float32 or bfloat16 on a CPU, not {dtype} on {device}")
    if name == "torch" or not kernels_fit:
        return TORCH
    try:
        kernels_compile()
    except Exception as exc:  # noqa: BLE001 - any compiler failure: run on torch instead
        if name == "cpu-kernels":
            raise ModelLoadError(
                f"the cpu-kernels backend does not compile here: {type(exc).__name__}: {exc}"
            ) from None
        logger.warning("specdec: notice: CPU kernels unavailable (%s: %s); running on torch", type(exc).__name__, exc)
        return TORCH
    return CPU_KERNELS


def kernels_compile() -> None:
    """Compile (or load from numba's cache) the kernels on a tiny product: raises where they cannot
    (attention and the quantized products call qkernels.c: no C compiler, no fused passes)."""
    load_qkernels()
    w = np.ones((4, 8), dtype=np.float32)
    out = np.empty((1, 4), dtype=np.float32)
    kernels.matmul(w, np.ones((1, 8), dtype=np.float32), out)


def blas_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
    """y = x @ weight.T (+ bias) through NumPy's sgemm (prefill: many rows, compute-bound).

    bfloat16 weights are widened per call and the product rounded back to bfloat16.
    """
    bf16 = weight.dtype == torch.bfloat16
    w = as_numpy(weight)  # [out, in]
    b = None if bias is None else bias.float().numpy()

    def linear(x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).float().contiguous().numpy()
        y = np.matmul(x2, weight.float().numpy().T if bf16 else w.T)
        if b is not None:
            y += b
        out = torch.from_numpy(y).view(*x.shape[:-1], w.shape[0])
        return out.to(torch.bfloat16) if bf16 else out

    return linear
