"""A GGUF file's tensor table and scalar metadata, read without building its metadata arrays.

gguf's ``GGUFReader`` makes a NumPy view of every element of every metadata array on opening a file: 6.5 s for
Qwen2.5-Coder-1.5B's header (151,936 tokens and 151,387 merges), 2.2 s for SmolLM2-135M's, on every load of the model
(Zen 4). The weights need none of those arrays (the tokenizer is converted once, into the model's folder), so this
reads the same header keeping scalars and strings, stepping over arrays by their lengths, and the tensors' places.
The format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (little-endian files, versions 2 and 3).
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import NamedTuple

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGMLQuantizationType,
    GGUFValueType,
    quant_shape_to_byte_shape,
)

from specdec.errors import ModelLoadError

_SCALARS = {  # struct format of each fixed-size value type (little-endian)
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
_ELEMENTS = {  # NumPy dtype of a tensor stored element by element; the other types' data are bytes
    GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16, GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8, GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


class TensorInfo(NamedTuple):
    """One tensor of a GGUF file. shape: ggml's order (the fastest-varying dimension first), as gguf's reader."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    data_offset: int  # from the start of the file


class Header(NamedTuple):
    """metadata: each key's scalar or string value (arrays left out); tensors: by name, in the file's order."""

    metadata: dict[str, int | float | bool | str]
    tensors: dict[str, TensorInfo]


def read_header(path: Path) -> Header:
    """The header of the GGUF at ``path``; ModelLoadError (naming the file) when it is not a readable GGUF."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _Parser(buf).header()
    except (OSError, ValueError, KeyError, struct.error, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"cannot read GGUF {path}: {type(exc).__name__}: {exc}") from None


def tensor_data(path: Path, t: TensorInfo) -> np.ndarray:
    """A read-only view of ``t``'s data in the file, shaped as gguf's reader gives it (NumPy's row-major order:
    elements for float and integer types, each row's bytes for block-quantized ones)."""
    shape = tuple(reversed(t.shape))
    dtype = _ELEMENTS.get(t.tensor_type)
    if dtype is None:
        dtype, shape = np.uint8, quant_shape_to_byte_shape(shape, t.tensor_type)
    count = t.n_bytes // np.dtype(dtype).itemsize
    return np.memmap(path, dtype=dtype, mode="r", offset=t.data_offset, shape=(count,)).reshape(shape)


class _Parser:
    """Reads the header front to back from the file's mapped bytes (a 1.5B model's header is ~7 MB, mostly arrays:
    303,000 strings of the 0.5B's tokenizer stepped over by their lengths, where a read and a decode each took 1.0 s
    of its load under a profiler)."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos, self.size = buf, 0, len(buf)

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        self.skip(size)
        return struct.unpack_from(fmt, self.buf, self.pos - size)[0]

    def string(self) -> str:
        n = self.take("<Q")
        self.skip(n)
        return self.buf[self.pos - n : self.pos].decode("utf-8")

    def skip(self, n: int) -> None:
        if n > self.size - self.pos:  # (a corrupt length: never step past what the file holds)
            raise ValueError("the file ends inside its header")
        self.pos += n

    def skip_strings(self, count: int) -> None:
        buf, pos, length = self.buf, self.pos, struct.Struct("<Q").unpack_from
        for _ in range(count):
            if pos + 8 > self.size:
                raise ValueError("the file ends inside its header")
            pos += 8 + length(buf, pos)[0]
        self.pos = pos
        self.skip(0)  # (the last length may have stepped past the file's end)

    def value(self, kind: GGUFValueType) -> int | float | bool | str | None:
        """A value of type ``kind``; an array is stepped over (None)."""
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind != GGUFValueType.ARRAY:
            raise ValueError(f"unknown metadata value type {kind}")
        item, count = GGUFValueType(self.take("<I")), self.take("<Q")
        if item in _SCALARS:
            self.skip(count * struct.calcsize(_SCALARS[item]))
        elif item == GGUFValueType.STRING:
            self.skip_strings(count)
        else:
            for _ in range(count):
                self.value(item)
        return None

    def header(self) -> Header:
        if self.take("<I") != GGUF_MAGIC:
            raise ValueError("not a GGUF file (its magic number is wrong)")
        version = self.take("<I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (big-endian or unknown): versions 2 and 3 are read")
        n_tensors, n_keys = self.take("<Q"), self.take("<Q")
        metadata = {}
        for _ in range(n_keys):
            key = self.string()
            value = self.value(GGUFValueType(self.take("<I")))
            if value is not None:
                metadata[key] = value
        infos = []
        for _ in range(n_tensors):
            name = self.string()
            shape = tuple(self.take("<Q") for _ in range(self.take("<I")))
            infos.append((name, GGMLQuantizationType(self.take("<I")), shape, self.take("<Q")))
        alignment = int(metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT))
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"general.alignment {alignment} is not a power of two")
        start = -(-self.pos // alignment) * alignment
        tensors: dict[str, TensorInfo] = {}
        for name, kind, shape, offset in infos:
            if name in tensors:
                raise ValueError(f"tensor {name} appears twice")
            block, size = GGML_QUANT_SIZES[kind]
            n = int(np.prod(shape, dtype=np.int64))
            tensors[name] = TensorInfo(name, kind, shape, n, n * size // block, start + offset)
        return Header(metadata, tensors)
