"""What the harness and the peers both write: requests, cells, the run's result.

Its own module so ``harness`` (which runs the peers) and ``peers`` (which fill
cells for the harness) both import it, and not each other both ways.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass, field

from specdec.bench.config import BenchConfig
from specdec.bench.oracle import OracleResult
from specdec.config import SamplingParams
from specdec.stats import SpecStats

GREEDY = 0.0


@dataclass(frozen=True)
class Request:
    workload: str
    conv_id: str
    turn: int
    prompt_ids: tuple[int, ...]
    seed: int

    def params(self, temperature: float, max_new_tokens: int, ignore_eos: bool) -> SamplingParams:
        """The sampling settings every method and peer runs this request with (greedy: no seed)."""
        seed = None if temperature == GREEDY else self.seed
        return SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, ignore_eos=ignore_eos)


@dataclass
class Cell:
    """One method or peer on one workload at one batch size and temperature."""

    method: str
    kind: str  # "specdec" or "peer"
    workload: str
    batch_size: int
    temperature: float
    output_ids: list[list[int]]
    stats: SpecStats  # summed over requests; seconds is generation wall time
    kv_bytes: int | None = None
    drafter_bytes: int | None = None
    peak_rss_bytes: int = 0
    mismatches: int | None = None  # greedy outputs that differ from the reference; None when sampled


@dataclass
class BenchResult:
    config: BenchConfig
    cells: list[Cell] = field(default_factory=list)
    requests: dict[str, list[Request]] = field(default_factory=dict)
    reference: dict[str, list[list[int]]] = field(default_factory=dict)
    oracle: dict[str, OracleResult] = field(default_factory=dict)
    pass_costs: list[float] = field(default_factory=list)
    pass_cost_context: int = 0
    notes: list[str] = field(default_factory=list)
    folder: str = ""  # the model folder specdec loaded
    weights: str = ""  # the weights' format (runner.weights_label)
    kv_cache: str = ""  # the KV cache's element type


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
