"""specdec: lossless speculative decoding engine.

``LLM``, ``Output`` and ``StreamEvent`` load on first use (PEP 562), so importing a
light submodule (the CLI's argument definitions, ``specdec.config``) does not pull in
torch, numba and transformers.
"""

import os

# Before any OpenMP runtime starts (numba's layer stack and torch both use one): a thread waiting at
# a barrier spins 30000 rounds, then sleeps. Measured on Qwen2.5-Coder-1.5B (docs/performance.md),
# a decode step idle / beside one busy process of the same priority: libgomp's default 42 / ~600 ms
# (and 845 ms a pass beside a niced test run), 30000 rounds 38 / 170-270 ms, sleeping at once
# (OMP_WAIT_POLICY=passive: the better choice on a shared machine) 55 / 62 ms. The user's own
# setting wins.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "30000"

from specdec.config import SamplingParams, SpecConfig, SpecType  # noqa: E402

__all__ = ["LLM", "Output", "SamplingParams", "SpecConfig", "SpecType", "StreamEvent"]
__version__ = "0.1.0"

_FROM_LLM = ("LLM", "Output", "StreamEvent")


def __getattr__(name: str):
    if name in _FROM_LLM:
        from specdec import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'specdec' has no attribute {name!r}")
