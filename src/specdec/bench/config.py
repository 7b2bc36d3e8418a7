"""What one benchmark run measures: methods, workloads, grid, peers and output folder."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from specdec.bench.workloads import Workload
from specdec.config import SpecConfig, SpecType, parse_spec_types

DEFAULT_METHODS = ("none", "ngram", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache", "suffix", "draft-self",
                   "adaptive")
HEAD_METHODS = ("eagle3", "suffix+eagle3")  # added by default with --spec-model (no head ships)
PEER_NAMES = ("transformers", "llama-cpp")
PASS_WIDTHS = (1, 2, 4, 8, 16, 32)  # `specdec bench passes` by default


@dataclass(frozen=True)
class Method:
    """A specdec drafting method: a row of the report. ``name`` is its --methods entry."""

    name: str
    spec: SpecConfig

    @property
    def is_plain(self) -> bool:
        return not self.spec.enabled


def parse_methods(text: str, base: SpecConfig) -> list[Method]:
    """'none,ngram,suffix+draft-model' -> Methods; '+' chains drafters (llama.cpp's comma list).

    'none' (plain decoding, the speedup baseline and reference) always comes first.
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError("--methods is empty")
    if len(set(names)) != len(names):
        raise ValueError(f"--methods lists a method twice: {text}")
    methods = []
    for name in ["none", *[n for n in names if n != "none"]]:
        types = parse_spec_types(name.replace("+", ","))
        if SpecType.DRAFT_MODEL in types and not base.draft_model:
            raise ValueError(f"method {name} needs --draft-model")
        methods.append(Method(name, base.with_types(types)))
    return methods


def methods_types(text: str) -> tuple[SpecType, ...]:
    """Every spec type the --methods list names (plain decoding alone when it names none): what the
    shared flags are checked against."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    types = dict.fromkeys(t for n in names for t in parse_spec_types(n.replace("+", ",")) if t is not SpecType.NONE)
    return tuple(types) or (SpecType.NONE,)


@dataclass
class BenchConfig:
    methods: list[Method]
    workloads: list[Workload]
    model: str | None = None
    dtype: str = "float32"
    kv_cache_dtype: str = "auto"  # see runners.load.KV_CACHE_DTYPES
    device: str | None = None
    backend: str | None = None  # see model.backend; None = $SPECDEC_BACKEND or auto
    quantization: str | None = None  # see runners.load; None = gguf for a GGUF file
    max_model_len: int = 4096
    batch_sizes: list[int] = field(default_factory=lambda: [1])
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    max_new_tokens: int = 128
    ignore_eos: bool = False  # every answer exactly max_new_tokens: equal lengths to time (vLLM's option)
    limit: int | None = None
    max_turns: int | None = None
    peers: list[str] = field(default_factory=lambda: ["transformers"])
    out: Path = Path("bench-out")
    quick: bool = False
    usd_per_hour: float = 1.0
    draft_model: str | None = None
    draft_n_max: int = 8
    seed: int = 0
    peer_threads: int | None = None  # None: torch's default thread count
    oracle: bool = True
    command: str = ""
    default_threads: int = 1  # torch's thread count before specdec loaded (set by the CLI)
