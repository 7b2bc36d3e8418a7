"""Model id -> runner: the native decoder where the architecture is ours, else the generic one."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from specdec.errors import ModelLoadError
from specdec.log import get_logger
from specdec.model.backend import Backend, make_backend
from specdec.model.quant import AT_LOAD, quantize_weights
from specdec.model.transformer import Transformer
from specdec.model.weights import gguf_file, load_state_dict, read_model_config, resolve_model
from specdec.runners.base import ModelRunner
from specdec.runners.generic import GenericRunner
from specdec.runners.native import NativeRunner

logger = get_logger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# The KV cache's element type (vLLM's --kv-cache-dtype, llama.cpp's --cache-type-k/-v). "auto" is
# float16 where the weights run as quantized blocks (a GGUF file, or --quantization q8_0 ...), as
# llama.cpp caches the same file, else the compute dtype (vLLM's auto). A 16-bit cache halves what a
# pass's attention reads; every pass, verify or decode, rounds a key or value the same way, so a
# verify row still equals decoding it alone.
KV_CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16")
QUANTIZATIONS = ("none", "gguf", *AT_LOAD)


def load_runner(
    model: str | None = None,
    dtype: str = "float32",
    device: str | None = None,
    max_seq_len: int = 4096,
    num_slots: int = 1,
    backend: str = "auto",
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
) -> tuple[ModelRunner, Path]:
    """Load ``model`` (see ``resolve_model``) into the native runner, or the generic one.

    backend: "auto", "cpu-kernels" or "torch" (see ``model.backend``).
    quantization: "gguf" keeps a GGUF file's blocks and runs them on the integer-dot kernels
    (the default for a GGUF file where the CPU kernels run); "none" dequantises them at load;
    "q8_0", "q4_0", "q4_1", "q5_0", "q5_1" quantize a float checkpoint's matrices at load into
    those GGUF blocks (llama.cpp's formats) for the same kernels. ``dtype`` stays the compute type.
    kv_cache_dtype: the KV cache's type (``KV_CACHE_DTYPES``; "auto": float16 for quantized blocks, else
    ``dtype``).
    """
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    if quantization not in (None, *QUANTIZATIONS):
        raise ModelLoadError(f"unknown quantization {quantization!r}; choose from {', '.join(QUANTIZATIONS)}")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ModelLoadError(f"unknown KV cache dtype {kv_cache_dtype!r}; choose from {', '.join(KV_CACHE_DTYPES)}")
    torch_dtype = DTYPES[dtype]
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    folder = resolve_model(model, weights=False)
    config, _ = read_model_config(folder)
    if config is None:
        if kv_cache_dtype != "auto":
            raise ModelLoadError(f"--kv-cache-dtype {kv_cache_dtype}: {model} runs on transformers' model code, "
                                 "whose cache keeps the compute dtype (choose auto)")
        return GenericRunner(resolve_model(model), torch_dtype, dev, max_seq_len, num_slots), folder
    max_seq_len = min(max_seq_len, config.max_position_embeddings)
    chosen = make_backend(backend, torch_dtype, dev)
    source = gguf_file(model)
    keep_blocks = quantization not in AT_LOAD and _keep_blocks(quantization, source, chosen)
    if not keep_blocks:
        folder = resolve_model(model)  # float weights: a GGUF's dequantised copy, written once
    if quantization in AT_LOAD:
        _check_kernels(quantization, chosen)
        state = quantize_weights(load_state_dict(folder, config, torch.float32), AT_LOAD[quantization])
        state = {k: v.to(torch_dtype) if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    elif keep_blocks:
        from specdec.model.gguf_weights import load_gguf_weights

        _fixed_mmap_threshold()

        state = load_gguf_weights(source, config)  # type: ignore[arg-type]
        state = {k: v.to(torch_dtype) if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    else:
        state = load_state_dict(folder, config, torch_dtype)
    net = Transformer(config, state, chosen, max_seq_len, dev)
    del state
    _return_freed_memory()
    blocks = keep_blocks or quantization in AT_LOAD
    kv_dtype = DTYPES[kv_cache_dtype] if kv_cache_dtype != "auto" else torch.float16 if blocks else torch_dtype
    return NativeRunner(net, config, torch_dtype, dev, max_seq_len, num_slots, kv_dtype=kv_dtype), folder


def _fixed_mmap_threshold() -> None:
    """Every allocation over 1 MiB gets its own mapping, handed back to the OS when freed. glibc's
    default threshold grows to the largest block freed (a layer's matrix, ~15 MB), after which the
    loader's per-layer copies land in the heap and its peak is the model twice, not once. The setting
    is the process's from then on (a pass's large scratch is mapped and returned the same way)."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc
        pass


def _return_freed_memory() -> None:
    """Hand the loader's freed scratch (per-layer copies before stacking) back to the OS: glibc keeps
    freed heap pages otherwise, ~80 MB of resident memory for the default model."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def _keep_blocks(quantization: str | None, source: Path | None, backend: Backend) -> bool:
    """Whether to run the GGUF blocks as they are: asked for, or by default where they can."""
    if quantization == "none":
        return False
    if source is None:
        if quantization == "gguf":
            raise ModelLoadError("--quantization gguf needs a .gguf model file")
        return False
    why = _why_no_kernels(backend)
    if why is None:
        return True
    if quantization == "gguf":
        raise ModelLoadError(f"--quantization gguf: {why}")
    logger.warning("specdec: notice: GGUF blocks dequantised to float (%s)", why)
    return False


def _check_kernels(quantization: str, backend: Backend) -> None:
    why = _why_no_kernels(backend)
    if why is not None:
        raise ModelLoadError(f"--quantization {quantization}: {why}")


def _why_no_kernels(backend: Backend) -> str | None:
    """Why quantized blocks cannot run here (None: they can)."""
    if not backend.fused:
        return f"the {backend.name} backend runs float weights only"
    from specdec.model.clib import load_qkernels

    try:
        load_qkernels()
    except ModelLoadError as exc:
        return str(exc)
    return None
