"""specdec: lossless speculative decoding engine.

``LLM``, ``Output`` and ``StreamEvent`` load on first use (PEP 562), so importing a
light submodule (the CLI's argument definitions, ``specdec.config``) does not pull in
torch, numba and transformers.
"""

import os

# Before any OpenMP runtime starts (numba's layer stack and torch both use one): a thread waiting at
# a barrier spins 3000 rounds, then sleeps. libgomp's default (300000) turns one other busy process
# on a 2-core machine into 10-20x slower passes; sleeping at once costs ~25% on an idle machine
# (Qwen2.5-Coder-1.5B 1-token pass, idle / beside a busy core: default 41 / 845 ms, passive 44 /
# 62 ms, 3000 rounds 35 / 39-90 ms; docs/performance.md). The user's own setting wins.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "3000"

from specdec.config import SamplingParams, SpecConfig, SpecType  # noqa: E402

__all__ = ["LLM", "Output", "SamplingParams", "SpecConfig", "SpecType", "StreamEvent"]
__version__ = "0.1.0"

_FROM_LLM = ("LLM", "Output", "StreamEvent")


def __getattr__(name: str):
    if name in _FROM_LLM:
        from specdec import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'specdec' has no attribute {name!r}")
