"""One row of the target's sampled distribution, as the verifier reads it: a token's probability, the residual
after a rejected draft, a draw.

``TensorDist`` holds the row's [V] probabilities (``sampling.probs_from_logits``). ``BlockDist`` (a CPU row of
float32 logits at a temperature, with or without min-p) holds the softmax in blocks of 64 columns instead: each
block's largest logit and sum of terms, summed by the LM head's sweep as it wrote the logits (``PassOutput.blocks``)
or by qkernels.c's ``sd_softmax_blocks`` here, and a block's terms made again where a token is read. A rejected
deterministic draft takes its token out of its block, and a draw finds the block in the blocks' float64 running sums,
then the token in its block's. The same distribution up to float rounding: softmax(logits / T), min-p dropping what
p < min_p x p_max drops. A plain sampled step's verify on Qwen2.5-Coder-1.5B (151,936 columns; Zen 4, under
cProfile, ``scripts/step_work.py --spec none --rows ...``): 0.81-0.85 ms with torch's softmax and the float64
cumulative draw, 0.41-0.44 summed here, 0.35-0.40 summed by the head.
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
    times the same factor. Blocks a rejected token or min-p touches are summed again from their tokens' weights. The
    arithmetic is qkernels.c's (a few calls a row: right after a pass, with the caches cold, each NumPy call on the
    blocks cost 20-60 us)."""

    def __init__(self, row: np.ndarray, temperature: float, min_p: float = 0.0,
                 summed: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """summed: the blocks' (top, sums) as the LM head summed them at ``inverse_temperature(temperature)``
        (``PassOutput.blocks``), else summed here."""
        lib = _lib()
        self.row, self.inv_t, self.min_p = row, ctypes.c_float(inverse_temperature(temperature)), min_p
        n = (row.shape[0] + BLOCK - 1) // BLOCK
        if summed is None:
            summed = np.empty(n, dtype=np.float32), np.empty(n, dtype=np.float32)
            lib.sd_softmax_blocks(row.ctypes.data, row.shape[0], self.inv_t, summed[0].ctypes.data,
                                  summed[1].ctypes.data)
        self.factor, self.weights = np.empty(n), np.empty(n)
        self.total = lib.sd_block_weights(summed[0].ctypes.data, summed[1].ctypes.data, n, self.inv_t,
                                          self.factor.ctypes.data, self.weights.ctypes.data)
        self.removed = _NONE_REMOVED
        if min_p > 0.0:  # min-p keeps tokens whose weight (p / p_max) is at least min_p
            self.weights[self.factor < min_p] = 0.0
            for b in np.flatnonzero(self.factor >= min_p):
                self.weights[b] = self._tokens(int(b)).sum()
            self.total = float(self.weights.sum())

    def _tokens(self, b: int) -> np.ndarray:
        """Block b's tokens' weights [64] (float64), removed and min-p-dropped tokens 0."""
        out = np.empty(BLOCK)
        _lib().sd_block_token_weights(self.row.ctypes.data, self.row.shape[0], b, self.inv_t, self.factor[b],
                                      self.min_p, self.removed.ctypes.data, len(self.removed), out.ctypes.data)
        return out

    def prob(self, token: int) -> float:
        return float(self._tokens(token // BLOCK)[token % BLOCK] / self.total)

    def without(self, token: int, q: torch.Tensor | None) -> BlockDist:
        assert q is None, "a sampled draft's residual reads every token's p: verify it with a TensorDist"
        out = object.__new__(BlockDist)
        out.__dict__.update(self.__dict__)
        out.removed = np.append(self.removed, token)
        out.weights = self.weights.copy()
        out.weights[token // BLOCK] = out._tokens(token // BLOCK).sum()
        out.total = float(out.weights.sum())
        if out.total <= 0.0:  # p was one-hot at token: unreachable, as TensorDist's guard
            return self
        return out

    def draw(self, generator: torch.Generator) -> int:
        """``sampling.sample``'s draw: one float64 uniform, as it draws."""
        return self.pick(float(torch.rand(1, 1, dtype=torch.float64, generator=generator)[0, 0]))

    def pick(self, u: float) -> int:
        """The first token whose running mass exceeds u x the total (u in [0, 1)), the blocks' sums first
        (qkernels.c's sd_block_pick)."""
        return _lib().sd_block_pick(self.weights.ctypes.data, len(self.weights), self.row.ctypes.data,
                                    self.row.shape[0], self.inv_t, self.factor.ctypes.data, self.min_p,
                                    self.removed.ctypes.data, len(self.removed), u)


_NONE_REMOVED = np.empty(0, dtype=np.int64)


def inverse_temperature(temperature: float) -> np.float32:
    """1 / T as every block's terms are made (the runner's LM head and ``BlockDist`` alike)."""
    return np.float32(1.0 / max(temperature, 1e-5))


def blocks_apply(params: SamplingParams) -> bool:
    """Whether a row sampled with ``params`` can be a ``BlockDist`` (where its drafts' q are one-hot): a
    temperature, with or without min-p; top-k and top-p read the row's order, which blocks do not keep."""
    return not params.greedy and not params.top_k and params.top_p >= 1.0


def row_dist(logits: torch.Tensor, params: SamplingParams, one_hot: bool = True,
             summed: tuple[np.ndarray, np.ndarray] | None = None) -> TokenDist:
    """The distribution ``probs_from_logits`` gives one [V] row: where the drafts' q are ``one_hot`` a ``BlockDist``
    if it can be made (``blocks_apply``, a CPU float32 row, the kernels built; ``summed``: its blocks from the LM
    head), else a ``TensorDist``."""
    if (one_hot and blocks_apply(params) and logits.device.type == "cpu" and logits.dtype == torch.float32
            and _lib() is not None):
        return BlockDist(logits.contiguous().numpy(), params.temperature, params.min_p, summed)
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
    p, i64, f32, f64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_double
    lib.sd_softmax_blocks.argtypes = [p, i64, f32, p, p]
    lib.sd_block_weights.argtypes = [p, p, i64, f32, p, p]
    lib.sd_block_weights.restype = f64
    lib.sd_block_token_weights.argtypes = [p, i64, i64, f32, f64, f64, p, i64, p]
    lib.sd_block_pick.argtypes = [p, i64, p, i64, f32, p, f64, p, i64, f64]
    lib.sd_block_pick.restype = i64
    return lib
