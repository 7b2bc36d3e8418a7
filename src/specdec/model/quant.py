"""GGUF quantized blocks kept as they are: repacked for the integer-dot kernels (qkernels.c).

A GGUF stores each matrix row as blocks of 32 or 256 values: small integers and
per-block scales (and mins). ``QuantMatrix.from_blocks`` keeps those integers and
scales bit for bit. The 32-value types move into one of four layouts the kernels read
(U4M, U8M, I8; see qkernels.c), with the scales widened to float32; the K-quants
(Q4_K, Q5_K, Q6_K) stay the GGUF's own super-blocks byte for byte (layouts Q4K, Q5K,
Q6K: 4.5, 5.5 and 6.5 bits a weight), their 6- and 8-bit sub-scales applied by the
kernels in the integer domain. Types outside ``SUPPORTED`` are dequantised at load by
the caller (one notice line).

``QuantMatrix.interleaved`` then packs every aligned group of 8 rows of one type into an
interleaved layout (qkernels_x8.h: one 32-bit lane per weight row): Q4_K, Q5_K and Q6_K into Q4KX8 /
Q5KX8 / Q6KX8, Q8_0, Q5_0, Q4_0, Q4_1 and Q5_1 into Q80X8 / Q50X8 / Q40X8 / Q41X8 / Q51X8 (each at GGUF's own bytes,
where U8M spent 10 bits on a 5-bit weight), which the model does once at load for the matrices its
passes multiply by. Where the kernels run AVX-512 (without AMX), two groups of a type at a multiple of 16
rows pack as one group of 16 (Q4KX16, Q5KX16, Q6KX16, Q80X16, ..., qkernels_x16.h: a zmm per step, no
permutes).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants

from specdec.model.layouts import (
    I8,
    Q4K,
    Q4KX8,
    Q4KX16,
    Q5K,
    Q5KX8,
    Q5KX16,
    Q6K,
    Q6KX8,
    Q6KX16,
    Q40X8,
    Q40X16,
    Q41X8,
    Q41X16,
    Q50X8,
    Q50X16,
    Q51X8,
    Q51X16,
    Q80X8,
    Q80X16,
    SUPER_BLOCK,
    U4M,
    U8M,
)

X8_BLOCK = {Q80X8: 34, Q50X8: 22, Q40X8: 18, Q41X8: 20, Q51X8: 24}  # bytes per 32 values and row: GGUF's own
X8 = 8  # weight rows per interleaved group (X16: 16)
X8_LAYOUTS = (Q4KX8, Q5KX8, Q6KX8, *X8_BLOCK)
WIDE = {Q4KX8: Q4KX16, Q5KX8: Q5KX16, Q6KX8: Q6KX16, Q80X8: Q80X16, Q50X8: Q50X16, Q40X8: Q40X16,
        Q41X8: Q41X16, Q51X8: Q51X16}  # 8 -> 16 rows
BLOCK = X8_BLOCK | {WIDE[f]: size for f, size in X8_BLOCK.items()}  # the 32-value layouts, both widths
INTERLEAVED = (*X8_LAYOUTS, *WIDE.values())
GROUP_ROWS = {**dict.fromkeys(X8_LAYOUTS, X8), **dict.fromkeys(WIDE.values(), 2 * X8)}
K_QUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)  # super-blocks of 256 values
SUPPORTED = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, *K_QUANTS)
# types a float checkpoint can be quantized to at load (gguf's own quantizers; it has none for K-quants)
AT_LOAD = {"q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0, "q5_1": T.Q5_1}
_MATRICES = ("wqkv", "wo", "w_gate_up", "w_down")


class QuantArrays(NamedTuple):
    """One quantized matrix as the kernels take it (``QuantMatrix.arrays``; ``kernels.qmatmul(*arrays, x, out)``):
    q its rows' bytes back to back with no padding between them, ``segments`` where each run of one layout starts
    (``segmented``)."""

    q: np.ndarray  # uint8 [bytes]
    s: np.ndarray
    m: np.ndarray
    fmt: np.ndarray
    segments: np.ndarray  # int64 [S, 3]: (first row, byte offset in q, bytes a row)


class QuantStack(NamedTuple):
    """Every layer's quantized matrix of one kind, as the fused kernel walks them (``stack``)."""

    q: np.ndarray  # every layer's bytes back to back: layer l at at[l], its rows as segments[l] place them
    s: np.ndarray  # [layers, rows, *] float32, padded to the widest
    m: np.ndarray
    fmt: np.ndarray  # [layers, rows] int8
    at: np.ndarray  # [layers + 1] int64
    segments: np.ndarray  # [layers, S, 3] int64: each layer's ``QuantArrays.segments``, padded with (rows, 0, 0)


@dataclass
class QuantMatrix:
    """A [rows, k] matrix in kernel layout: q [rows, *] uint8, s and m [rows, *] float32
    (per 32 values; unused by the K-quant layouts), fmt [rows] int8 (rows may mix layouts: q is then as wide as the
    widest, and ``arrays`` packs each run of one layout at its own width for the kernels)."""

    q: np.ndarray
    s: np.ndarray
    m: np.ndarray
    fmt: np.ndarray
    k: int
    types: tuple[str, ...]  # the GGUF block types it came from
    _arrays: QuantArrays | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape[0], self.k

    @property
    def nbytes(self) -> int:
        """Bytes a product reads: each row's own bytes (not the padding of a mixed stack)."""
        return int(row_bytes(self.fmt, self.k).sum())

    def arrays(self) -> QuantArrays:
        """The kernels' arrays (made once: the embedding's are asked for every pass)."""
        if self._arrays is None:
            self._arrays = segmented(self.q, self.fmt, self.k, self.s, self.m)
        return self._arrays

    def dense(self) -> np.ndarray:
        """The float32 [rows, k] matrix these blocks stand for."""
        from specdec.model import kernels  # the kernels' module compiles numba code: load it on use

        out = np.empty(self.shape, dtype=np.float32)
        kernels.dequantize_rows(*self.arrays(), self.k, np.arange(self.shape[0], dtype=np.int64), out)
        return out

    def permute_rows(self, order: np.ndarray) -> QuantMatrix:
        if np.isin(self.fmt, INTERLEAVED).any():
            raise ValueError("interleaved rows move in groups of 8 or 16: permute before ``interleaved``")
        return QuantMatrix(self.q[order], self.s[order], self.m[order], self.fmt[order], self.k, self.types)

    def interleaved(self, wide: bool | None = None) -> QuantMatrix:
        """The same matrix with every group of 8 rows (at a multiple of 8) that shares a type packed into its
        interleaved layout (``x8_layouts``); other rows as they are. With ``wide`` (default: where the
        kernels run AVX-512 without AMX, ``clib.wide_groups``) two such groups at a multiple of 16 pack as
        one of 16 rows (``WIDE``). Bytes per row grow by 4 per Q4_K or Q5_K super-block (its 12 packed
        scale bytes unpacked); the other layouts keep GGUF's bytes."""
        groups = x8_layouts(self)[: len(self.fmt) // X8 * X8].reshape(-1, X8)
        # a group of Q4_0 rows beside Q4_1 ones is Q4_1 with m = -8 d; Q5_0 beside Q5_1 likewise, m = -16 d
        for offset, with_min in ((Q40X8, Q41X8), (Q50X8, Q51X8)):
            groups = np.where((groups == with_min).any(axis=1, keepdims=True) & (groups == offset), with_min, groups)
        todo = {f: np.flatnonzero((groups == f).all(axis=1)) for f in X8_LAYOUTS}
        if wide is None:
            from specdec.model import clib  # builds the kernels: only where a matrix is packed

            wide = clib.wide_groups()
        for narrow, wider in WIDE.items() if wide else ():
            idx = todo[narrow]
            pairs = idx[(idx % 2 == 0) & np.isin(idx + 1, idx)]  # groups 2p and 2p + 1: rows 16p .. 16p + 15
            todo[wider] = pairs // 2
            todo[narrow] = idx[~np.isin(idx // 2, todo[wider])]
        todo = {f: g for f, g in todo.items() if len(g)}
        if not todo:
            return self
        packed = np.zeros(len(self.fmt), dtype=bool)
        for layout, idx in todo.items():
            n = GROUP_ROWS[layout]
            packed[(idx[:, None] * n + np.arange(n)).reshape(-1)] = True
        # rows as wide as the widest layout left: a Q5_0 group is 616 bytes a row where U8M took 896, and
        # rows padded to the old width streamed at 14 GB/s against 20 without the holes
        width = max(q_row_bytes(f, self.k) for f in todo)
        q = np.zeros((self.q.shape[0], width if packed.all() else max(width, self.q.shape[1])), dtype=np.uint8)
        if not packed.all():
            q[~packed, : self.q.shape[1]] = self.q[~packed]
        fmt = self.fmt.copy()
        for layout, idx in todo.items():  # in C, every group of a layout in one call (and without the GIL)
            n = GROUP_ROWS[layout]
            _pack(self, layout, idx, n, q)
            fmt[(idx[:, None] * n + np.arange(n)).reshape(-1)] = layout
        if packed.all():  # the groups carry their scales in q: s and m, a float per 32 values, are no longer read
            s = m = np.zeros((len(fmt), 1), dtype=np.float32)
            return QuantMatrix(q, s, m, fmt, self.k, self.types)
        return QuantMatrix(q, self.s, self.m, fmt, self.k, self.types)

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
        """Rows of several matrices of the same k (a fused q/k/v or gate/up), padded to the widest (``segmented``
        drops the padding)."""
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


_VALUES_32 = {U4M: 16, U8M: 32, I8: 32} | BLOCK  # the 32-value layouts' bytes in q per 32 values
_SCALES_32 = {U4M: 8, U8M: 8, I8: 4}  # and their float32 scales (and mins) in s and m, where not in q


def q_row_bytes(layout: int, k: int) -> int:
    """Bytes a row of ``layout`` over k values takes in q."""
    return SUPER_BLOCK[layout] * (k // 256) if layout in SUPER_BLOCK else _VALUES_32[layout] * (k // 32)


def row_bytes(fmt: np.ndarray, k: int) -> np.ndarray:
    """Bytes each row of layout ``fmt`` (per row) reads in a product over k values: q's, and s's and m's."""
    kinds = np.unique(fmt)  # (a few layouts over up to 152K rows: np.vectorize took 0.3 s of a 0.5B's load)
    per_kind = np.array([q_row_bytes(int(f), k) + _SCALES_32.get(int(f), 0) * (k // 32) for f in kinds])
    return per_kind[np.searchsorted(kinds, fmt)]


def _segments(fmt: np.ndarray, k: int) -> np.ndarray:
    """``QuantArrays.segments`` of rows of layouts ``fmt``: each run of one layout at its own bytes a row."""
    starts = np.flatnonzero(np.r_[True, fmt[1:] != fmt[:-1]])
    segments = np.zeros((len(starts), 3), dtype=np.int64)
    segments[:, 0] = starts
    segments[:, 2] = [q_row_bytes(int(fmt[a]), k) for a in starts]
    sizes = np.diff(np.r_[starts, len(fmt)]) * segments[:, 2]
    segments[1:, 1] = np.cumsum(sizes)[:-1]
    return segments


def segmented(q: np.ndarray, fmt: np.ndarray, k: int, s: np.ndarray, m: np.ndarray) -> QuantArrays:
    """A matrix's [rows, width] bytes as the kernels read them: each run of rows of one layout (a segment) at its
    own bytes a row, back to back. A fused q/k/v matrix of Q4_K and Q6_K rows is as wide as its Q6_K rows (888 and
    1,260 bytes at k = 1,536): with that padding left between its Q4_K groups, a product of Qwen2.5-Coder-1.5B's
    mixed layers took 73.6-77.4 us a layer at 1 row against 44.3-49.8 for the same rows packed (Zen 4, two threads,
    out of cache; 110 against 94 us at 8 rows). A group of n interleaved rows fills the first n x (its bytes a row)
    of its n rows' run, so the packed group is that run's head."""
    segments = _segments(fmt, k)
    return QuantArrays(_packed(q, fmt, segments), s, m, fmt, segments)


def _packed(q: np.ndarray, fmt: np.ndarray, segments: np.ndarray) -> np.ndarray:
    """q's bytes as ``segments`` place them: q itself, flat, where no row is padded."""
    rows, width = q.shape
    if (segments[:, 2] > width).any():
        raise ValueError(f"rows of {width} bytes are too narrow for their layouts")
    if (segments[:, 2] == width).all():
        return q.reshape(-1)
    pieces = []
    for a, b, per_row in zip(segments[:, 0], np.r_[segments[1:, 0], rows], segments[:, 2], strict=True):
        group = GROUP_ROWS.get(int(fmt[a]), 1)
        pieces.append(q[a:b].reshape((b - a) // group, group * width)[:, : group * per_row].reshape(-1))
    return np.concatenate(pieces)


def stack(mats: list[QuantMatrix]) -> QuantStack:
    """Layers' matrices of one kind for the fused kernel: (q, s, m, fmt, at, segments); empties ``mats``.

    q holds every layer's bytes (``segmented``) back to back, layer l at at[l], so a stack mixing Q4_K and Q6_K
    layers keeps each layer at its own size; s and m [layers, rows, *] are padded to the widest (the K-quants use
    none); fmt [layers, rows].
    """
    s_w = max(x.s.shape[1] for x in mats)
    rows = mats[0].q.shape[0]
    s = np.zeros((len(mats), rows, s_w), dtype=np.float32)
    m = np.zeros_like(s)
    fmt = np.stack([x.fmt for x in mats])
    layers = [_segments(x.fmt, x.k) for x in mats]
    at = np.concatenate([[0], np.cumsum([g[-1, 1] + (rows - g[-1, 0]) * g[-1, 2] for g in layers])]).astype(np.int64)
    segments = np.zeros((len(mats), max(len(g) for g in layers), 3), dtype=np.int64)
    segments[:, :, 0] = rows  # padding: a segment no row reaches
    q = np.empty(int(at[-1]), dtype=np.uint8)
    for i in range(len(mats)):
        x, mats[i] = mats[i], None  # let each layer's copy go once moved: peak memory ~ one stack, not two
        s[i, :, : x.s.shape[1]] = x.s
        m[i, :, : x.m.shape[1]] = x.m
        q[at[i] : at[i + 1]] = _packed(x.q, x.fmt, layers[i])
        segments[i, : len(layers[i])] = layers[i]
    return QuantStack(q, s, m, fmt, at, segments)


def stack_layer(stacked: QuantStack, layer: int) -> QuantArrays:
    """One layer's matrix of a ``stack`` (what ``kernels.layer_weight`` does in compiled code)."""
    q, s, m, fmt, at, segments = stacked
    return QuantArrays(q[at[layer] : at[layer + 1]], s[layer], m[layer], fmt[layer], segments[layer])


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


def _five_bit(data: np.ndarray, rows: int, size: int) -> np.ndarray:
    """Q5_0 / Q5_1 blocks of ``size`` bytes (22, 24: the scale(s), 32 high bits (value i: bit i), 16 bytes of
    nibbles) -> values 0..31 [rows, k], in C (qkernels.c's sd_unpack_q5: one pass, without the GIL)."""
    from specdec.model import clib  # builds the kernels: only where such a matrix is loaded

    data = np.ascontiguousarray(data)
    n_blocks = data.size // size
    out = np.empty((rows, n_blocks // rows * 32), dtype=np.uint8)
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    clib.load_qkernels().sd_unpack_q5(ptr(data.ctypes.data), i64(n_blocks), i64(size), i64(size - 20),
                                      i64(size - 16), ptr(out.ctypes.data))
    return out


def _q5_0(data, rows, k):
    b = _blocks(data, rows, 22)
    d = _f16(b[:, :, 0:2]).reshape(rows, -1)
    return _five_bit(data, rows, 22), d, -16.0 * d, U8M


def _q5_1(data, rows, k):
    b = _blocks(data, rows, 24)
    q = _five_bit(data, rows, 24)
    return q, _f16(b[:, :, 0:2]).reshape(rows, -1), _f16(b[:, :, 2:4]).reshape(rows, -1), U8M


def _biased(q: np.ndarray) -> np.ndarray:
    """int8 values -> the I8 layout's bytes, q + 128 (see qkernels.c): the sign bit flipped, one pass (the int16
    round trip took 1.6 s of Qwen2.5-Coder-0.5B's load)."""
    return q.view(np.uint8) ^ np.uint8(0x80)


def _q8_0(data, rows, k):
    b = _blocks(data, rows, 34)
    q = _biased(b[:, :, 2:].view(np.int8))
    return q.reshape(rows, -1), _f16(b[:, :, 0:2]).reshape(rows, -1), np.zeros((rows, 1)), I8


def int8_rows(weight: np.ndarray) -> QuantMatrix:
    """[rows, k] float32 -> Q8_0's values (int8 per 32-block, a scale each, float16 as in GGUF) in kernel
    layout, interleaved, without a GGUF round trip (an EAGLE head's drafting copies, a draft model's cut
    LM head). k must be a multiple of 64."""
    rows, k = weight.shape
    if k % 64:
        raise ValueError(f"quantized rows need a multiple of 64 values, not {k}")
    blocks = weight.reshape(rows, k // 32, 32)
    scale = (np.abs(blocks).max(axis=-1) / 127.0).astype(np.float16).astype(np.float32)
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(blocks / scale[..., None]), -127, 127).astype(np.int8).reshape(rows, k)
    return QuantMatrix(_biased(q), scale, np.zeros((rows, 1), np.float32), np.full(rows, I8, dtype=np.int8), k,
                       ("Q8_0",)).interleaved()


def _pack(mat: QuantMatrix, layout: int, groups: np.ndarray, n: int, out: np.ndarray) -> None:
    """Groups ``groups`` of n = 8 or 16 rows into their runs of ``out``'s rows as ``layout`` (qkernels_x8.h,
    qkernels_x16.h): qkernels.c's sd_pack_q45k and sd_pack_q6k for the K-quants, sd_pack_blocks for the 32-value
    layouts, one pass over the bytes (NumPy's transposes took ~4.5 s of Qwen2.5-Coder-1.5B's load and 3.3 s of the
    0.5B's; tests/test_quant.py keeps them as the layouts' reference)."""
    from specdec.model import clib  # builds the kernels: only where a matrix is packed

    src, groups = np.ascontiguousarray(mat.q), np.ascontiguousarray(groups, dtype=np.int64)
    if not out.flags.c_contiguous:
        raise ValueError("the packed rows must be one C-contiguous array")
    i64, ptr, lib = ctypes.c_int64, ctypes.c_void_p, clib.load_qkernels()
    rows = (ptr(groups.ctypes.data), i64(len(groups)), i64(n))
    if layout in BLOCK:
        narrow = {v: k for k, v in WIDE.items()}.get(layout, layout)
        nb = mat.k // 32
        # float16 bits of every row's scales (exact for the packed rows: x8_layouts checked; rows of other layouts
        # are not read, whatever their cast gives)
        half = lambda a: np.ascontiguousarray(a[:, :nb], dtype=np.float16).view(np.uint16)  # noqa: E731
        with np.errstate(over="ignore"):
            d = half(mat.s)
            m = half(mat.m) if narrow in (Q41X8, Q51X8) else None
        kind = {U4M: 0, U8M: 1, I8: 2}[int(mat.fmt[groups[0] * n])]
        lib.sd_pack_blocks(ptr(src.ctypes.data), i64(src.shape[1]), i64(kind), i64(narrow in (Q50X8, Q51X8)),
                           ptr(d.ctypes.data), ptr(None if m is None else m.ctypes.data), i64(nb), *rows,
                           ptr(out.ctypes.data), i64(out.shape[1]))
        return
    head = (ptr(src.ctypes.data), i64(src.shape[1]), *rows, i64(mat.k // 256))
    if layout in (Q6KX8, Q6KX16):
        lib.sd_pack_q6k(*head, ptr(out.ctypes.data), i64(out.shape[1]))
    else:
        lib.sd_pack_q45k(*head, i64(layout in (Q5KX8, Q5KX16)), ptr(out.ctypes.data), i64(out.shape[1]))


def _k_quant(layout: int):
    """Q4_K, Q5_K, Q6_K: the super-blocks as they are (the kernels read GGUF's own packing)."""

    def keep(data, rows, k):
        if k % 256:
            raise ValueError(f"K-quant rows hold whole super-blocks of 256 values, not {k}")
        none = np.zeros((rows, 1), dtype=np.float32)
        return data.reshape(rows, -1), none, none, layout

    return keep


def _f16_exact(a: np.ndarray) -> np.ndarray:
    """Per row: every value of ``a`` [rows, n] is a float16 (a GGUF scale widened), so a layout storing
    float16 keeps it bit for bit."""
    with np.errstate(over="ignore"):
        return (a.astype(np.float16).astype(np.float32) == a).all(axis=1)


def x8_layouts(mat: QuantMatrix) -> np.ndarray:
    """Per row, the interleaved layout its type packs into (-1: none). The 32-value layouts store GGUF's
    float16 scales, so a row qualifies only where its scales (and Q4_1's mins) are float16 values, and
    Q5_0 / Q4_0 only where m = -16 d / -8 d (U8M and U4M carry Q5_1 and Q4_1 too)."""
    nb = mat.k // 32
    s, m = mat.s[:, :nb], mat.m[:, :nb]
    out = np.full(len(mat.fmt), -1, dtype=np.int64)
    out[mat.fmt == Q4K] = Q4KX8
    out[mat.fmt == Q5K] = Q5KX8
    out[mat.fmt == Q6K] = Q6KX8
    if mat.k % 32 or not np.isin(mat.fmt, (U4M, U8M, I8)).any():
        return out
    scales = _f16_exact(s)
    out[(mat.fmt == I8) & scales] = Q80X8
    out[(mat.fmt == U8M) & scales & _f16_exact(m)] = Q51X8
    out[(mat.fmt == U8M) & scales & (m == -16.0 * s).all(axis=1)] = Q50X8
    out[(mat.fmt == U4M) & scales & _f16_exact(m)] = Q41X8
    out[(mat.fmt == U4M) & scales & (m == -8.0 * s).all(axis=1)] = Q40X8
    return out


_REPACK = {
    T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q5_0: _q5_0, T.Q5_1: _q5_1, T.Q8_0: _q8_0,
    T.Q4_K: _k_quant(Q4K), T.Q5_K: _k_quant(Q5K), T.Q6_K: _k_quant(Q6K),
}
