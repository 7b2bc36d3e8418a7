"""`specdec advise`: measure a few prompts of a workload, then say which method to run and why.

The questions come in the order practitioners ask them, but each is answered by a
measurement on this machine, with this target, on these prompts:

1. target and hardware: what a verify pass of T tokens costs against a 1-token pass
   (``bench.passes``); where wide passes are dear, only high acceptance pays;
2. workload (code and agentic text repeats its context, chat less, creative
   writing hardly): every candidate drafter runs the prompts through the engine
   (``bench.harness``), giving its acceptance rate (kept / drafted) and tokens per pass τ;
3. temperature: the runs sample at it (acceptance falls as it rises);
4. batch size: the runs use static batches of that size, and the pass cost is
   read at that many rows (a batched pass pads every row to the widest draft);
5. a draft model or an EAGLE head: measured as candidates when one is given or
   ships for the target; the draft model with its LM head cut to the N most frequent
   tokens (FR-Spec) when ``--spec-draft-vocab-size N`` is given;
6. a retrieval datastore (``--spec-datastore``, say of the target's own answers:
   ``specdec datastore answers``): retrieval is measured alone, and ``adaptive`` asks it
   as a member, as it asks the draft model.

The advice is the candidate with the best measured speedup over plain decoding
among those whose measured speedup and whose speedup expected from τ, the draft
length, the drafting time and the pass costs both reach ``MIN_SPEEDUP``;
otherwise plain decoding.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from tqdm import tqdm

from specdec.bench.config import BenchConfig, Method
from specdec.bench.harness import MethodRunner, build_requests, check_greedy, run_interleaved
from specdec.bench.metrics import acceptance_by_pos
from specdec.bench.passes import measure as measure_passes
from specdec.bench.records import GREEDY, Cell, Request
from specdec.bench.workloads import SPEC_BENCH_GROUPS, Workload
from specdec.pass_cost import PassCost
from specdec.stats import SpecStats

# The methods advise compares, by --spec-type name ('+' chains). A new drafter, or a controller
# that picks drafters per step, joins the comparison with one line here.
CANDIDATES: tuple[str, ...] = (
    "ngram",
    "ngram-map-k",
    "ngram-map-k4v",
    "suffix",
    "ngram-mod",
    "ngram-cache",
    "draft-self",
    "draft-layerskip",
    "adaptive",
)
DRAFT_MODEL_METHOD = "draft-model"  # measured when --draft-model is given (FR-Spec's cut head with a vocab size)
RETRIEVAL_METHOD = "retrieval"  # measured when --spec-datastore is given
HEAD_METHOD = "eagle3"  # measured when an EAGLE-3 head fits the target
MIN_SPEEDUP = 1.05  # a smaller measured gain is within run-to-run noise: plain decoding is advised
PASS_ROUNDS = 5


@dataclass(frozen=True)
class AdviseConfig:
    workload: Workload
    temperature: float
    batch_size: int = 1
    max_new_tokens: int = 64
    draft_n_max: int = 8
    model: str | None = None
    dtype: str = "float32"
    kv_cache_dtype: str = "auto"
    device: str | None = None
    backend: str | None = None
    quantization: str | None = None
    max_model_len: int = 4096
    draft_model: str | None = None
    spec_model: str | None = None  # an EAGLE-3 head: eagle3 is measured (none ships)
    draft_vocab_size: int | None = None  # FR-Spec: the draft model drafts from its N most frequent tokens
    datastore: str | None = None  # a retrieval datastore: retrieval is measured, adaptive asks it
    seed: int = 0


@dataclass
class MethodMeasure:
    """One method on the workload: what it drafted and kept, and what that bought."""

    name: str
    acceptance_rate: float  # drafted tokens kept / drafted (not alpha: kept / tested)
    tau: float  # tokens committed per target pass, per sequence
    drafted_per_pass: float  # mean draft length over every pass (0 when it did not draft)
    new_tokens: int
    seconds: float
    tokens_per_s: float
    measured_speedup: float  # tokens/s against plain decoding's, same prompts and settings
    expected_speedup: float  # from tau, the draft length, drafting time and the measured pass costs
    best_draft_len: int  # the draft length that maximises expected speed (0: drafting does not pay)
    acceptance_by_pos: list[float] = field(default_factory=list)


@dataclass
class Advice:
    model: str
    device: str
    workload: str
    workload_kind: str
    temperature: float
    batch_size: int
    requests: int
    max_new_tokens: int
    pass_ms: dict[int, float]  # tokens in one pass -> milliseconds (median over rounds)
    methods: list[MethodMeasure]  # "none" first
    recommended: str
    settings: dict[str, object]
    command: str
    reasons: list[str]

    def to_dict(self) -> dict:
        return asdict(self)


def workload_kind(name: str) -> str:
    """The practitioners' label for a workload; the advice never depends on it, only the text does."""
    if name in ("code_edit", "agentic"):
        return "code/agentic"
    if name == "creative":
        return "creative"
    if name == "mt_bench" or name in SPEC_BENCH_GROUPS:
        return "chat"
    return "your workload"


def candidate_names(cfg: AdviseConfig) -> list[str]:
    return [*CANDIDATES, *([RETRIEVAL_METHOD] if cfg.datastore else []),
            *([DRAFT_MODEL_METHOD] if cfg.draft_model else []), *([HEAD_METHOD] if cfg.spec_model else [])]


def method_settings(cfg: AdviseConfig, name: str) -> dict[str, object]:
    """What serving method ``name`` as measured needs besides its type: the draft model (and its cut
    head, ranked by the datastore when one is given), the head, the datastore. ``adaptive`` was
    measured with every one of them as a member, so it needs them all."""
    types = set(name.split("+"))
    adaptive = "adaptive" in types
    settings: dict[str, object] = {}
    if cfg.draft_model and (adaptive or DRAFT_MODEL_METHOD in types):
        settings["draft_model"] = cfg.draft_model
        if cfg.draft_vocab_size is not None:
            settings["draft_vocab_size"] = cfg.draft_vocab_size
    if cfg.spec_model and (adaptive or HEAD_METHOD in types):
        settings["spec_model"] = cfg.spec_model
    if cfg.datastore and (adaptive or RETRIEVAL_METHOD in types or "draft_vocab_size" in settings):
        settings["datastore"] = cfg.datastore
    return settings


def pass_widths(batch_size: int, draft_n_max: int) -> list[int]:
    """Tokens per pass to time: plain and full drafts at batch 1 and at ``batch_size``, and powers of two."""
    widest = batch_size * (draft_n_max + 1)
    wanted = {1, 2, draft_n_max + 1, batch_size, 2 * batch_size, widest}
    wanted |= {2**i for i in range(widest.bit_length())}
    return sorted(w for w in wanted if 1 <= w <= widest)


def expected_speedup(costs: PassCost, batch: int, tau: float, drafted: float, draft_seconds: float) -> float:
    """Plain decoding's seconds per token over speculation's, for a batch of ``batch`` sequences.

    Per step, speculation commits ``batch * tau`` tokens in a pass over ``batch * (1 + drafted)``
    tokens plus ``draft_seconds`` of drafting; plain decoding commits ``batch`` in a pass over
    ``batch``. Example: tau 2.0, 3 drafted, pass(4) = 1.3 pass(1), no drafting time -> 2 / 1.3 = 1.54x.
    """
    if tau <= 0:
        return 0.0
    plain = costs.estimate(batch)
    spec = costs.estimate(round(batch * (1 + drafted)))
    return tau * plain / (spec + draft_seconds)


def best_draft_len(costs: PassCost, batch: int, by_pos: list[float], draft_seconds: float, k_max: int) -> int:
    """Draft length k in 0..k_max with the best expected tokens per second.

    ``by_pos[i]``: the share of drafts reaching position i whose token i was kept, so a draft of
    k tokens commits 1 + sum(by_pos[:k]) tokens per pass on average.
    """
    best_k, best = 0, 1.0 / costs.estimate(batch)
    for k in range(1, k_max + 1):
        rate = (1 + sum(by_pos[:k])) / (costs.estimate(batch * (k + 1)) + draft_seconds)
        if rate > best:
            best_k, best = k, rate
    return best_k


def measure_method(name: str, stats: SpecStats, plain: SpecStats, costs: PassCost, cfg: AdviseConfig) -> MethodMeasure:
    passes = stats.decode_passes or 1
    steps = passes / cfg.batch_size  # batched passes: every sequence counts each one
    drafted = stats.drafted / passes
    draft_per_step = stats.draft_seconds / steps if steps else 0.0
    by_pos = acceptance_by_pos(stats.accepted_per_pos, stats.drafted_per_pos)
    tps = stats.new_tokens / stats.seconds if stats.seconds > 0 else 0.0
    plain_tps = plain.new_tokens / plain.seconds if plain.seconds > 0 else 0.0
    return MethodMeasure(
        name=name, acceptance_rate=stats.acceptance_rate, tau=stats.mean_accepted_len, drafted_per_pass=drafted,
        new_tokens=stats.new_tokens, seconds=stats.seconds, tokens_per_s=tps,
        measured_speedup=tps / plain_tps if plain_tps else 0.0,
        expected_speedup=expected_speedup(costs, cfg.batch_size, stats.mean_accepted_len, drafted, draft_per_step),
        best_draft_len=best_draft_len(costs, cfg.batch_size, by_pos, draft_per_step, cfg.draft_n_max)
        if name != "none" else 0,
        acceptance_by_pos=by_pos,
    )


def first_requests(workload: Workload, num_requests: int, max_turns: int = 2) -> Workload:
    """Conversations spread over the workload, at most ``max_turns`` turns each, until they hold
    ``num_requests`` requests (or the workload ends)."""
    for limit in range(1, len(workload.conversations) + 1):
        cut = workload.limited(limit, max_turns)
        if cut.num_requests >= num_requests:
            return cut
    return workload.limited(None, max_turns)


def bench_config(cfg: AdviseConfig, methods: list[Method]) -> BenchConfig:
    return BenchConfig(
        methods=methods, workloads=[cfg.workload], model=cfg.model, dtype=cfg.dtype,
        kv_cache_dtype=cfg.kv_cache_dtype, device=cfg.device, backend=cfg.backend, quantization=cfg.quantization,
        max_model_len=cfg.max_model_len,
        batch_sizes=[cfg.batch_size], temperatures=[cfg.temperature], max_new_tokens=cfg.max_new_tokens,
        peers=[], draft_model=cfg.draft_model, draft_n_max=cfg.draft_n_max, seed=cfg.seed, oracle=False,
        command="specdec advise",
    )


def fill_batch(requests: list[Request], reference: list[list[int]] | None, batch: int):
    """Repeat requests until one batch is full: a batch of ``batch`` needs that many sequences."""
    if len(requests) >= batch:
        return requests, reference
    reps = -(-batch // len(requests))
    return (requests * reps)[:batch], None if reference is None else (reference * reps)[:batch]


def measure_pass_costs(runner: MethodRunner, context: list[int], widths: list[int]) -> dict[int, float]:
    """Median seconds of a pass over each width after ``context`` (cut so the widest pass fits)."""
    room = runner.llm.runner.max_seq_len - max(widths) - 1
    times = measure_passes(runner.llm.runner, context[:room], widths, PASS_ROUNDS)
    return {w: statistics.median(ts) for w, ts in times.items()}


def run_advise(cfg: AdviseConfig, methods: list[Method], log: Callable[[str], None]) -> Advice:
    """Measure ``methods`` ("none" first) on the workload's prompts; the advice with its numbers."""
    bench = bench_config(cfg, methods)
    runner = MethodRunner(bench)
    runner.warm_up()  # every draft model and head loads first: a misfit fails before the long part
    notes: list[str] = []
    log(f"reference run over {cfg.workload.num_requests} requests of {cfg.workload.name}")
    requests, reference = build_requests(runner, cfg.workload, notes, cfg.seed, lambda n: None)
    if not requests:
        raise ValueError(f"no prompt of workload {cfg.workload.name} fits in --max-model-len "
                         f"{cfg.max_model_len} with {cfg.max_new_tokens} new tokens")
    requests, reference = fill_batch(requests, reference, cfg.batch_size)
    widths = pass_widths(cfg.batch_size, cfg.draft_n_max)
    log(f"pass cost at widths {widths}")
    seconds = measure_pass_costs(runner, list(requests[0].prompt_ids), widths)
    costs = PassCost()
    for w, s in seconds.items():
        costs.observe(w, s)
    # plain decoding too (the reference run above was the warm-up of every shape), every method in lockstep
    log(f"{', '.join(m.name for m in methods)} in lockstep: {len(requests)} requests, batch {cfg.batch_size}, "
        f"temperature {cfg.temperature:g}")
    runs = run_interleaved(runner, methods, requests, cfg.temperature, cfg.batch_size, tqdm(disable=True),
                           cfg.workload.name)
    stats: dict[str, SpecStats] = {}
    for m in methods:
        outputs, stats[m.name] = runs[m.name]
        if cfg.temperature == GREEDY:  # a speculative output that differs from plain decoding stops here
            check_greedy(Cell(m.name, "specdec", cfg.workload.name, cfg.batch_size, cfg.temperature, outputs,
                              stats[m.name]), reference)
    plain = stats[methods[0].name]
    measures = [measure_method(m.name, stats[m.name], plain, costs, cfg) for m in methods]
    advice = decide(cfg, costs, measures, notes)
    advice.model, advice.device = runner.llm.model_name, str(runner.llm.runner.device)
    advice.requests, advice.pass_ms = len(requests), {w: s * 1e3 for w, s in seconds.items()}
    return advice


def decide(cfg: AdviseConfig, costs: PassCost, measures: list[MethodMeasure], notes: list[str]) -> Advice:
    """The advice from the measures ("none" first); model, device, requests and pass_ms are left for the caller."""
    plain, drafting = measures[0], measures[1:]
    # Both must clear the bar: the wall clock catches costs the model misses (prefill, Python per
    # step), the model catches a wall clock skewed by other load on the machine.
    paying = [m for m in drafting if min(m.measured_speedup, m.expected_speedup) >= MIN_SPEEDUP]
    best = max(paying or drafting, key=lambda m: m.measured_speedup)
    chosen = best if paying else plain
    settings: dict[str, object] = {"spec_type": chosen.name}
    if chosen is not plain and cfg.batch_size > 1:
        # The server's batch budget K(b) = tokens // b: give this batch the draft length that pays.
        settings["spec_batch_draft_tokens"] = cfg.batch_size * max(chosen.best_draft_len, 1)
    if chosen is not plain:
        settings.update(method_settings(cfg, chosen.name))
    reasons = explain(cfg, costs, plain, drafting, best, chosen) + notes
    return Advice(
        model=cfg.model or "", device=cfg.device or "", workload=cfg.workload.name,
        workload_kind=workload_kind(cfg.workload.name), temperature=cfg.temperature, batch_size=cfg.batch_size,
        requests=0, max_new_tokens=cfg.max_new_tokens, pass_ms={}, methods=measures,
        recommended=chosen.name, settings=settings, command=serve_command(cfg, settings), reasons=reasons,
    )


def explain(cfg: AdviseConfig, costs: PassCost, plain: MethodMeasure, drafting: list[MethodMeasure],
            best: MethodMeasure, chosen: MethodMeasure) -> list[str]:
    """One line per question of the decision order, each with the numbers that answered it."""
    b, k = cfg.batch_size, cfg.draft_n_max
    wide = costs.estimate(b * (k + 1)) / costs.estimate(b)
    top_accepted = max(drafting, key=lambda m: m.acceptance_rate)
    lines = [
        f"target and hardware: a pass over {b * (k + 1)} tokens ({b} sequence(s) x {k} drafted + 1) costs "
        f"{wide:.2f}x one over {b}; a full draft pays only if it commits more than {wide:.2f} tokens per pass",
        f"workload ({workload_kind(cfg.workload.name)}, {cfg.workload.name}): highest acceptance "
        f"{top_accepted.name} (acceptance rate {top_accepted.acceptance_rate:.2f}, tau {top_accepted.tau:.2f}); "
        f"most tokens per pass "
        f"{max(drafting, key=lambda m: m.tau).name} (tau {max(m.tau for m in drafting):.2f})",
        f"temperature {cfg.temperature:g}: " + ("greedy, every output checked identical to plain decoding"
                                                if cfg.temperature == GREEDY else
                                                "sampled; acceptance above is measured at this temperature"),
        f"batch size {b}: " + (f"each step drafts for {b} sequences in one padded pass; plain decoding ran "
                               f"{plain.tokens_per_s:.1f} tok/s over the batch" if b > 1 else
                               f"one sequence at a time; plain decoding ran {plain.tokens_per_s:.1f} tok/s"),
        "draft model / head / datastore: " + ", ".join(
            [(f"{DRAFT_MODEL_METHOD} measured" + (f" from its {cfg.draft_vocab_size:,} most frequent tokens (FR-Spec)"
                                                  if cfg.draft_vocab_size else "")) if cfg.draft_model
             else "no --draft-model given",
             f"{HEAD_METHOD} measured" if cfg.spec_model else "no EAGLE-3 head for this target (--spec-model)",
             f"{RETRIEVAL_METHOD} measured" if cfg.datastore else "no --spec-datastore given"]
            + (["adaptive asks each as a member"] if cfg.draft_model or cfg.spec_model or cfg.datastore else [])),
    ]
    if chosen is plain:
        lines.append(f"decision: plain decoding; no drafter both measured and was expected to reach "
                     f"{MIN_SPEEDUP:.2f}x (the fastest, {best.name}: measured {best.measured_speedup:.2f}x, "
                     f"expected {best.expected_speedup:.2f}x)")
    else:
        lines.append(f"decision: {chosen.name}, measured {chosen.measured_speedup:.2f}x plain decoding (expected "
                     f"{chosen.expected_speedup:.2f}x from tau {chosen.tau:.2f}, {chosen.drafted_per_pass:.1f} drafted "
                     f"per pass and the pass costs); by its acceptance per position, drafts of "
                     f"{chosen.best_draft_len} tokens pay best")
    off = [m for m in drafting if m.expected_speedup > 0 and
           abs(m.measured_speedup / m.expected_speedup - 1) > 0.25]
    if off:
        lines.append("note: measured and expected speedups differ by over 25% for " + ", ".join(m.name for m in off)
                     + " (other load on the machine, prefill or per-step overheads); rerun on a quiet machine "
                       "or with more --prompts")
    return lines


def serve_command(cfg: AdviseConfig, settings: dict[str, object]) -> str:
    parts = ["specdec serve"]
    if cfg.model:
        parts.append(f"--model {cfg.model}")
    if settings["spec_type"] != "none":
        parts.append(f"--spec-type {settings['spec_type']}")
    flags = {"spec_batch_draft_tokens": "--spec-batch-draft-tokens", "draft_model": "--draft-model",
             "draft_vocab_size": "--spec-draft-vocab-size", "spec_model": "--spec-model",
             "datastore": "--spec-datastore"}
    parts += [f"{flag} {settings[key]}" for key, flag in flags.items() if key in settings]
    if cfg.batch_size > 1:
        parts.append(f"--max-batch-size {cfg.batch_size}")
    return " ".join(parts)
