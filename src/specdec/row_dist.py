"""One row of the target's sampled distribution, as the verifier reads it: a token's probability, the residual
after a rejected draft, a draw.

``TensorDist`` holds the row's [V] probabilities (``sampling.probs_from_logits``). ``BlockDist`` (a CPU row of
float32 logits, any of ``probs_from_logits``' filters) holds the softmax in blocks of 64 columns instead: each
block's largest logit and sum of terms, summed by the LM head's sweep as it wrote the logits (``PassOutput.blocks``)
or by qkernels.c's ``sd_softmax_blocks`` here, and a block's terms made again where a token is read. A rejected
deterministic draft takes its token out of its block, and a draw finds the block in the blocks' float64 running sums,
then the token in its block's. The same distribution up to float rounding: softmax(logits / T) over what top-k, top-p
and min-p keep. A plain sampled step's verify on Qwen2.5-Coder-1.5B (151,936 columns; Zen 4, under
cProfile, ``scripts/step_work.py --spec none --rows ...``): 0.81-0.93 ms with torch's softmax and the float64
cumulative draw, 0.41-0.67 summed here, 0.35-0.49 summed by the head (docs/performance.md, fifty-first session).
"""

from __future__ import annotations

import copy
import ctypes
import functools
import threading
from typing import Protocol

import numpy as np
import torch

from specdec.config import SamplingParams
from specdec.sampling import MIN_TEMPERATURE, probs_from_logits, sample

BLOCK = 64  # qkernels.c's SOFTMAX_BLOCK


class TokenDist(Protocol):
    def prob(self, token: int) -> float: ...

    def without(self, token: int, q: torch.Tensor | None) -> TokenDist:
        """norm(max(0, p - q)); q None means one-hot at ``token``."""
        ...

    def draw(self, generator: torch.Generator) -> int: ...

    def probs(self) -> torch.Tensor:
        """[V] every token's probability (a sampled draft's q, a residual's p)."""
        ...


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

    def probs(self) -> torch.Tensor:
        return self.p


class BlockDist:
    """softmax(row / T) of a CPU float32 row in 64-column blocks, with ``probs_from_logits``' filters: the tokens
    top-k, top-p and min-p drop weigh 0.

    A block's weight is its sum of terms times exp((its max - the row's max) / T), in float64; a token's is its term
    times the same factor, so the row's largest token weighs 1 and a block's largest its factor. Top-k and top-p keep
    a prefix of the tokens in descending weight (ties: top-k keeps them all, top-p in id order), found among the
    tokens above a threshold (blocks whose factor is below it hold none): a weight floor and the last id kept at it
    (qkernels.c's sd_block_floor). Blocks a filter or a rejected token touches are summed again from their tokens'
    weights. The arithmetic is qkernels.c's (a few calls a row: right after a pass, with the caches cold, each NumPy
    call on the blocks cost 20-60 us)."""

    def __init__(self, row: np.ndarray, params: SamplingParams,
                 summed: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """summed: the blocks' (top, sums) as the LM head summed them at ``inverse_temperature(params.temperature)``
        (``PassOutput.blocks``), else summed here."""
        lib = _lib()
        self.row, self.inv_t, self.min_p = row, ctypes.c_float(inverse_temperature(params.temperature)), params.min_p
        n = (row.shape[0] + BLOCK - 1) // BLOCK
        if summed is None:
            summed = np.empty(n, dtype=np.float32), np.empty(n, dtype=np.float32)
            lib.sd_softmax_blocks(row.ctypes.data, row.shape[0], self.inv_t, summed[0].ctypes.data,
                                  summed[1].ctypes.data)
        self.factor, self.weights = np.empty(n), np.empty(n)
        self.total = lib.sd_block_weights(summed[0].ctypes.data, summed[1].ctypes.data, n, self.inv_t,
                                          self.factor.ctypes.data, self.weights.ctypes.data)
        self.removed, self.floor, self.id_floor = _NONE_REMOVED, -1.0, _EVERY_ID
        if params.top_k or params.top_p < 1.0:
            at = ctypes.c_int64()
            self.floor = lib.sd_block_floor(row.ctypes.data, row.shape[0], n, self.inv_t, self.factor.ctypes.data,
                                            params.top_k, params.top_p, _scratch(row.shape[0]).ctypes.data,
                                            self.weights.ctypes.data, ctypes.byref(at))
            self.id_floor = at.value
        if params.top_k or params.top_p < 1.0 or params.min_p > 0.0:
            self.total = self._reweigh()

    def _cuts(self) -> tuple:
        """qkernels.c's arguments for what weighs 0: min_p, the floor and its last id, the removed ids and their
        count (sd_block_token_weights)."""
        return self.min_p, self.floor, self.id_floor, self.removed.ctypes.data, len(self.removed)

    def _reweigh(self) -> float:
        """Every block's weight summed from its tokens' past the floor and min-p; their total."""
        return _lib().sd_block_reweigh(self.row.ctypes.data, self.row.shape[0], len(self.factor), self.inv_t,
                                       self.factor.ctypes.data, *self._cuts(), self.weights.ctypes.data)

    def _tokens(self, b: int) -> np.ndarray:
        """Block b's tokens' weights [64] (float64), removed and filtered tokens 0."""
        out = np.empty(BLOCK)
        _lib().sd_block_token_weights(self.row.ctypes.data, self.row.shape[0], b, self.inv_t, self.factor[b],
                                      *self._cuts(), out.ctypes.data)
        return out

    def prob(self, token: int) -> float:
        return float(self._tokens(token // BLOCK)[token % BLOCK] / self.total)

    def without(self, token: int, q: torch.Tensor | None) -> TokenDist:
        if q is not None:  # a sampled draft's residual reads every token's p
            return TensorDist(self.probs()).without(token, q)
        out = copy.copy(self)
        out.removed = np.append(self.removed, token)
        out.weights = self.weights.copy()
        out.weights[token // BLOCK] = out._tokens(token // BLOCK).sum()
        out.total = float(out.weights.sum())
        if out.total <= 0.0:  # p was one-hot at token: unreachable, as TensorDist's guard
            return self
        return out

    def probs(self) -> torch.Tensor:
        """The row's [V] probabilities (float32): a residual against a sampled draft's q, a draft model's q."""
        out = torch.empty(self.row.shape[0], dtype=torch.float32)
        _lib().sd_block_probs(self.row.ctypes.data, self.row.shape[0], len(self.factor), self.inv_t,
                              self.factor.ctypes.data, *self._cuts(), self.total, out.numpy().ctypes.data)
        return out

    def draw(self, generator: torch.Generator) -> int:
        """``sampling.sample``'s draw: one float64 uniform, as it draws."""
        return self.pick(float(torch.rand(1, 1, dtype=torch.float64, generator=generator)[0, 0]))

    def pick(self, u: float) -> int:
        """The first token whose running mass exceeds u x the total (u in [0, 1)), the blocks' sums first
        (qkernels.c's sd_block_pick)."""
        return _lib().sd_block_pick(self.weights.ctypes.data, len(self.weights), self.row.ctypes.data,
                                    self.row.shape[0], self.inv_t, self.factor.ctypes.data, *self._cuts(), u)


_NONE_REMOVED = np.empty(0, dtype=np.int64)
_EVERY_ID = (1 << 63) - 1  # id_floor where no floor cuts a tie (qkernels.c's INT64_MAX)


_SCRATCH = threading.local()


def _scratch(n: int) -> np.ndarray:
    """sd_block_floor's tokens (16 bytes each) for an n-token row: one a thread, kept (its pages touched only as far
    as a row gathers)."""
    have = getattr(_SCRATCH, "tokens", None)
    if have is None or have.shape[0] < 2 * n:
        have = _SCRATCH.tokens = np.empty(2 * n, dtype=np.int64)
    return have


def inverse_temperature(temperature: float) -> np.float32:
    """1 / T as every block's terms are made (the runner's LM head and ``BlockDist`` alike)."""
    return np.float32(1.0 / max(temperature, MIN_TEMPERATURE))


def row_dist(logits: torch.Tensor, params: SamplingParams, one_hot: bool = True,
             summed: tuple[np.ndarray, np.ndarray] | None = None) -> TokenDist:
    """The distribution ``probs_from_logits`` gives one sampled [V] row: a ``BlockDist`` where it can be made (a CPU
    float32 row, the kernels built; ``summed``: its blocks from the LM head), as a ``TensorDist`` of its probabilities
    where the drafts' q are not ``one_hot`` (the residual reads every token's p); elsewhere a ``TensorDist`` of
    torch's softmax."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and _lib() is not None:
        dist = BlockDist(logits.contiguous().numpy(), params, summed)
        return dist if one_hot else TensorDist(dist.probs())
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
    lib.sd_block_token_weights.argtypes = [p, i64, i64, f32, f64, f64, f64, i64, p, i64, p]
    lib.sd_block_reweigh.argtypes = [p, i64, i64, f32, p, f64, f64, i64, p, i64, p]
    lib.sd_block_reweigh.restype = f64
    lib.sd_block_floor.argtypes = [p, i64, i64, f32, p, i64, f64, p, p, p]
    lib.sd_block_floor.restype = f64
    lib.sd_block_probs.argtypes = [p, i64, i64, f32, p, f64, f64, i64, p, i64, f64, p]
    lib.sd_block_pick.argtypes = [p, i64, p, i64, f32, p, f64, f64, i64, p, i64, f64]
    lib.sd_block_pick.restype = i64
    return lib
