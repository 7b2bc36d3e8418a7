"""GGUF quantized blocks kept as they are: repacked for the integer-dot kernels (qkernels.c).

A GGUF stores each matrix row as blocks of 32 or 256 values: small integers and
per-block scales (and mins). ``QuantMatrix.from_blocks`` keeps those integers and
scales bit for bit, only moved into one of four layouts the kernels read (U4M, U8M,
I8, I8H; see qkernels.c), with the scales widened to float32. Types outside
``SUPPORTED`` are dequantised at load by the caller (one notice line).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants

U4M, U8M, I8, I8H = 0, 1, 2, 3
SUPPORTED = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K)
# types a float checkpoint can be quantized to at load (gguf's own quantizers; it has none for K-quants)
AT_LOAD = {"q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0, "q5_1": T.Q5_1}
_MATRICES = ("wqkv", "wo", "w_gate_up", "w_down")


@dataclass
class QuantMatrix:
    """A [rows, k] matrix in kernel layout: q [rows, *] uint8, s and m [rows, *] float32
    (per 32 values, or per 16 for I8H), fmt [rows] int8 (rows may mix layouts)."""

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
        q_bytes = np.where(self.fmt == U4M, self.k // 2, self.k).sum()
        scales = np.where(self.fmt == I8H, self.k // 16, self.k // 32)
        m_bytes = np.where((self.fmt == U4M) | (self.fmt == U8M), self.k // 32, 0).sum() * 4
        return int(q_bytes + scales.sum() * 4 + m_bytes)

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


def stack(mats: list[QuantMatrix]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Layers' matrices of one kind as [layers, rows, *] arrays (padded to the widest layout)."""
    q_w, s_w = max(x.q.shape[1] for x in mats), max(x.s.shape[1] for x in mats)
    q = np.zeros((len(mats), mats[0].q.shape[0], q_w), dtype=np.uint8)
    s = np.zeros((len(mats), mats[0].s.shape[0], s_w), dtype=np.float32)
    m = np.zeros_like(s)
    for i, x in enumerate(mats):
        q[i, :, : x.q.shape[1]] = x.q
        s[i, :, : x.s.shape[1]] = x.s
        m[i, :, : x.m.shape[1]] = x.m
    return q, s, m, np.stack([x.fmt for x in mats])


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
    """int8 values -> the I8/I8H layout's bytes, q + 128 (see qkernels.c)."""
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


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins (llama.cpp's get_scale_min_k4)."""
    d, m, md = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_k(data, rows, k):
    b = _blocks(data, rows, 144)
    d, dmin = _f16(b[:, :, 0:2]), _f16(b[:, :, 2:4])
    sc, mn = _k_scales(b[:, :, 4:16])
    qs = b[:, :, 16:].reshape(rows, -1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 1, 2, 1)
    q = (qs & 15).reshape(rows, -1)  # 8 sub-blocks of 32 per 256, in order
    return _nibbles(q), (d * sc).reshape(rows, -1), -(dmin * mn).reshape(rows, -1), U4M


def _q5_k(data, rows, k):
    b = _blocks(data, rows, 176)
    d, dmin = _f16(b[:, :, 0:2]), _f16(b[:, :, 2:4])
    sc, mn = _k_scales(b[:, :, 4:16])
    qh, qs = b[:, :, 16:48], b[:, :, 48:]
    low = (qs.reshape(rows, -1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 1, 2, 1)) & 15
    high = (qh.reshape(rows, -1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1
    q = (low.reshape(rows, -1, 8, 32) | (high << 4)).reshape(rows, -1)
    return q, (d * sc).reshape(rows, -1), -(dmin * mn).reshape(rows, -1), U8M


def _q6_k(data, rows, k):
    b = _blocks(data, rows, 210)
    ql, qh, scales, d = b[:, :, 0:128], b[:, :, 128:192], b[:, :, 192:208], _f16(b[:, :, 208:210])
    low = (ql.reshape(rows, -1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 1, 2, 1)) & 15
    high = (qh.reshape(rows, -1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 1, 4, 1)) & 3
    q = (low.reshape(rows, -1, 8, 32) | (high.reshape(rows, -1, 8, 32) << 4)).astype(np.int16) - 32
    s = d * scales.view(np.int8).astype(np.float32)  # [rows, blocks, 16], one per 16 values
    return (q + 128).astype(np.uint8).reshape(rows, -1), s.reshape(rows, -1), np.zeros((rows, 1)), I8H


_REPACK = {
    T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q5_0: _q5_0, T.Q5_1: _q5_1, T.Q8_0: _q8_0,
    T.Q4_K: _q4_k, T.Q5_K: _q5_k, T.Q6_K: _q6_k,
}
