"""The benchmark harness: it owns prompts, warm-up, timing, the greedy check and the records.

Each specdec method supplies only a SpecConfig; each peer only a ``generate``.
Flow of one ``run_bench``:

1. reference: specdec plain greedy decoding at batch size 1 over every workload.
   Its answers build later turns' prompts, so every method and peer gets the
   same token ids; its outputs are what greedy runs must reproduce exactly.
2. specdec methods over workloads x batch sizes x temperatures, plain decoding
   among them, in lockstep by batch of requests (``run_interleaved``). Greedy
   outputs are compared with the reference, full lists, exactly: a mismatch
   stops the run (GreedyMismatchError).
3. peers at batch size 1 on the same token ids; their mismatches are counted.
4. oracle: every drafter replays the reference outputs (see ``bench.oracle``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tqdm import tqdm

from specdec.bench import metrics, oracle
from specdec.bench.config import BenchConfig, Method
from specdec.bench.passes import measure as measure_passes
from specdec.bench.peers import make_peers, run_peer_cell
from specdec.bench.records import GREEDY, BenchResult, Cell, Request, peak_rss_bytes
from specdec.bench.workloads import Conversation, Workload
from specdec.config import SamplingParams, SpecType
from specdec.drafters.registry import DraftResources
from specdec.engine import StaticBatch
from specdec.llm import LLM
from specdec.stats import SpecStats


class GreedyMismatchError(RuntimeError):
    """A greedy speculative output differs from plain decoding: losslessness is broken."""


def greedy_check_input(method: str, workload: str, outputs: list[list[int]]) -> list[list[int]]:
    """What the greedy check compares with the reference: the outputs as produced.

    A seam for tests, which swap it to inject a mismatch without breaking the verifier.
    """
    return outputs


def check_greedy(cell: Cell, reference: list[list[int]]) -> None:
    """Every greedy output must equal plain decoding's, token for token (whole lists, no zip)."""
    outputs = greedy_check_input(cell.method, cell.workload, cell.output_ids)
    if len(outputs) != len(reference):
        raise GreedyMismatchError(
            f"{cell.method} on {cell.workload} (batch {cell.batch_size}): {len(outputs)} outputs "
            f"for {len(reference)} requests"
        )
    bad = [i for i, (got, want) in enumerate(zip(outputs, reference, strict=True)) if got != want]
    cell.mismatches = len(bad)
    if bad:
        i = bad[0]
        got, want = outputs[i], reference[i]
        at = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
        raise GreedyMismatchError(
            f"LOSSLESSNESS BROKEN: greedy output of {cell.method!r} differs from plain decoding on "
            f"workload {cell.workload!r} (batch size {cell.batch_size}) in {len(bad)} of {len(reference)} "
            f"requests; request {i}: first difference at token {at} "
            f"(got {got[at:at + 5]}, plain {want[at:at + 5]}; lengths {len(got)} vs {len(want)})"
        )


# -- specdec ------------------------------------------------------------------------------------


# a prompt every look-up drafter finds matches in, so the warm-up drafts and verifies
WARMUP_PROMPT = "Repeat after me: one two three four, one two three four, one two three four, one two three four."


class MethodRunner:
    """One loaded target model; switches drafting method with ``LLM.set_spec``, keeping each method's resources."""

    def __init__(self, cfg: BenchConfig) -> None:
        self.cfg = cfg
        self.llm = LLM(cfg.model, dtype=cfg.dtype, kv_cache_dtype=cfg.kv_cache_dtype,
                       max_model_len=cfg.max_model_len, device=cfg.device,
                       max_num_seqs=max(*cfg.batch_sizes, len(cfg.methods)),  # batch 1: every method at once
                       backend=cfg.backend,
                       quantization=cfg.quantization)
        self._resources: dict[str, DraftResources] = {}

    def use(self, method: Method, forget: bool = True) -> DraftResources:
        """Make ``method`` current, with no prompt cached (methods run the same prompts in turn: a later one
        must not find an earlier one's prompt in the KV cache); ``forget``: with an empty suffix cache too (a
        cell starts cold, and keeps what it learned across its own batches)."""
        res = self.llm.set_spec(method.spec, self._resources.get(method.name))
        self._resources[method.name] = res
        self.llm.forget_prefixes()
        if forget:
            res.forget()
        return res

    def warm_up(self) -> None:
        """Every method's first calls before anything is timed: its drafter's compiled code and first verify
        passes, greedy and sampled, and every cache slot's first pass; then ``LLM.settle``, as ``LLM.warmup`` ends
        (which this covers: plain decoding is among the methods).
        Without it the first workload paid them: `--quick` on the default model read 0.55-0.63x plain on
        MT-bench for seven methods of nine, whose slots were new (prefill 0.34-0.38 s against plain's 0.135)."""
        # every cache slot once: a slot's first pass faults its pages in (SmolLM2-135M: ~300 ms against ~55 ms
        # warm), and in lockstep each method of a round holds its own slot
        self.llm.generate([WARMUP_PROMPT] * self.llm.runner.num_slots, SamplingParams(max_new_tokens=2))
        for method in self.cfg.methods:
            self.use(method)
            for temperature in (GREEDY, 1.0):
                self.llm.generate(WARMUP_PROMPT, SamplingParams(max_new_tokens=8, temperature=temperature, seed=0))
        self.llm.settle()  # the frozen heap: a full collection's 0.3-0.4 s pause would land in one method's cell

    def resources(self, method: Method) -> DraftResources:
        """``method``'s draft resources, as its last ``use`` left them."""
        return self._resources[method.name]

    def request(self, w: Workload, conv: Conversation, turn: int, answers: list[str], index: int,
                notes: list[str]) -> Request | None:
        """The request for one turn, or None (with a note) when it cannot fit in the context."""
        ids = self.llm.chat_prompt(conv.messages(turn, answers))
        room = self.llm.runner.max_seq_len - self.cfg.max_new_tokens - self.cfg.draft_n_max - 2
        if len(ids) > room:
            notes.append(f"{w.name} {conv.id} turn {turn + 1}: prompt of {len(ids)} tokens does not fit "
                         f"with {self.cfg.max_new_tokens} new tokens in a {self.llm.runner.max_seq_len}-token "
                         "context; skipped (with its later turns)")
            return None
        return Request(w.name, conv.id, turn, tuple(ids), self.cfg.seed + index)

    def params(self, request: Request, temperature: float) -> SamplingParams:
        return request.params(temperature, self.cfg.max_new_tokens, self.cfg.ignore_eos)

    def kv_bytes(self, batch_size: int) -> int | None:
        """The KV cache a batch of ``batch_size`` holds (the cache has a slot for every method's sequence)."""
        return self.llm.runner.kv_bytes() * batch_size // self.llm.runner.num_slots or None


def build_requests(runner: MethodRunner, w: Workload, notes: list[str], first_seed: int,
                   tick: Callable[[int], None]) -> tuple[list[Request], list[list[int]] | None]:
    """The workload's requests, and plain greedy outputs when they are needed.

    Later turns' prompts hold the plain greedy answers to earlier turns, so a
    multi-turn workload (and any greedy one, for the greedy check) gets a
    reference run; a single-turn workload with its own temperature does not.
    """
    need_reference = needs_reference(w)
    llm = runner.llm
    runner.use(runner.cfg.methods[0])
    requests: list[Request] = []
    outputs: list[list[int]] = []
    for conv in w.conversations:
        answers: list[str] = []
        for turn in range(len(conv.turns)):
            req = runner.request(w, conv, turn, answers, first_seed + len(requests), notes)
            if req is None:  # too long for the context: the conversation ends here
                break
            requests.append(req)
            if need_reference:
                out = llm.generate([list(req.prompt_ids)], runner.params(req, GREEDY))[0]
                outputs.append(out.token_ids)
                answers.append(llm.tokenizer.decode(out.token_ids, skip_special_tokens=True).strip())
                tick(1)
    return requests, (outputs if need_reference else None)


def needs_reference(w: Workload) -> bool:
    return w.temperature in (None, GREEDY) or any(len(c.turns) > 1 for c in w.conversations)


def settings(cfg: BenchConfig, w: Workload) -> list[tuple[float, int]]:
    """(temperature, batch size) pairs for ``w``; a workload with its own temperature runs only at that one."""
    temps = cfg.temperatures if w.temperature is None else [w.temperature]
    return [(t, b) for t in temps for b in cfg.batch_sizes]


class MethodTurn:
    """One method's batch of a lockstep round (``run_interleaved``): the batch and the wall time of its own steps."""

    def __init__(self, name: str, batch: StaticBatch) -> None:
        self.name, self.batch, self.seconds = name, batch, 0.0

    def timed(self, work: Callable[[], None]) -> None:
        t0 = time.perf_counter()
        work()
        self.seconds += time.perf_counter() - t0

    def stats(self) -> SpecStats:
        return SpecStats.of_batch([s.stats for s in self.batch.seqs], self.seconds, self.batch.pass_seconds)


def run_interleaved(runner: MethodRunner, methods: list[Method], requests: list[Request], temperature: float,
                    batch_size: int, bar: tqdm, workload: str) -> dict[str, tuple[list[list[int]], SpecStats]]:
    """Every method's (outputs, stats) on ``requests``: each batch of them runs under every method in
    lockstep, one step of each method's batch in turn (prefills too), each method timed over its own
    steps, the order rotating by batch, so the machine's drift meets every method alike. Where the
    cache has too few slots for every method's batch at once, as many methods as fit step together and
    the rest follow. (Run a whole cell after another, plain's 1-token pass moved 37-55 ms between the
    workloads of one run on a 2-core VM; run request by request in turn, the memory's speed still
    flipped under one method's requests: a group of 4 MT-bench requests read 0.74x for suffix, which
    drafted 100 tokens in 968 passes, its 1-token passes 38.8 ms against plain's 27.7.)"""
    done: dict[str, tuple[list[list[int]], SpecStats]] = {m.name: ([], SpecStats()) for m in methods}
    together = max(1, runner.llm.runner.num_slots // batch_size)
    bar.set_description(f"{workload} B{batch_size} T{temperature:g}")
    for i, start in enumerate(range(0, len(requests), batch_size)):
        chunk = requests[start:start + batch_size]
        order = methods[i % len(methods):] + methods[: i % len(methods)]
        for first in range(0, len(order), together):
            turns = []
            try:
                for method in order[first:first + together]:
                    runner.use(method, forget=i == 0)
                    seqs = [runner.llm.new_sequence(list(r.prompt_ids), runner.params(r, temperature)) for r in chunk]
                    turns.append(MethodTurn(method.name, StaticBatch(runner.llm.engine, seqs)))
                for turn in turns:
                    turn.timed(turn.batch.start)
                while any(turn.batch.running for turn in turns):
                    for turn in turns:
                        if turn.batch.running:
                            turn.timed(turn.batch.step)
            finally:
                for turn in turns:
                    turn.batch.close()
            for turn in turns:
                done[turn.name][0].extend(list(s.output_ids) for s in turn.batch.seqs)
                done[turn.name][1].merge(turn.stats())
                bar.update(len(chunk))
    return done


def run_workload(runner: MethodRunner, result: BenchResult, w: Workload, peers: list, bar: tqdm) -> None:
    """Reference, then every method (interleaved by batch: ``run_interleaved``) and peer on ``w``."""
    cfg = result.config
    bar.set_description(f"reference {w.name}")
    first_seed = cfg.seed + sum(len(v) for v in result.requests.values())
    requests, ref_outputs = build_requests(runner, w, result.notes, first_seed, bar.update)
    dropped = w.num_requests - len(requests)  # too long for the context
    if dropped:
        bar.total -= dropped * (num_cells(cfg, w, len(peers)) + needs_reference(w))
        bar.refresh()
    if not requests:
        result.notes.append(f"workload {w.name}: no request fits in the context; skipped")
        return
    result.requests[w.name] = requests
    if ref_outputs is not None:
        result.reference[w.name] = ref_outputs
    for temperature, batch_size in settings(cfg, w):
        # (plain greedy at batch 1 runs again beside the others: the reference run times nothing alike)
        runs = run_interleaved(runner, list(cfg.methods), requests, temperature, batch_size, bar, w.name)
        for method in cfg.methods:
            res = runner.resources(method)
            outputs, stats = runs[method.name]
            cell = Cell(method.name, "specdec", w.name, batch_size, temperature, outputs, stats,
                        kv_bytes=runner.kv_bytes(batch_size), drafter_bytes=metrics.drafter_bytes(res),
                        peak_rss_bytes=peak_rss_bytes())
            result.cells.append(cell)
            if temperature == GREEDY:
                check_greedy(cell, ref_outputs)
        for peer in peers if batch_size == 1 else []:
            bar.set_description(f"{peer.name} {w.name} T{temperature:g}")
            result.cells.append(run_peer_cell(peer, result, w.name, temperature, bar))


def num_cells(cfg: BenchConfig, w: Workload, num_peers: int) -> int:
    pairs = settings(cfg, w)
    return len(pairs) * len(cfg.methods) + sum(b == 1 for _, b in pairs) * num_peers


# -- oracle -------------------------------------------------------------------------------------


def measure_pass_costs(runner: MethodRunner, context_ids: list[int], max_width: int, reps: int = 7) -> list[float]:
    """Seconds of a target pass over T = 1..max_width tokens after ``context_ids``.

    The minimum of ``reps`` runs: on a shared machine, interference only ever adds time.
    """
    widths = list(range(1, max_width + 1))
    times = measure_passes(runner.llm.runner, context_ids, widths, reps)
    return [min(times[w]) for w in widths]


def run_oracle(runner: MethodRunner, result: BenchResult) -> None:
    cfg = result.config
    # The oracle picks among single methods; adaptive is what it is measured against. draft-layerskip
    # drafts on the target's own cache slot, which a replay without the engine does not have.
    offline = lambda m: not {SpecType.ADAPTIVE, SpecType.DRAFT_LAYERSKIP} & set(m.spec.types)  # noqa: E731
    drafting = [m for m in cfg.methods if not m.is_plain and offline(m)]
    greedy = [w for w in cfg.workloads if w.name in result.reference and w.temperature is None]
    if not drafting or not greedy:
        return
    pairs = [(r.prompt_ids, out) for w in greedy
             for r, out in zip(result.requests[w.name], result.reference[w.name], strict=True)]
    lengths = sorted(len(p) + len(o) // 2 for p, o in pairs)
    context_len = min(lengths[len(lengths) // 2], cfg.max_model_len - cfg.draft_n_max - 4)
    context = [t for p, _ in pairs for t in p][:context_len]
    result.pass_cost_context = len(context)
    result.pass_costs = measure_pass_costs(runner, context, cfg.draft_n_max + 1)
    with tqdm(total=len(pairs), desc="oracle replay", unit="req", dynamic_ncols=True) as bar:
        for w in greedy:
            makers = {}
            for m in drafting:
                res = runner.use(m)  # fresh suffix cache per workload, as in the timed runs
                makers[m.name] = res.new_drafter
            reqs = [(r.prompt_ids, out) for r, out in zip(result.requests[w.name], result.reference[w.name],
                                                           strict=True)]
            logs = oracle.replay_all(makers, reqs, cfg.max_new_tokens, cfg.draft_n_max,
                                     progress=lambda: bar.update(1))
            result.oracle[w.name] = oracle.analyse(logs, [len(o) for _, o in reqs], result.pass_costs)


# -- the whole run ------------------------------------------------------------------------------


def run_bench(cfg: BenchConfig) -> BenchResult:
    result = BenchResult(cfg)
    runner = MethodRunner(cfg)
    result.folder = str(runner.llm.folder)
    result.weights = runner.llm.runner.weights_label
    result.kv_cache = runner.llm.runner.kv_cache_label
    runner.warm_up()
    peers = make_peers(result, runner.llm)
    # Progress counts requests: the reference run, then each cell (the plain greedy batch-1
    # cell is the reference run itself).
    total = sum(w.num_requests * (num_cells(cfg, w, len(peers)) + needs_reference(w)) for w in cfg.workloads)
    with tqdm(total=total, desc="bench", unit="req", dynamic_ncols=True) as bar:
        for w in cfg.workloads:
            run_workload(runner, result, w, peers, bar)
    if cfg.oracle:
        run_oracle(runner, result)
    return result
