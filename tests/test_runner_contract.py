"""What the runner contract carries for heads and training: the target's config, final norm and LM head.

Callers once reached around the contract for these (``getattr(runner, "config", None)``,
``runner.model.norm``, ``runner.model.quantized``); they are now part of ``ModelRunner``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from specdec.config import ModelConfig
from specdec.runners.base import ModelRunner
from specdec.runners.load import load_runner

SRC = Path(__file__).parent.parent / "src" / "specdec"


def test_native_runner_carries_config_norm_and_quantized_head():
    runner, _ = load_runner(None, max_seq_len=64)
    assert isinstance(runner.config, ModelConfig)
    norm = runner.final_norm()
    assert norm.shape == (runner.config.hidden_size,)
    assert torch.equal(norm, runner.model.norm)
    # the default GGUF keeps its LM head as blocks on the CPU kernels: the shared-head MTP path drafts on them
    assert runner.quantized_lm_head() is runner.model.quantized.get("lm_head")
    rows = runner.output_rows(torch.tensor([0, 5]))
    assert rows.shape == (2, runner.config.hidden_size)


def test_the_base_contract_answers_none_where_the_model_is_foreign():
    assert ModelRunner.config is None
    assert ModelRunner.final_norm(None) is None
    assert ModelRunner.quantized_lm_head(None) is None


def test_checkpoint_readers_know_files_not_runners():
    """model/*_checkpoint.py read files; loading onto a runner is drafters/heads.py's (no upward import)."""
    for name in ("mtp_checkpoint.py", "eagle_checkpoint.py"):
        tree = ast.parse((SRC / "model" / name).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not {m for m in imported if m.startswith(("specdec.runners", "specdec.drafters"))}, name
