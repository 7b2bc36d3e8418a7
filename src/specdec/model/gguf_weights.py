"""A GGUF file's tensors under our parameter names, the matrices kept quantized (``quant``).

The same names and layout as ``weights._convert`` produces from a Hugging Face
checkpoint, from the same table (``weight_names``): q/k rows in rope's interleaved-pair order (llama.cpp already stores
them so for its ``llama`` architecture; for the others it keeps Hugging Face's
halves, which we permute), fused q/k/v and gate/up rows, norms with Gemma's +1
(llama.cpp's converter stores it). Matrices of a type the kernels do not read are
dequantised here, with one notice line, and requantized nowhere: they stay float32.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants

from specdec.config import ModelConfig
from specdec.errors import ModelLoadError
from specdec.log import get_logger
from specdec.model.gguf_header import TensorInfo, read_header, tensor_data
from specdec.model.quant import SUPPORTED, QuantMatrix
from specdec.model.weight_names import gate_up_order, layer_weights, rope_heads

logger = get_logger(__name__)

Weight = torch.Tensor | QuantMatrix
_PERMUTED_ARCHS = ("llama",)  # llama.cpp's converter interleaves q/k rows itself for these


def load_gguf_weights(path: Path, config: ModelConfig) -> dict[str, Weight]:
    """Every weight of ``config``'s model from the GGUF at ``path``; matrices as QuantMatrix."""
    header = read_header(path)
    arch, tensors = str(header.metadata.get("general.architecture", "")), header.tensors
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
        return torch.from_numpy(np.ascontiguousarray(_dequantize(path, t).reshape(rows, k)))

    def vector(name: str) -> torch.Tensor:
        t = tensors.get(name)
        if t is None:
            raise ModelLoadError(f"tensor {name} missing from {path.name}")
        return torch.from_numpy(np.array(_dequantize(path, t), dtype=np.float32).reshape(-1))

    c = config
    permute = arch not in _PERMUTED_ARCHS
    out: dict[str, Weight] = {"embed": matrix("token_embd.weight"), "norm": vector("output_norm.weight")}
    if not c.tie_word_embeddings:
        out["lm_head"] = matrix("output.weight") if "output.weight" in tensors else out["embed"]

    def layer(i: int) -> dict[str, Weight]:
        p, o, got = f"blk.{i}.", f"layers.{i}.", {}
        for w in layer_weights(c):
            parts = [vector(p + name) if w.vector else matrix(p + name) for name in w.gguf]
            # q/k rows: llama.cpp already interleaved them for PERMUTED_ARCHS; a per-head norm never
            parts = [_interleave(t, *rope_heads(c, w.rope_of(j))) if w.rope_of(j) == "head"
                     or (w.rope_of(j) and permute) else t for j, t in enumerate(parts)]
            if len(parts) == 1:
                got[o + w.name] = parts[0]
            else:
                got[o + w.name] = torch.cat(parts) if w.vector else _concat(parts)
            if w.alternate:
                got[o + w.name] = _reorder(got[o + w.name], gate_up_order(parts[0].shape[0]))
        return got

    with ThreadPoolExecutor(min(4, os.cpu_count() or 1)) as pool:  # the reads and NumPy's copies release the GIL
        for got in pool.map(layer, range(c.num_layers)):
            out.update(got)
    if dequantized:
        logger.warning("specdec: notice: %s: %s matrices have no integer kernel; dequantised to float32",
                       path.name, ", ".join(sorted(dequantized)))
    return out


def _dequantize(path: Path, t: TensorInfo) -> np.ndarray:
    data = tensor_data(path, t)
    if t.tensor_type in (T.F32, T.F16, T.BF16):
        return data.astype(np.float32) if t.tensor_type != T.BF16 else quants.dequantize(data, t.tensor_type)
    return quants.dequantize(data, t.tensor_type)


def _interleave(w: Weight, num_heads: int, head_dim: int) -> Weight:
    """Per head, rope dims from halves to pairs (as ``weights._interleave_rows``), on rows."""
    half = head_dim // 2
    per_head = np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)
    order = (np.arange(num_heads)[:, None] * head_dim + per_head[None, :]).reshape(-1)
    return _reorder(w, order)


def _reorder(w: Weight, order: np.ndarray) -> Weight:
    """Rows order[0], order[1], ... of w."""
    if isinstance(w, QuantMatrix):
        return w.permute_rows(order)
    return w[torch.from_numpy(order)]


def _concat(parts: list[Weight]) -> Weight:
    if all(isinstance(p, QuantMatrix) for p in parts):
        return QuantMatrix.concat(parts)  # type: ignore[arg-type]
    return torch.cat([p if isinstance(p, torch.Tensor) else torch.from_numpy(p.dense()) for p in parts])



def read_float_tensors(path: Path, prefix: Callable[[dict[str, object]], str]) -> dict[str, torch.Tensor]:
    """Every tensor whose name starts with ``prefix(metadata)`` (the file's metadata values, the
    tokenizer's left out; it may raise ModelLoadError), dequantised to float32 in row-major [rows, k]
    shape: for the small modules read beside a model. Only those tensors are read."""
    header = read_header(path)
    start = prefix({key: v for key, v in header.metadata.items() if not key.startswith("tokenizer.")})
    out = {}
    for t in header.tensors.values():
        if t.name.startswith(start):
            shape = tuple(int(n) for n in reversed(t.shape))  # ggml lists the fastest dimension first
            out[t.name] = torch.from_numpy(np.array(_dequantize(path, t), dtype=np.float32).reshape(shape))
    return out
