"""A GGUF file's tensors under our parameter names, the matrices kept quantized (``quant``).

The same names and layout as ``weights._convert`` produces from a Hugging Face
checkpoint: q/k rows in rope's interleaved-pair order (llama.cpp already stores
them so for its ``llama`` architecture; for the others it keeps Hugging Face's
halves, which we permute), fused q/k/v and gate/up rows, norms with Gemma's +1
(llama.cpp's converter stores it). Matrices of a type the kernels do not read are
dequantised here, with one notice line, and requantized nowhere: they stay float32.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, quants

from specdec.config import ModelConfig
from specdec.errors import ModelLoadError
from specdec.model.quant import SUPPORTED, QuantMatrix

Weight = torch.Tensor | QuantMatrix
_PERMUTED_ARCHS = ("llama",)  # llama.cpp's converter interleaves q/k rows itself for these


def load_gguf_weights(path: Path, config: ModelConfig) -> dict[str, Weight]:
    """Every weight of ``config``'s model from the GGUF at ``path``; matrices as QuantMatrix."""
    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # noqa: BLE001 - any parse failure is a bad file
        raise ModelLoadError(f"cannot read GGUF {path}: {type(exc).__name__}: {exc}") from None
    field = reader.fields.get("general.architecture")
    arch = bytes(field.parts[field.data[0]]).decode() if field else ""
    tensors = {t.name: t for t in reader.tensors}
    # the reader's parsed metadata (the tokenizer's 150K-entry arrays as small NumPy objects: ~0.5 GB
    # for a Qwen2.5 file) goes before the weights come in, so the two never add up in peak memory
    del reader, field
    gc.collect()
    dequantized: set[str] = set()

    def matrix(name: str) -> QuantMatrix | torch.Tensor:
        t = tensors.get(name)
        if t is None:
            raise ModelLoadError(f"tensor {name} missing from {path.name}")
        k, rows = int(t.shape[0]), int(t.shape[1])
        if t.tensor_type in SUPPORTED and k % 64 == 0:
            # read into private memory: views of the reader's memmap would keep the file's pages
            # resident beside the stacked copies (the model twice in RSS)
            data = np.fromfile(path, dtype=np.uint8, count=int(t.n_bytes), offset=int(t.data_offset)).reshape(rows, -1)
            return QuantMatrix.from_blocks(data, t.tensor_type, k)
        dequantized.add(t.tensor_type.name)
        return torch.from_numpy(np.ascontiguousarray(_dequantize(t).reshape(rows, k)))

    def vector(name: str) -> torch.Tensor:
        t = tensors.get(name)
        if t is None:
            raise ModelLoadError(f"tensor {name} missing from {path.name}")
        return torch.from_numpy(np.array(_dequantize(t), dtype=np.float32).reshape(-1))

    c = config
    permute = arch not in _PERMUTED_ARCHS
    out: dict[str, Weight] = {"embed": matrix("token_embd.weight"), "norm": vector("output_norm.weight")}
    if not c.tie_word_embeddings:
        out["lm_head"] = matrix("output.weight") if "output.weight" in tensors else out["embed"]
    for i in range(c.num_layers):
        p, o = f"blk.{i}.", f"layers.{i}."
        q, k = matrix(p + "attn_q.weight"), matrix(p + "attn_k.weight")
        if permute:
            q, k = _interleave(q, c.num_heads, c.head_dim), _interleave(k, c.num_kv_heads, c.head_dim)
        out[o + "wqkv"] = _concat([q, k, matrix(p + "attn_v.weight")])
        if c.attention_bias:
            qb, kb = vector(p + "attn_q.bias"), vector(p + "attn_k.bias")
            if permute:
                qb, kb = _interleave(qb, c.num_heads, c.head_dim), _interleave(kb, c.num_kv_heads, c.head_dim)
            out[o + "bqkv"] = torch.cat([qb, kb, vector(p + "attn_v.bias")])
        out[o + "wo"] = matrix(p + "attn_output.weight")
        out[o + "w_gate_up"] = _concat([matrix(p + "ffn_gate.weight"), matrix(p + "ffn_up.weight")])
        out[o + "w_down"] = matrix(p + "ffn_down.weight")
        out[o + "attn_norm"] = vector(p + "attn_norm.weight")
        if c.sandwich_norm:
            out[o + "post_attn_norm"] = vector(p + "post_attention_norm.weight")
            out[o + "mlp_norm"] = vector(p + "ffn_norm.weight")
            out[o + "post_mlp_norm"] = vector(p + "post_ffw_norm.weight")
        else:
            out[o + "mlp_norm"] = vector(p + "ffn_norm.weight")
        if c.qk_norm:
            out[o + "q_norm"] = _interleave(vector(p + "attn_q_norm.weight"), 1, c.head_dim)
            out[o + "k_norm"] = _interleave(vector(p + "attn_k_norm.weight"), 1, c.head_dim)
    if dequantized:
        print(f"specdec: notice: {path.name}: {', '.join(sorted(dequantized))} matrices have no integer kernel; "
              "dequantised to float32", file=sys.stderr)
    return out


def _dequantize(t) -> np.ndarray:
    data = np.asarray(t.data)
    if t.tensor_type in (T.F32, T.F16, T.BF16):
        return data.astype(np.float32) if t.tensor_type != T.BF16 else quants.dequantize(data, t.tensor_type)
    return quants.dequantize(data, t.tensor_type)


def _interleave(w: Weight, num_heads: int, head_dim: int) -> Weight:
    """Per head, rope dims from halves to pairs (as ``weights._interleave_rows``), on rows."""
    half = head_dim // 2
    per_head = np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)
    order = (np.arange(num_heads)[:, None] * head_dim + per_head[None, :]).reshape(-1)
    if isinstance(w, QuantMatrix):
        return w.permute_rows(order)
    return w[torch.from_numpy(order)]


def _concat(parts: list[Weight]) -> Weight:
    if all(isinstance(p, QuantMatrix) for p in parts):
        return QuantMatrix.concat(parts)  # type: ignore[arg-type]
    return torch.cat([p if isinstance(p, torch.Tensor) else torch.from_numpy(p.dense()) for p in parts])

