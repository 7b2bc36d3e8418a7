"""GGUF quantized blocks kept as they are: repacked for the integer-dot kernels (qkernels.c).

A GGUF stores each matrix row as blocks of 32 or 256 values: small integers and
per-block scales (and mins). ``QuantMatrix.from_blocks`` keeps those integers and
scales bit for bit. The 32-value types move into one of four layouts the kernels read
(U4M, U8M, I8; see qkernels.c), with the scales widened to float32; the K-quants
(Q4_K, Q5_K, Q6_K) stay the GGUF's own super-blocks byte for byte (layouts Q4K, Q5K,
Q6K: 4.5, 5.5 and 6.5 bits a weight), their 6- and 8-bit sub-scales applied by the
kernels in the integer domain. Types outside ``SUPPORTED`` are dequantised at load by
the caller (one notice line).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants

U4M, U8M, I8, Q4K, Q5K, Q6K = 0, 1, 2, 4, 5, 6
SUPER_BLOCK = {Q4K: 144, Q5K: 176, Q6K: 210}  # bytes per 256 values of the K-quant layouts
K_QUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)  # super-blocks of 256 values
SUPPORTED = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, *K_QUANTS)
# types a float checkpoint can be quantized to at load (gguf's own quantizers; it has none for K-quants)
AT_LOAD = {"q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0, "q5_1": T.Q5_1}
_MATRICES = ("wqkv", "wo", "w_gate_up", "w_down")


@dataclass
class QuantMatrix:
    """A [rows, k] matrix in kernel layout: q [rows, *] uint8, s and m [rows, *] float32
    (per 32 values; unused by the K-quant layouts), fmt [rows] int8 (rows may mix layouts)."""

    q: np.ndarray
    s: np.ndarray
    m: np.ndarray
    fmt: np.ndarray
    k: int
    types: tuple[str, ...]  # the GGUF block types it came from

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape[0], self.k

    @property
    def nbytes(self) -> int:
        """Bytes a product reads: each row's own bytes (not the padding of a mixed stack)."""
        return int(row_bytes(self.fmt, self.k).sum())

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.q, self.s, self.m, self.fmt

    def dense(self) -> np.ndarray:
        """The float32 [rows, k] matrix these blocks stand for."""
        from specdec.model import kernels  # the kernels' module compiles numba code: load it on use

        out = np.empty(self.shape, dtype=np.float32)
        kernels.dequantize_rows(*self.arrays(), self.k, np.arange(self.shape[0], dtype=np.int64), out)
        return out

    def permute_rows(self, order: np.ndarray) -> QuantMatrix:
        return QuantMatrix(self.q[order], self.s[order], self.m[order], self.fmt[order], self.k, self.types)

    @staticmethod
    def from_blocks(data: np.ndarray, qtype: T, k: int) -> QuantMatrix:
        """Rows of raw GGUF blocks (uint8 [rows, bytes per row]) of a [rows, k] matrix, k % 64 == 0."""
        if k % 64:
            raise ValueError(f"quantized rows need a multiple of 64 values, not {k}")
        rows = data.shape[0]
        q, s, m, fmt = _REPACK[qtype](data.reshape(rows, -1), rows, k)
        return QuantMatrix(
            np.ascontiguousarray(q, dtype=np.uint8), np.ascontiguousarray(s, dtype=np.float32),
            np.ascontiguousarray(m, dtype=np.float32), np.full(rows, fmt, dtype=np.int8), k, (qtype.name,),
        )

    @staticmethod
    def concat(parts: list[QuantMatrix]) -> QuantMatrix:
        """Rows of several matrices of the same k (a fused q/k/v or gate/up)."""
        k = parts[0].k
        q_w, s_w = max(p.q.shape[1] for p in parts), max(p.s.shape[1] for p in parts)
        pad = lambda a, w: np.pad(a, ((0, 0), (0, w - a.shape[1])))  # noqa: E731
        return QuantMatrix(
            np.concatenate([pad(p.q, q_w) for p in parts]), np.concatenate([pad(p.s, s_w) for p in parts]),
            np.concatenate([pad(p.m, s_w) for p in parts]), np.concatenate([p.fmt for p in parts]), k,
            tuple(dict.fromkeys(t for p in parts for t in p.types)),
        )


def quantize_weights(state: dict[str, torch.Tensor], qtype: T) -> dict[str, torch.Tensor | QuantMatrix]:
    """A float checkpoint's matrices (layer products, embedding, LM head) as ``qtype`` blocks, the way
    llama.cpp's quantize would store them; norms and biases stay float. Rows of a length that is not a
    multiple of 64 stay float too."""
    out: dict[str, torch.Tensor | QuantMatrix] = {}
    for name, w in state.items():
        kind = name.rsplit(".", 1)[-1]
        if (kind in _MATRICES or name in ("embed", "lm_head")) and w.dim() == 2 and w.shape[1] % 64 == 0:
            blocks = quants.quantize(w.float().numpy(), qtype)
            out[name] = QuantMatrix.from_blocks(blocks, qtype, w.shape[1])
        else:
            out[name] = w
    return out


def row_bytes(fmt: np.ndarray, k: int) -> np.ndarray:
    """Bytes each row of layout ``fmt`` (per row) reads in a product over k values."""
    per_32 = {U4M: 16 + 8, U8M: 32 + 8, I8: 32 + 4}  # values, then float32 scales (and mins)
    per_32 |= {f: size / 8 for f, size in SUPER_BLOCK.items()}
    return np.vectorize(per_32.__getitem__)(fmt) * (k // 32)


def stack(mats: list[QuantMatrix]) -> tuple[np.ndarray, ...]:
    """Layers' matrices of one kind for the fused kernel: (q, s, m, fmt, q_at, q_width); empties ``mats``.

    q holds every layer's [rows, width] bytes back to back (layer l at q_at[l], rows q_width[l]
    wide), so a stack mixing Q4_K and Q6_K layers keeps each layer at its own size; s and m
    [layers, rows, *] are padded to the widest (the K-quants use none); fmt [layers, rows].
    """
    s_w = max(x.s.shape[1] for x in mats)
    s = np.zeros((len(mats), mats[0].s.shape[0], s_w), dtype=np.float32)
    m = np.zeros_like(s)
    fmt = np.stack([x.fmt for x in mats])
    width = np.array([x.q.shape[1] for x in mats], dtype=np.int64)
    at = np.concatenate([[0], np.cumsum(width * mats[0].q.shape[0])]).astype(np.int64)
    q = np.empty(int(at[-1]), dtype=np.uint8)
    for i in range(len(mats)):
        x, mats[i] = mats[i], None  # let each layer's copy go once moved: peak memory ~ one stack, not two
        s[i, :, : x.s.shape[1]] = x.s
        m[i, :, : x.m.shape[1]] = x.m
        q[at[i] : at[i + 1]] = x.q.reshape(-1)
    return q, s, m, fmt, at, width


def stack_layer(stacked: tuple[np.ndarray, ...], layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One layer's (q, s, m, fmt) of a ``stack`` (what ``kernels.layer_weight`` does in compiled code)."""
    q, s, m, fmt, at, width = stacked
    return q[at[layer] : at[layer + 1]].reshape(fmt.shape[1], width[layer]), s[layer], m[layer], fmt[layer]


# -- repacking, one function per GGUF type: (q, s, m, layout) ------------------------------------
def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(q: np.ndarray) -> np.ndarray:
    """Values 0..15 [rows, k] -> 32 bytes per 64 (byte j: block 2p's value j low, block 2p+1's high)."""
    q = q.reshape(q.shape[0], -1, 2, 32).astype(np.uint8)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(q.shape[0], -1)


def _unpack_nibbles(qs: np.ndarray) -> np.ndarray:
    """GGUF's Q4_0/Q4_1 blocks of 16 bytes [rows, blocks, 16] -> values 0..15 [rows, blocks * 32]."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1).reshape(qs.shape[0], -1)


def _blocks(data: np.ndarray, rows: int, size: int) -> np.ndarray:
    return data.reshape(rows, -1, size)


def _q4_0(data, rows, k):
    b = _blocks(data, rows, 18)
    d = _f16(b[:, :, 0:2]).reshape(rows, -1)
    return _nibbles(_unpack_nibbles(b[:, :, 2:])), d, -8.0 * d, U4M


def _q4_1(data, rows, k):
    b = _blocks(data, rows, 20)
    q = _nibbles(_unpack_nibbles(b[:, :, 4:]))
    return q, _f16(b[:, :, 0:2]).reshape(rows, -1), _f16(b[:, :, 2:4]).reshape(rows, -1), U4M


def _five_bit(qs: np.ndarray, qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1: 16 bytes of nibbles + 32 high bits (value i: bit i) -> values 0..31 [.., 32]."""
    low = np.concatenate([qs & 15, qs >> 4], axis=-1)
    bits = np.unpackbits(qh, axis=-1, bitorder="little")
    return low | (bits << 4)


def _q5_0(data, rows, k):
    b = _blocks(data, rows, 22)
    d = _f16(b[:, :, 0:2]).reshape(rows, -1)
    return _five_bit(b[:, :, 6:], b[:, :, 2:6]).reshape(rows, -1), d, -16.0 * d, U8M


def _q5_1(data, rows, k):
    b = _blocks(data, rows, 24)
    q = _five_bit(b[:, :, 8:], b[:, :, 4:8]).reshape(rows, -1)
    return q, _f16(b[:, :, 0:2]).reshape(rows, -1), _f16(b[:, :, 2:4]).reshape(rows, -1), U8M


def _biased(q: np.ndarray) -> np.ndarray:
    """int8 values -> the I8 layout's bytes, q + 128 (see qkernels.c)."""
    return (q.astype(np.int16) + 128).astype(np.uint8)


def _q8_0(data, rows, k):
    b = _blocks(data, rows, 34)
    q = _biased(b[:, :, 2:].view(np.int8))
    return q.reshape(rows, -1), _f16(b[:, :, 0:2]).reshape(rows, -1), np.zeros((rows, 1)), I8


def int8_rows(weight: np.ndarray) -> QuantMatrix:
    """[rows, k] float32 -> Q8_0's values (int8 per 32-block, a float32 scale each) in kernel layout,
    without a GGUF round trip (an EAGLE head's drafting copies). k must be a multiple of 64."""
    rows, k = weight.shape
    if k % 64:
        raise ValueError(f"quantized rows need a multiple of 64 values, not {k}")
    blocks = weight.reshape(rows, k // 32, 32)
    scale = np.abs(blocks).max(axis=-1) / 127.0
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(blocks / scale[..., None]), -127, 127).astype(np.int8).reshape(rows, k)
    return QuantMatrix(_biased(q), scale.astype(np.float32), np.zeros((rows, 1), np.float32),
                       np.full(rows, I8, dtype=np.int8), k, ("Q8_0",))


def _k_quant(layout: int):
    """Q4_K, Q5_K, Q6_K: the super-blocks as they are (the kernels read GGUF's own packing)."""

    def keep(data, rows, k):
        if k % 256:
            raise ValueError(f"K-quant rows hold whole super-blocks of 256 values, not {k}")
        none = np.zeros((rows, 1), dtype=np.float32)
        return data.reshape(rows, -1), none, none, layout

    return keep


_REPACK = {
    T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q5_0: _q5_0, T.Q5_1: _q5_1, T.Q8_0: _q8_0,
    T.Q4_K: _k_quant(Q4K), T.Q5_K: _k_quant(Q5K), T.Q6_K: _k_quant(Q6K),
}
