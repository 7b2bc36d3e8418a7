"""specdec: lossless speculative decoding engine.

``LLM``, ``Output`` and ``StreamEvent`` load on first use (PEP 562), so importing a
light submodule (the CLI's argument definitions, ``specdec.config``) does not pull in
torch, numba and transformers.
"""

import os

# Before any OpenMP runtime starts (numba's layer stack and torch both use one): a thread waiting at
# a barrier sleeps instead of spinning. Spinning waits turn one other busy process on a 2-core
# machine into 10-20x slower passes (Qwen2.5-Coder-1.5B, 1-token pass beside one busy core: 845 ms
# spinning, 62 ms sleeping; docs/performance.md); the user's own setting wins.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

from specdec.config import SamplingParams, SpecConfig, SpecType  # noqa: E402

__all__ = ["LLM", "Output", "SamplingParams", "SpecConfig", "SpecType", "StreamEvent"]
__version__ = "0.1.0"

_FROM_LLM = ("LLM", "Output", "StreamEvent")


def __getattr__(name: str):
    if name in _FROM_LLM:
        from specdec import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'specdec' has no attribute {name!r}")
