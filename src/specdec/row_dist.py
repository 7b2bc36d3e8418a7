"""One row of the target's sampled distribution, as the verifier reads it: a token's probability, the residual
after a rejected draft, a draw.

``TensorDist`` holds the row's [V] probabilities (``sampling.probs_from_logits``). ``BlockDist`` (a CPU row of
float32 logits at a temperature, with or without min-p) holds the softmax in blocks of 64 columns instead: each
block's largest logit and sum of terms (qkernels.c's ``sd_softmax_blocks``), and a block's terms made again where a
token is read. A rejected deterministic draft takes its token out of its block, and a draw finds the block in the
blocks' float64 running sums, then the token in its block's. The same distribution up to float rounding: softmax(
logits / T), min-p dropping what p < min_p x p_max drops. On Qwen2.5-Coder-1.5B's 151,936 columns a plain sampled
step's verify took 0.69 ms this way (torch's softmax 0.35, the draw's two float64 passes 0.26: Zen 4,
``scripts/step_work.py``).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Protocol

import numpy as np
import torch

from specdec.config import SamplingParams
from specdec.sampling import probs_from_logits, sample

BLOCK = 64  # qkernels.c's SOFTMAX_BLOCK


class TokenDist(Protocol):
    def prob(self, token: int) -> float: ...

    def without(self, token: int, q: torch.Tensor | None) -> TokenDist:
        """norm(max(0, p - q)); q None means one-hot at ``token``."""
        ...

    def draw(self, generator: torch.Generator) -> int: ...


class TensorDist:
    """A row's probabilities as a [V] tensor (any device, any filter)."""

    def __init__(self, p: torch.Tensor) -> None:
        self.p = p

    def prob(self, token: int) -> float:
        return float(self.p[token])

    def without(self, token: int, q: torch.Tensor | None) -> TensorDist:
        r = self.p.clone()
        if q is None:
            r[token] = 0.0
        else:
            r = torch.clamp(self.p - q, min=0.0)
        total = r.sum()
        # total == 0 only when p <= q everywhere, i.e. p == q: then every draft is accepted
        # with probability 1 and this is unreachable; guard against rounding anyway.
        return TensorDist(r / total if total > 0 else self.p)

    def draw(self, generator: torch.Generator) -> int:
        return int(sample(self.p.unsqueeze(0), generator)[0])


class BlockDist:
    """softmax(row / T) of a CPU float32 row in 64-column blocks; min-p's dropped tokens weigh 0.

    A block's weight is its sum of terms times exp((its max - the row's max) / T), in float64; a token's is its term
    times the same factor. Blocks a rejected token or min-p touches are summed again from their terms."""

    def __init__(self, row: np.ndarray, temperature: float, min_p: float = 0.0) -> None:
        self.row, self.inv_t, self.min_p = row, np.float32(1.0 / max(temperature, 1e-5)), min_p
        n = (row.shape[0] + BLOCK - 1) // BLOCK
        top, sums = np.empty(n, dtype=np.float32), np.empty(n, dtype=np.float32)
        _lib().sd_softmax_blocks(row.ctypes.data, row.shape[0], ctypes.c_float(self.inv_t), top.ctypes.data,
                                 sums.ctypes.data)
        factor = top.astype(np.float64)  # exp((a block's max - the row's) / T): -inf blocks 0
        factor -= factor.max()
        factor *= self.inv_t
        self.factor = np.exp(factor, out=factor)
        self.removed: frozenset[int] = frozenset()
        weights = sums * self.factor
        if min_p > 0.0:  # min-p keeps tokens whose term x factor (p / p_max) is at least min_p
            weights[self.factor < min_p] = 0.0
            for b in np.flatnonzero(self.factor >= min_p):
                weights[b] = self._terms(int(b)).sum()
        self.weights = weights

    def _terms(self, b: int) -> np.ndarray:
        """Block b's tokens' weights (float64), removed and min-p-dropped tokens 0."""
        t = np.empty(BLOCK, dtype=np.float32)
        _lib().sd_block_terms(self.row.ctypes.data, self.row.shape[0], b, ctypes.c_float(self.inv_t), t.ctypes.data)
        w = t.astype(np.float64) * self.factor[b]
        if self.min_p > 0.0:
            w[w < self.min_p] = 0.0
        for token in self.removed:
            if token // BLOCK == b:
                w[token % BLOCK] = 0.0
        return w

    def prob(self, token: int) -> float:
        return float(self._terms(token // BLOCK)[token % BLOCK] / self.weights.sum())

    def without(self, token: int, q: torch.Tensor | None) -> BlockDist:
        assert q is None, "a sampled draft's residual reads every token's p: verify it with a TensorDist"
        out = object.__new__(BlockDist)
        out.__dict__.update(self.__dict__)
        out.removed = self.removed | {token}
        out.weights = self.weights.copy()
        out.weights[token // BLOCK] = out._terms(token // BLOCK).sum()
        if not out.weights.any():  # p was one-hot at token: unreachable, as TensorDist's guard
            return self
        return out

    def draw(self, generator: torch.Generator) -> int:
        """``sampling.sample``'s draw: one float64 uniform, as it draws."""
        return self.pick(float(torch.rand(1, 1, dtype=torch.float64, generator=generator)[0, 0]))

    def pick(self, u: float) -> int:
        """The first token whose running mass exceeds u x the total (u in [0, 1)), the blocks' sums first."""
        running = np.cumsum(self.weights)
        target = u * running[-1]
        b = int(np.searchsorted(running, target, side="right"))
        if b >= len(running):  # rounding: the last block that weighs anything
            b = int(np.flatnonzero(self.weights)[-1])
        w = self._terms(b)
        inside = np.cumsum(w)
        c = int(np.searchsorted(inside, target - (running[b - 1] if b else 0.0), side="right"))
        if c >= BLOCK or w[c] == 0.0:  # rounding between the block's weight and its tokens'
            c = int(np.flatnonzero(w)[-1])
        return b * BLOCK + c


def row_dist(logits: torch.Tensor, params: SamplingParams, blocks: bool = True) -> TokenDist:
    """The distribution ``probs_from_logits`` gives one [V] row: with ``blocks`` (the drafts' q one-hot) a
    ``BlockDist`` where it can be made (a CPU float32 row, no top-k or top-p, the kernels built), else a
    ``TensorDist``."""
    if (blocks and logits.device.type == "cpu" and logits.dtype == torch.float32 and not params.top_k
            and params.top_p >= 1.0 and _lib() is not None):
        return BlockDist(logits.contiguous().numpy(), params.temperature, params.min_p)
    return TensorDist(probs_from_logits(logits.unsqueeze(0), params)[0])


@functools.cache
def _lib() -> ctypes.CDLL | None:
    """The kernels' library where it has vector instructions (AVX2 or more), else None: ``row_dist`` then takes
    torch's softmax."""
    from specdec.errors import ModelLoadError
    from specdec.model.clib import load_qkernels

    try:
        lib = load_qkernels()
    except ModelLoadError:
        return None
    if lib.sd_isa().decode() == "scalar":  # exp1 a value at a time: slower than torch's softmax
        return None
    lib.sd_softmax_blocks.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p,
                                      ctypes.c_void_p]
    lib.sd_block_terms.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_float,
                                   ctypes.c_void_p]
    return lib
