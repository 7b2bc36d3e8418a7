"""specdec: lossless speculative decoding engine.

``LLM``, ``Output`` and ``StreamEvent`` load on first use (PEP 562), so importing a
light submodule (the CLI's argument definitions, ``specdec.config``) does not pull in
torch, numba and transformers.
"""

from specdec.config import SamplingParams, SpecConfig, SpecType

__all__ = ["LLM", "Output", "SamplingParams", "SpecConfig", "SpecType", "StreamEvent"]
__version__ = "0.1.0"

_FROM_LLM = ("LLM", "Output", "StreamEvent")


def __getattr__(name: str):
    if name in _FROM_LLM:
        from specdec import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'specdec' has no attribute {name!r}")
