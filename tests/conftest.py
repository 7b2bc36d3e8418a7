"""Shared fixtures: the real default model, and tiny random models built on the spot.

Tiny models reuse the default model's real tokenizer (SmolLM2's, 49152 tokens),
so every test talks to a real tokenizer; only the weights are random.
"""

from __future__ import annotations

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One worker per core (make test): a worker's kernels and torch ops take one thread each, or
    # two workers' two-thread kernels spin-wait for each other's cores (3x the CPU time measured).
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import gc
import shutil
from pathlib import Path

import pytest
import torch

from specdec.model.weights import resolve_model


@pytest.fixture(autouse=True)
def _unfrozen_heap():
    """Each test leaves the collector as it found it: ``LLM.warmup`` freezes the heap (``freeze_heap``),
    which in a long test process would keep every later-dropped model's cycles."""
    yield
    if gc.get_freeze_count():
        gc.unfreeze()


TINY_CONFIGS = {
    "llama": dict(model_type="llama", rope_theta=10000.0),
    "llama3": dict(
        model_type="llama",
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    ),
    "mistral": dict(model_type="mistral", sliding_window=16),  # every layer slides
    "qwen2": dict(model_type="qwen2"),
    "qwen3": dict(model_type="qwen3"),
    "gemma3": dict(model_type="gemma3_text", sliding_window=8, layer_types=None, query_pre_attn_scalar=16),
}


@pytest.fixture(scope="session")
def default_model_folder() -> Path:
    # A machine without the default model's package (the GPU machine of scripts/gpu_check.sh) names a
    # folder holding its config and tokenizer: enough for the tiny models, which reuse its tokenizer.
    folder = os.environ.get("SPECDEC_TEST_TOKENIZER")
    return Path(folder) if folder else resolve_model(None)


def build_tiny_model(
    folder: Path, arch: str, tokenizer_folder: Path, seed: int = 0, logit_scale: float = 1.0,
    num_layers: int = 2, bigram: bool = False,
) -> Path:
    """Save a random ``arch`` model with the real tokenizer under ``folder``.

    bigram=True zeroes the attention outputs, so the next-token distribution depends
    on the last token only: greedy chains of it are predictable, which lets tests
    build prompts whose look-up drafts the model often accepts.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    extra = dict(TINY_CONFIGS[arch])
    model_type = extra.pop("model_type")
    config = AutoConfig.for_model(
        model_type,
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        tie_word_embeddings=arch in ("llama", "gemma3"),
        bos_token_id=1,
        eos_token_id=2,
        **extra,
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0 if arch == "gemma3" else 1.0, 0.1)
            else:
                p.normal_(0.0, 0.2)
        if bigram:
            for name, p in model.named_parameters():
                if "o_proj" in name:
                    p.zero_()
        head = model.get_output_embeddings()
        if logit_scale != 1.0 and not config.tie_word_embeddings:
            head.weight.mul_(logit_scale)
    model.save_pretrained(folder, safe_serialization=True)
    for f in tokenizer_folder.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")) or f.name == "chat_template.jinja":
            shutil.copy(f, folder / f.name)
    return folder


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory, default_model_folder):
    cache: dict[tuple, Path] = {}

    def make(
        arch: str = "llama", seed: int = 0, logit_scale: float = 1.0, num_layers: int = 2, bigram: bool = False
    ) -> Path:
        key = (arch, seed, logit_scale, num_layers, bigram)
        if key not in cache:
            folder = tmp_path_factory.mktemp(f"tiny-{arch}-{seed}")
            cache[key] = build_tiny_model(folder, arch, default_model_folder, seed, logit_scale, num_layers, bigram)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_factory) -> Path:
    return tiny_model_factory("llama")
