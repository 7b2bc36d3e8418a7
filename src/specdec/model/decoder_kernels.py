"""CPU kernels (numba) for decode and verify passes: the fused decoder stack and its parts.

A decode or verify pass runs a few rows (one per new token, over any mix of
sequences, chains and trees) through every layer. Done op by op in torch, each
of a layer's ~20 small ops pays dispatch and threading overhead; ``decode_layers``
runs the whole stack as one compiled call instead: per layer an RMSNorm, the
fused q/k/v product, q/k norms, rope, the cache write, attention, the output
projection, the residual, and the MLP. The products (and the MLP's activation, inside its
gate/up product) are ``kernels``'.

``attention`` works per (8 rows of a sequence, KV head, 512-key chunk), each job
in C (qkernels_attention.h): every query head of the KV group meets the chunk's
keys and values while they sit in L1, so a chunk of the cache is read once per
8 rows, not once per row and head. Long contexts split into fixed key chunks that
both cores share; each row's chunks are combined in key order (softmax
rescaling), so the split never depends on the pass either.

Bit-identity. A row's attention output depends only on its query and its visible keys,
one after another in key order, wherever they sit in the cache; the norms, rope and the
gated activation are elementwise or per row. So, with the products', a token's logits in
a K-token verification pass are bit-identical to the same token decoded alone. The KV cache
is float32, or 16-bit floats written with round-to-nearest-even: bfloat16 bits as uint16, float16
bits as int16 (numba has neither type; ``kernels.as_numpy``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from specdec.model.kernels import (
    _FLAGS,
    _widen,
    argmax_rows,
    dequantize_rows,
    gated_product,
    layer_weight,
    matmul,
    product,
    qmatmul,
    qmatmul_argmax,
    softmax_blocks,
    stack_rows,
)

# qkernels.c's attention jobs, resolved by name when numba compiles a caller (importing kernels loaded the library)
_sd_attend = types.ExternalFunction("sd_attend", types.void(*([types.intp] * 9), types.float64, *([types.intp] * 4)))
_sd_rms_norm = types.ExternalFunction("sd_rms_norm", types.void(types.intp, types.intp, types.intp, types.float64,
                                                                 types.intp))
# The glue between the products (norms, rope, residuals) compiled without fastmath: with it LLVM contracted and
# reordered that float arithmetic as each caller's compilation chose, so the bits of a pass moved when the code
# around it changed (a whole pass in one call moved Qwen2.5-Coder-0.5B's, typing its arguments anew the 1.5B's on
# the AVX-512 build only). Each row's steps are then fixed by the source, whatever compiles them.
_GLUE = dict(_FLAGS, fastmath=False)
_ATTENTION_ROWS = 8  # query rows per attention job: more jobs for two cores, few re-reads of the cache
_KEY_CHUNK = 512  # keys per attention job (split-K); fixed boundaries keep every row's bits


def _store(dst, src):  # pragma: no cover - replaced by the overload below
    """dst[:] = src (float32) in dst's element type (bfloat16 bits in uint16, float16 bits in int16: round to
    nearest even)."""


@njit(**_FLAGS)  # (inline="always" trips numba's SSA check on its branches; LLVM inlines it)
def half_bits(b: np.uint32) -> np.int16:  # pragma: no cover - compiled
    """IEEE float16 bits of the float32 with bits ``b``, rounded to nearest even (numpy's ``astype(float16)``):
    overflow to infinity, subnormals kept, NaN stays NaN."""
    sign = (b >> np.uint32(16)) & np.uint32(0x8000)
    e = np.int64((b >> np.uint32(23)) & np.uint32(0xFF))
    m = b & np.uint32(0x7FFFFF)
    if e == 0xFF:
        half = sign | np.uint32(0x7C00) | (np.uint32(0x200) if m else np.uint32(0))
    elif e - 112 >= 0x1F:
        half = sign | np.uint32(0x7C00)
    elif e - 112 <= 0:  # a float16 subnormal (or zero): the implicit bit joins the mantissa
        shift = 126 - e  # 14 - (e - 112)
        if shift > 24:
            half = sign
        else:
            m |= np.uint32(0x800000)
            kept, rest, tie = m >> np.uint32(shift), m & np.uint32((1 << shift) - 1), np.uint32(1 << (shift - 1))
            half = sign | (kept + np.uint32(rest > tie or (rest == tie and (kept & np.uint32(1)) != 0)))
    else:
        kept, rest = (np.uint32(e - 112) << np.uint32(10)) | (m >> np.uint32(13)), m & np.uint32(0x1FFF)
        odd = (kept & np.uint32(1)) != 0
        half = sign | (kept + np.uint32(rest > 0x1000 or (rest == 0x1000 and odd)))  # a carry may reach infinity
    return np.int16(np.uint16(half))


@njit(inline="always", **_FLAGS)
def bfloat16_bits(b: np.uint32) -> np.uint16:  # pragma: no cover - compiled
    """bfloat16 bits of the float32 with bits ``b``, rounded to nearest even."""
    return np.uint16((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))


@overload(_store, inline="always")
def _store_impl(dst, src):
    if dst.dtype in (types.int16, types.uint16):
        to_bits = half_bits if dst.dtype == types.int16 else bfloat16_bits

        def store(dst, src):
            wide = np.empty(dst.shape[0], dtype=np.float32)
            for i in range(dst.shape[0]):
                wide[i] = src[i]
            bits = wide.view(np.uint32)
            for i in range(dst.shape[0]):
                dst[i] = to_bits(bits[i])

        return store

    def store(dst, src):
        for i in range(dst.shape[0]):
            dst[i] = src[i]

    return store


# -- attention --------------------------------------------------------------------------------
@njit(parallel=True, **_FLAGS)
def attention(
    q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, row_slot: np.ndarray, row_pos: np.ndarray,
    seq_rows: np.ndarray, mask: np.ndarray, window: int, scale: float, out: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Masked attention of the pass's query rows over their sequences' cached keys and values.

    q [N, Hq, D] float32; k_cache, v_cache [slots, Hkv, max_len, D]; row_slot, row_pos [N];
    seq_rows [S + 1]: rows of sequence s are seq_rows[s]:seq_rows[s + 1] (one slot);
    mask [N, L] (True = visible); window > 0 also hides keys at or beyond ``window``
    positions back; out [N, Hq, D] float32.
    """
    n_heads, dim = q.shape[1], q.shape[2]
    n_kv = k_cache.shape[1]
    group = n_heads // n_kv
    n_keys = mask.shape[1]
    # jobs: (row chunk of one sequence, KV head, key chunk); a chunk's rows share its cache reads
    chunk_start = np.empty(seq_rows[-1] + 1, dtype=np.int64)
    chunk_end = np.empty(seq_rows[-1] + 1, dtype=np.int64)
    n_chunks = 0
    for s in range(seq_rows.shape[0] - 1):
        for r in range(seq_rows[s], seq_rows[s + 1], _ATTENTION_ROWS):
            chunk_start[n_chunks], chunk_end[n_chunks] = r, min(r + _ATTENTION_ROWS, seq_rows[s + 1])
            n_chunks += 1
    n_parts = (n_keys + _KEY_CHUNK - 1) // _KEY_CHUNK
    most = _ATTENTION_ROWS * group
    part_top = np.empty((n_chunks * n_kv * n_parts, most), dtype=np.float32)
    part_total = np.empty((n_chunks * n_kv * n_parts, most), dtype=np.float32)
    part_acc = np.empty((n_chunks * n_kv * n_parts, most, dim), dtype=np.float32)
    for job in prange(n_chunks * n_kv * n_parts):
        c, kvh, part = job // (n_kv * n_parts), (job // n_parts) % n_kv, job % n_parts
        first, n_rows = chunk_start[c], (chunk_end[c] - chunk_start[c]) * group
        _attend_part(q, k_cache, v_cache, row_slot[first], kvh, first, n_rows, group, row_pos, mask, window,
                     scale, part * _KEY_CHUNK, min(n_keys, (part + 1) * _KEY_CHUNK),
                     part_top[job], part_total[job], part_acc[job])
        if n_parts == 1:  # one key chunk: done here, without a second parallel region
            for i in range(n_rows):
                r, h = first + i // group, kvh * group + i % group
                for d in range(dim):
                    out[r, h, d] = part_acc[job, i, d] / part_total[job, i]
    if n_parts == 1:
        return
    for job in prange(n_chunks * n_kv):
        c, kvh = job // n_kv, job % n_kv
        first, n_rows = chunk_start[c], (chunk_end[c] - chunk_start[c]) * group
        for i in range(n_rows):
            r, h = first + i // group, kvh * group + i % group
            top = np.float32(-np.inf)
            for part in range(n_parts):
                if part_total[job * n_parts + part, i] > 0:
                    top = max(top, part_top[job * n_parts + part, i])
            total = np.float32(0.0)
            for d in range(dim):
                out[r, h, d] = 0.0
            for part in range(n_parts):  # in key order: a key chunk no row sees adds nothing
                p = job * n_parts + part
                if part_total[p, i] > 0:
                    f = np.float32(np.exp(part_top[p, i] - top))
                    total += part_total[p, i] * f
                    for d in range(dim):
                        out[r, h, d] += part_acc[p, i, d] * f
            for d in range(dim):
                out[r, h, d] /= total


@njit(**_FLAGS)
def _attend_part(q, k_cache, v_cache, slot, kvh, first, n_rows, group, row_pos, mask, window, scale,
                 k_start, k_end, top, total, acc):  # pragma: no cover - compiled
    """Softmax parts of keys k_start:k_end for n_rows row-heads: max score, sum of weights and
    weighted values relative to that max (combined across key chunks by ``attention``); the
    arithmetic is qkernels_attention.h's (sd_attend)."""
    dim = q.shape[2]
    lo, hi = k_end, k_start  # the span of keys some row sees: a prompt's causal rows (and a batch's shorter
    for i in range(n_rows // group):  # sequences) see no key past their own, and no score outside it is needed
        r = first + i
        for key in range(k_start, k_end):
            if mask[r, key] and (window <= 0 or row_pos[r] - key < window):
                lo, hi = min(lo, key), max(hi, key + 1)
    if hi <= lo:  # no row sees a key of this chunk: it adds nothing (kernels.attention skips total 0)
        top[:n_rows], total[:n_rows] = -np.inf, 0.0
        return
    k_start, n_keys = lo, hi - lo
    qg = np.empty((n_rows, dim), dtype=np.float32)
    for i in range(n_rows):  # (element by element: see _copy_rows)
        for d in range(dim):
            qg[i, d] = q[first + i // group, kvh * group + i % group, d]
    seen = np.empty((n_rows // group, n_keys), dtype=np.uint8)  # which keys each query row sees
    for i in range(n_rows // group):
        r = first + i
        for j in range(n_keys):
            key = k_start + j
            seen[i, j] = mask[r, key] and (window <= 0 or row_pos[r] - key < window)
    scores = np.empty((n_rows, (n_keys + 7) // 8 * 8), dtype=np.float32)
    keys, values = k_cache[slot, kvh, k_start:], v_cache[slot, kvh, k_start:]
    _sd_attend(qg.ctypes.data, n_rows, group, dim, keys.ctypes.data, values.ctypes.data,
               _cache_kind(k_cache), n_keys, seen.ctypes.data, scale, scores.ctypes.data,
               top.ctypes.data, total.ctypes.data, acc.ctypes.data)


def _cache_kind(cache):  # pragma: no cover - replaced by the overload below
    """sd_attend's element type of a cache array: 0 float32, 1 bfloat16 bits (uint16), 2 float16 bits (int16)."""


@overload(_cache_kind, inline="always")
def _cache_kind_impl(cache):
    kind = 1 if cache.dtype == types.uint16 else 2 if cache.dtype == types.int16 else 0
    return lambda cache: kind


# -- the fused decoder stack ------------------------------------------------------------------
@njit(inline="always", **_GLUE)
def _rms_norm(v: np.ndarray, w: np.ndarray, eps: float, out: np.ndarray) -> None:  # pragma: no cover
    """out = v / sqrt(mean(v^2) + eps) * w for one contiguous vector (out may be v): qkernels.c's sd_rms_norm."""
    _sd_rms_norm(v.ctypes.data, w.ctypes.data, v.shape[0], eps, out.ctypes.data)


@njit(**_GLUE)
def rms_norm_rows(x: np.ndarray, w: np.ndarray, eps: float, out: np.ndarray) -> None:  # pragma: no cover
    """RMSNorm row by row (any row count: same bits)."""
    for r in range(x.shape[0]):
        _rms_norm(x[r], w, eps, out[r])


@njit(inline="always", **_GLUE)
def _rope(v: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> None:  # pragma: no cover
    """Rotate the pairs (2i, 2i + 1) of one head by the position's angles."""
    for i in range(cos.shape[0]):
        a, b = v[2 * i], v[2 * i + 1]
        v[2 * i] = a * cos[i] - b * sin[i]
        v[2 * i + 1] = a * sin[i] + b * cos[i]


@njit(inline="always", **_GLUE)
def _copy_rows(dst: np.ndarray, src: np.ndarray) -> None:  # pragma: no cover
    """dst[...] = src, two-dimensional: an array assigned to a slice compiles numba's shape-mismatch message (string
    formatting, ~6 s of a cold first pass) that these loops never need."""
    for r in range(dst.shape[0]):
        for i in range(dst.shape[1]):
            dst[r, i] = src[r, i]


@njit(inline="always", **_GLUE)
def _add_rows(x: np.ndarray, y: np.ndarray) -> None:  # pragma: no cover
    for r in range(x.shape[0]):
        for i in range(x.shape[1]):
            x[r, i] += y[r, i]


class RowLayout(NamedTuple):
    """Where each of a pass's N rows sits (``decode_layers``' rows; built by the runner).

    slots, positions, write_at: [N] int64, a row's cache row, rope position and cache entry;
    seq_rows: [S + 1], rows of sequence s are seq_rows[s]:seq_rows[s + 1]; mask: [N, L] bool,
    True where a row may attend to a cache entry; parent_rows: [N] int64, a row's parent row in the pass (-1: its
    parent is in the cache).
    """

    slots: np.ndarray
    positions: np.ndarray
    write_at: np.ndarray
    seq_rows: np.ndarray
    mask: np.ndarray
    parent_rows: np.ndarray


class Rows(NamedTuple):
    """Inputs of one fused pass: N new tokens of S sequences, sequence by sequence, unpadded. Where each row sits
    (``RowLayout``) is built from them inside the pass's compiled call (``row_layout``); the call takes them one by
    one, as it takes every NamedTuple here as a plain tuple (``plain``).

    ids [N] int64 token ids; seqs [S, 3] int64: each sequence's cache row, its cache entries before the pass and
    its new tokens; parents [N] int64: each new token's parent among its sequence's new tokens (-1: the cached
    context), or [0] when every sequence adds a chain; kv_len: the cache entries the pass reads.
    """

    ids: np.ndarray
    seqs: np.ndarray
    parents: np.ndarray
    kv_len: int


@njit(cache=True)
def row_layout(seqs: np.ndarray, parents: np.ndarray, kv_len: int) -> RowLayout:  # pragma: no cover - compiled
    """Where each row of a pass (``Rows``' seqs, parents and kv_len) sits: a row sees its sequence's cache and, of the
    pass's new tokens, itself and its ancestors (a chain's: every earlier token), and takes its depth's position.
    Compiled: a pass's Python runs with the caches cold (the weights streamed through them), where the dozen NumPy
    calls this took cost ~165 us a pass (Qwen2.5-Coder-0.5B, Zen 4)."""
    seq_rows = np.zeros(seqs.shape[0] + 1, dtype=np.int64)
    for i in range(seqs.shape[0]):
        seq_rows[i + 1] = seq_rows[i] + seqs[i, 2]
    n_rows = seq_rows[-1]
    row_slot = np.empty(n_rows, dtype=np.int64)
    positions = np.empty(n_rows, dtype=np.int64)
    write_at = np.empty(n_rows, dtype=np.int64)
    mask = np.zeros((n_rows, kv_len), dtype=np.bool_)
    parent_rows = np.empty(n_rows, dtype=np.int64)
    for i in range(seqs.shape[0]):
        slot, start = seqs[i, 0], seqs[i, 1]
        for j in range(seqs[i, 2]):
            r = seq_rows[i] + j
            row_slot[r], write_at[r] = slot, start + j
            mask[r, :start] = True
            if parents.shape[0] == 0:  # a chain
                positions[r] = start + j
                mask[r, start:start + j + 1] = True
                parent_rows[r] = r - 1 if j > 0 else -1
            else:  # itself and its ancestors (parents[a] < a: the runner checked the tree)
                depth, a = -1, j
                while a >= 0:
                    mask[r, start + a] = True
                    a, depth = parents[seq_rows[i] + a], depth + 1
                positions[r] = start + depth
                parent_rows[r] = seq_rows[i] + parents[r] if parents[r] >= 0 else -1
    return RowLayout(row_slot, positions, write_at, seq_rows, mask, parent_rows)


class LayerWeights(NamedTuple):
    """Every layer's weights, stacked [num_layers, ...]: the matrices float (float32, or bfloat16
    bits) or ``quant.stack``'s arrays (read through ``layer_weight``); the rest float32.

    wqkv [(Hq + 2 Hkv) D, H], bqkv [(Hq + 2 Hkv) D], wo [H, Hq D], w_gate_up [2 I, H], w_down [H, I]
    per layer; norms [4, H] = (attn, mlp, post_attn, post_mlp); qk_norms [2, D] = (q, k).
    """

    wqkv: np.ndarray | tuple
    bqkv: np.ndarray
    wo: np.ndarray | tuple
    w_gate_up: np.ndarray | tuple
    w_down: np.ndarray | tuple
    norms: np.ndarray
    qk_norms: np.ndarray


class RopeTables(NamedTuple):
    """[max_len, D / 2] float32 rotation factors by position; the local ones for sliding layers."""

    cos: np.ndarray
    sin: np.ndarray
    cos_local: np.ndarray
    sin_local: np.ndarray


class Arch(NamedTuple):
    """The architecture's sizes and switches (the config flags ``decode_layers`` reads)."""

    sliding: np.ndarray  # [num_layers] bool: the layer attends within ``window`` keys
    window: int
    n_heads: int
    n_kv: int
    eps: float
    scale: float  # attention's q.k scale
    has_bias: bool  # bqkv is added
    qk_norm: bool  # q and k RMS-normed per head
    sandwich: bool  # post_attn / post_mlp norms
    gelu: bool  # gelu (tanh) gate, else silu


@njit(**_GLUE)  # serial glue: only the products and attention inside launch threads
def decode_layers(x, rows, weights, k_cache, v_cache, rope, arch, run_layer, hidden_at, hidden):  # pragma: no cover
    """Run the rows x [N, H] (``rows``: a ``RowLayout``) through every layer l with run_layer[l]
    in place, writing their K/V to the cache; a layer not run passes x through and writes no K/V
    (a layer-skipping draft).

    weights: ``LayerWeights``; k_cache[l], v_cache[l] [slots, Hkv, max_len, D]; rope: ``RopeTables``;
    arch: ``Arch``. hidden[hidden_at[l]] receives x after layer l where hidden_at[l] >= 0.
    """
    row_slot, row_pos, row_write, seq_rows, mask, _ = rows
    wqkv, bqkv, wo, w_gate_up, w_down, norms, qk_norms = weights
    cos, sin, cos_local, sin_local = rope
    sliding, window, n_heads, n_kv, eps, scale, has_bias, qk_norm, sandwich, gelu = arch
    n_rows, size = x.shape
    dim = cos.shape[1] * 2
    q_size, kv_size = n_heads * dim, n_kv * dim
    inter = stack_rows(w_gate_up) // 2
    h = np.empty((n_rows, size), dtype=np.float32)
    qkv = np.empty((n_rows, q_size + 2 * kv_size), dtype=np.float32)
    attn = np.empty((n_rows, n_heads, dim), dtype=np.float32)
    proj = np.empty((n_rows, size), dtype=np.float32)
    gate_up = np.empty((n_rows, 2 * inter), dtype=np.float32)
    act = np.empty((n_rows, inter), dtype=np.float32)
    for layer in range(norms.shape[0]):
        if not run_layer[layer]:
            if hidden_at[layer] >= 0:
                _copy_rows(hidden[hidden_at[layer]], x)
            continue
        rms_norm_rows(x, norms[layer, 0], eps, h)
        product(layer_weight(wqkv, layer), h, qkv)
        for r in range(n_rows):
            if has_bias:
                for i in range(qkv.shape[1]):
                    qkv[r, i] += bqkv[layer, i]
            local = sliding[layer]
            c = cos_local[row_pos[r]] if local else cos[row_pos[r]]
            s = sin_local[row_pos[r]] if local else sin[row_pos[r]]
            for head in range(n_heads + n_kv):
                v = qkv[r, head * dim:(head + 1) * dim]
                if qk_norm:
                    _rms_norm(v, qk_norms[layer, 0 if head < n_heads else 1], eps, v)
                _rope(v, c, s)
            slot, at = row_slot[r], row_write[r]
            for kvh in range(n_kv):
                k_off = q_size + kvh * dim
                _store(k_cache[layer, slot, kvh, at], qkv[r, k_off:k_off + dim])
                _store(v_cache[layer, slot, kvh, at], qkv[r, k_off + kv_size:k_off + kv_size + dim])
        q = qkv[:, :q_size].copy().reshape((n_rows, n_heads, dim))
        attention(q, k_cache[layer], v_cache[layer], row_slot, row_pos, seq_rows, mask,
                  window if sliding[layer] else 0, scale, attn)
        product(layer_weight(wo, layer), attn.reshape((n_rows, q_size)), proj)
        if sandwich:
            rms_norm_rows(proj, norms[layer, 2], eps, proj)
        _add_rows(x, proj)
        rms_norm_rows(x, norms[layer, 1], eps, h)
        gated_product(layer_weight(w_gate_up, layer), h, gelu, gate_up, act)
        product(layer_weight(w_down, layer), act, proj)
        if sandwich:
            rms_norm_rows(proj, norms[layer, 3], eps, proj)
        _add_rows(x, proj)
        if hidden_at[layer] >= 0:
            _copy_rows(hidden[hidden_at[layer]], x)


# -- a whole pass -------------------------------------------------------------------------------
def _embed(table, ids, scale, out):  # pragma: no cover - replaced by the overload below
    """out[i] = the embedding's row ids[i] as float32, times ``scale`` where it is not 0 (Gemma's sqrt(H));
    table: a quantized matrix's arrays (``quant.QuantArrays``), or float32 or bfloat16 bits [V, H]."""


@overload(_embed, inline="always")
def _embed_impl(table, ids, scale, out):
    if isinstance(table, types.BaseTuple):
        def embed(table, ids, scale, out):
            if ids.shape[0] and (ids.min() < 0 or ids.max() >= table[3].shape[0]):
                raise ValueError("a token id outside the model's vocabulary")
            dequantize_rows(table[0], table[1], table[2], table[3], table[4], out.shape[1], ids, out)
            _scale_rows(out, scale)
    else:
        def embed(table, ids, scale, out):
            if ids.shape[0] and (ids.min() < 0 or ids.max() >= table.shape[0]):
                raise ValueError("a token id outside the model's vocabulary")
            for r in range(ids.shape[0]):
                _widen(table[ids[r]], out[r])
            _scale_rows(out, scale)
    return embed


@njit(inline="always", **_GLUE)
def _scale_rows(x, scale):  # pragma: no cover - compiled
    """x *= scale, unless scale is 0 (no scale)."""
    if scale != 0:
        for r in range(x.shape[0]):
            for i in range(x.shape[1]):
                x[r, i] *= scale


def _head(head, x, best, logits, parent, token, softmax):  # pragma: no cover - replaced by the overload below
    """The LM head over the rows x [R, H]: each row's argmax into best [R] where best has rows (a quantized head
    keeps its spans' maxima only, and leaves out the rows greedy verification cannot reach: ``kernels.qmatmul_argmax``
    with each row's parent row and token, -1 for none), else the logits into logits [R, V], and where softmax's
    inv_t has rows, their 64-column blocks' maxima and sums (``kernels.softmax_blocks``; a quantized head's spans
    write them from L1)."""


@overload(_head, inline="always")
def _head_impl(head, x, best, logits, parent, token, softmax):
    if isinstance(head, types.BaseTuple):
        def quantized(head, x, best, logits, parent, token, softmax):
            if best.shape[0]:
                qmatmul_argmax(head[0], head[1], head[2], head[3], head[4], x, best, parent, token)
            elif softmax[0].shape[0]:
                qmatmul(head[0], head[1], head[2], head[3], head[4], x, logits, None, softmax)
            else:
                product(head, x, logits)
        return quantized

    def dense(head, x, best, logits, parent, token, softmax):
        if best.shape[0]:
            full = np.empty((x.shape[0], head.shape[0]), dtype=np.float32)
            matmul(head, x, full)
            argmax_rows(full, best)
        else:
            matmul(head, x, logits)
            if softmax[0].shape[0]:
                softmax_blocks(logits, softmax)
    return dense


@njit(**_GLUE)
def fused_pass(ids, seqs, parents, kv_len, model, k_cache, v_cache, run_layer, hidden_at, hidden, normed, head_rows,
               best, logits, path_only, softmax):  # pragma: no cover - compiled
    """A whole pass in one compiled call: the layout of the rows (``Rows``' fields; ``row_layout``), the embedding
    look-up, every layer (``decode_layers``), the final norm into normed [N, H] and the LM head over its rows
    ``head_rows`` (``_head``: argmaxes into best where it has rows, else logits, and their softmax blocks where
    ``softmax`` = (inv_t, top, sums) has rows; ``path_only``: head_rows every row, and only those greedy verification
    can reach need be right, the others -1). ``model``: the static arrays,
    ``fused.FusedDecoder.arrays``. One dispatch and no torch call where the pass took six dispatches and a dozen torch
    calls, each run with the caches cold after the weights streamed through them (a torch call 20-130 us there).
    Zen 4, 1-token argmax passes alternated in one process against the parent commit's steps replayed: SmolLM2-135M
    0.96-0.975, Qwen2.5-Coder-0.5B 0.978, the 1.5B 1.003 (within the spread)."""
    embed, embed_scale, eps, weights, rope, arch, final_norm, head = model
    layout = row_layout(seqs, parents, kv_len)
    x = np.empty(normed.shape, dtype=np.float32)
    _embed(embed, ids, embed_scale, x)
    decode_layers(x, layout, weights, k_cache, v_cache, rope, arch, run_layer, hidden_at, hidden)
    rms_norm_rows(x, final_norm, eps, normed)
    parent = layout.parent_rows if path_only else np.full(ids.shape[0], -1, dtype=np.int64)  # -1: every row's argmax
    _head(head, normed[head_rows], best, logits, parent, ids, softmax)


def plain(value):
    """``value`` with every NamedTuple in it a plain tuple: numba types a NamedTuple argument ~2.5x slower on every
    call (the arguments of ``fused_pass`` 107 against 43 us with the caches cold, 17.8 against 6.8 warm; SmolLM2-135M's
    1-token passes alternated in one process 0.992-0.993 of the time with NamedTuples; Zen 4)."""
    return tuple(plain(v) for v in value) if isinstance(value, tuple) else value
