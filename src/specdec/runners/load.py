"""Model id -> runner: the native decoder where the architecture is ours, else the generic one."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from specdec.errors import ModelLoadError
from specdec.model.backend import Backend, make_backend
from specdec.model.transformer import Transformer
from specdec.model.weights import gguf_file, load_state_dict, read_model_config, resolve_model
from specdec.runners.base import ModelRunner
from specdec.runners.generic import GenericRunner
from specdec.runners.native import NativeRunner

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
QUANTIZATIONS = ("none", "gguf")


def load_runner(
    model: str | None = None,
    dtype: str = "float32",
    device: str | None = None,
    max_seq_len: int = 4096,
    num_slots: int = 1,
    backend: str = "auto",
    quantization: str | None = None,
) -> tuple[ModelRunner, Path]:
    """Load ``model`` (see ``resolve_model``) into the native runner, or the generic one.

    backend: "auto", "cpu-kernels" or "torch" (see ``model.backend``).
    quantization: "gguf" keeps a GGUF file's blocks and runs them on the integer-dot kernels
    (the default for a GGUF file where the CPU kernels run); "none" dequantises them at load.
    ``dtype`` stays the compute and KV-cache type.
    """
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    if quantization not in (None, *QUANTIZATIONS):
        raise ModelLoadError(f"unknown quantization {quantization!r}; choose from {', '.join(QUANTIZATIONS)}")
    torch_dtype = DTYPES[dtype]
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    folder = resolve_model(model)
    config, _ = read_model_config(folder)
    if config is None:
        return GenericRunner(folder, torch_dtype, dev, max_seq_len, num_slots), folder
    max_seq_len = min(max_seq_len, config.max_position_embeddings)
    chosen = make_backend(backend, torch_dtype, dev)
    source = gguf_file(model)
    if _keep_blocks(quantization, source, chosen):
        from specdec.model.gguf_weights import load_gguf_weights

        state = load_gguf_weights(source, config)  # type: ignore[arg-type]
        state = {k: v.to(torch_dtype) if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    else:
        state = load_state_dict(folder, config, torch_dtype)
    net = Transformer(config, state, chosen, max_seq_len, dev)
    return NativeRunner(net, config, torch_dtype, dev, max_seq_len, num_slots), folder


def _keep_blocks(quantization: str | None, source: Path | None, backend: Backend) -> bool:
    """Whether to run the GGUF blocks as they are: asked for, or by default where they can."""
    if quantization == "none":
        return False
    if source is None:
        if quantization == "gguf":
            raise ModelLoadError("--quantization gguf needs a .gguf model file")
        return False
    why = None if backend.fused else f"the {backend.name} backend runs float weights only"
    if why is None:
        from specdec.model.clib import load_qkernels

        try:
            load_qkernels()
        except ModelLoadError as exc:
            why = str(exc)
    if why is None:
        return True
    if quantization == "gguf":
        raise ModelLoadError(f"--quantization gguf: {why}")
    print(f"specdec: notice: GGUF blocks dequantised to float ({why})", file=sys.stderr)
    return False
