"""specdec: lossless speculative decoding engine."""

from specdec.config import SamplingParams, SpecConfig, SpecType
from specdec.llm import LLM, Output, StreamEvent

__all__ = ["LLM", "Output", "SamplingParams", "SpecConfig", "SpecType", "StreamEvent"]
__version__ = "0.1.0"
