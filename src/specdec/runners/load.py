"""Model id -> runner: the native decoder where the architecture is ours, else the generic one."""

from __future__ import annotations

from pathlib import Path

import torch

from specdec.errors import ModelLoadError
from specdec.model.backend import make_backend
from specdec.model.transformer import Transformer
from specdec.model.weights import load_state_dict, read_model_config, resolve_model
from specdec.runners.base import ModelRunner
from specdec.runners.generic import GenericRunner
from specdec.runners.native import NativeRunner

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_runner(
    model: str | None = None,
    dtype: str = "float32",
    device: str | None = None,
    max_seq_len: int = 4096,
    num_slots: int = 1,
    backend: str = "auto",
) -> tuple[ModelRunner, Path]:
    """Load ``model`` (see ``resolve_model``) into the native runner, or the generic one.

    backend: "auto", "cpu-kernels" or "torch" (see ``model.backend``).
    """
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    torch_dtype = DTYPES[dtype]
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    folder = resolve_model(model)
    config, _ = read_model_config(folder)
    if config is None:
        return GenericRunner(folder, torch_dtype, dev, max_seq_len, num_slots), folder
    max_seq_len = min(max_seq_len, config.max_position_embeddings)
    state = load_state_dict(folder, config, torch_dtype)
    net = Transformer(config, state, make_backend(backend, torch_dtype, dev), max_seq_len, dev)
    return NativeRunner(net, config, torch_dtype, dev, max_seq_len, num_slots), folder
