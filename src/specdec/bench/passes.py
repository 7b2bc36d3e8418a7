"""`specdec bench passes`: what a target pass costs by width, against the machine's weight-read floor.

Speculation pays when verifying T tokens costs little more than decoding one.
This measures, on the machine at hand, the milliseconds of one pass over
T = 1, 2, 4, 8, 16, 32 new tokens of one sequence after a context of N tokens,
and the floor under a 1-token pass: the time to stream as many bytes as the
weights occupy, on every core. The floor and the widths run interleaved in
rounds, so a burst of load from elsewhere skews every width, and the floor, alike
instead of one; ratios are taken round by round, and a run whose memory changed
speed (the floor jumped) gets a table for each speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from numba import get_num_threads, njit, prange

from specdec.bench import llama_bench, llama_cpp
from specdec.bench.machine import machine_info
from specdec.bench.records import peak_rss_bytes
from specdec.cli.args import model_options
from specdec.errors import ModelLoadError, UsageError
from specdec.llm import LLM
from specdec.model import clib
from specdec.model.weights import gguf_file
from specdec.runners.base import ModelRunner, SeqInput


@njit(parallel=True, cache=True, fastmath=True)
def _stream_sum(buf: np.ndarray) -> float:  # pragma: no cover - compiled
    total = np.float32(0.0)
    for i in prange(buf.shape[0]):
        total += buf[i]
    return total


K = TypeVar("K", bound=Hashable)
FLOOR_STREAMS = (1, 4)  # streams a core reads its share as: one, or four in turn as the 1-2 row products do


@dataclass(frozen=True)
class FloorReader:
    """A call that reads the weights' bytes once on every core (or the GPU), and how: ``streams`` a core."""

    read: Callable[[], object]
    streams: int

    def __call__(self) -> object:
        return self.read()


def floor_reader(num_bytes: int, device: torch.device) -> FloorReader:
    """The floor under a pass: ``num_bytes`` read once, on every core (or the GPU). On a CPU each core
    reads its share as one stream or as several in turn (``kernels.read_bytes``), whichever is faster
    here (alternated, median): on Zen 2 one stream a core left memory idle that the products' four
    streams use, and a floor slower than the products' own reading would flatter them."""
    if device.type == "cuda":
        buf = torch.ones(num_bytes // 4, device=device)
        return FloorReader(lambda: buf.sum().item(), 1)
    try:
        clib.load_qkernels()
    except ModelLoadError:  # no C compiler: numba's one stream a core
        floats = np.ones(num_bytes // 4, dtype=np.float32)
        return FloorReader(lambda: _stream_sum(floats), 1)
    from specdec.model import kernels

    host = np.ones(num_bytes, dtype=np.uint8)
    seconds = alternated({n: (lambda n=n: kernels.read_bytes(host, n)) for n in FLOOR_STREAMS}, rounds=3)
    streams = min(seconds, key=seconds.get)
    return FloorReader(lambda: kernels.read_bytes(host, streams), streams)


def alternated(calls: Mapping[K, Callable[[], object]], rounds: int) -> dict[K, float]:
    """Median seconds of each call over ``rounds`` rounds, the calls alternated within every round (the machine's
    drift meets them alike) in an order rotated round by round (no call always follows the same one: what a call
    leaves in the caches or the memory's state then meets every other alike), after one untimed round (the first
    calls compile and fault pages in)."""
    times: dict[K, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for r in range(rounds + 1):
        for name in names[r % len(names):] + names[: r % len(names)]:
            call = calls[name]
            t0 = time.perf_counter()
            call()
            if r:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def synthetic_context(runner: ModelRunner, length: int) -> list[int]:
    return [(97 + 13 * i) % runner.vocab_size for i in range(length)]


def probe_tokens(runner: ModelRunner, width: int) -> list[int]:
    """The new tokens of a timed pass (any fixed ids: a pass's cost does not depend on them)."""
    return [(1000 + 7 * i) % runner.vocab_size for i in range(width)]


def measure(
    runner: ModelRunner, context_ids: list[int], widths: list[int], rounds: int,
    read_floor: Callable[[], object] | None = None,
) -> dict[int, list[float]]:
    """Seconds of a pass over each width after ``context_ids`` in one sequence, every round.

    Widths run interleaved, round after round. With ``read_floor``, key 0 holds its read, timed
    in the same rounds (it moves with the machine too).
    """
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    slot = runner.allocate()
    context = len(context_ids)
    try:
        runner.run([SeqInput(slot, context_ids, all_logits=False)])
        probe = probe_tokens(runner, max(widths))
        for w in widths:  # warm-up: first calls compile and allocate
            runner.run([SeqInput(slot, probe[:w])])
            runner.truncate(slot, context)
        times: dict[int, list[float]] = {w: [] for w in widths}
        if read_floor is not None:
            read_floor()
            times[0] = []
        for r in range(rounds):
            if read_floor is not None:
                t0 = time.perf_counter()
                read_floor()
                times[0].append(time.perf_counter() - t0)
            for w in widths[r % len(widths):] + widths[: r % len(widths)]:  # rotated, as ``alternated``
                sync()
                t0 = time.perf_counter()
                runner.run([SeqInput(slot, probe[:w])])
                sync()
                times[w].append(time.perf_counter() - t0)
                runner.truncate(slot, context)
        return times
    finally:
        runner.free(slot)


# a jump of this ratio between two read floors of one run, each side at least _PHASE_ROUNDS rounds, splits the run:
# the Zen 4 VM's memory switched between two speeds within minutes (floors of 17.5 and 29.5 ms for the 1.5B)
_PHASE_JUMP = 1.25
_PHASE_ROUNDS = 3


def memory_phases(floor_times: list[float]) -> list[list[int]]:
    """The rounds split where the read floor jumps (faster rounds first), or [every round] when it held still."""
    order = sorted(range(len(floor_times)), key=floor_times.__getitem__)
    jumps = [floor_times[order[i]] / floor_times[order[i - 1]] for i in range(1, len(order))]
    if jumps:
        at = max(range(len(jumps)), key=jumps.__getitem__) + 1
        if jumps[at - 1] >= _PHASE_JUMP and _PHASE_ROUNDS <= at <= len(order) - _PHASE_ROUNDS:
            return [sorted(order[:at]), sorted(order[at:])]
    return [list(range(len(floor_times)))]


def pass_table(times: dict[int, list[float]], floor_times: list[float], rounds: list[int]) -> dict:
    """The passes of the given rounds: each width's median milliseconds, and its ratios to the 1-token pass and to
    the read floor taken round by round (a pass against the floor and the narrowest pass timed beside it), then
    the median: a memory that changes speed between rounds moves a ratio's two sides alike."""
    one = min(times)

    def median(values) -> float:
        return statistics.median(list(values))

    return {
        "rounds": len(rounds),
        "read_floor_ms": median(floor_times[r] * 1e3 for r in rounds),
        "pass_ms": {w: median(ts[r] * 1e3 for r in rounds) for w, ts in times.items()},
        "vs_one_token": {w: median(ts[r] / times[one][r] for r in rounds) for w, ts in times.items()},
        "vs_floor": {w: median(ts[r] / floor_times[r] for r in rounds) for w, ts in times.items()},
    }


def measure_prefill(runner: ModelRunner, tokens: int, rounds: int) -> float:
    """Median seconds of a ``tokens``-token prompt into an empty cache, logits for its last token only
    (after one warm-up run)."""
    prompt = synthetic_context(runner, tokens)
    seconds = []
    for _ in range(rounds + 1):
        slot = runner.allocate()
        try:
            t0 = time.perf_counter()
            runner.run([SeqInput(slot, prompt, all_logits=False)])
            if runner.device.type == "cuda":
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - t0)
        finally:
            runner.free(slot)
    return statistics.median(seconds[1:])


def cmd_passes(args: argparse.Namespace) -> int:
    try:
        widths = sorted({int(w) for w in args.widths.split(",") if w.strip()})
    except ValueError:
        widths = []
    if not widths or widths[0] < 1:
        raise UsageError(f"--widths must be positive integers, got {args.widths!r}")
    longest = max(args.context + max(widths), args.prefill or 0)
    llama = _llama_bench(args)  # (before loading: a missing binary or a non-GGUF model is a usage error at once)
    llm = LLM(args.model, spec="none", **{**model_options(args), "max_model_len": longest + 8})
    runner = llm.runner
    nbytes = runner.weight_bytes()
    context = synthetic_context(runner, args.context)
    part_widths = ([w for w in widths if w in (1, 8)] or widths[:1]) if args.parts else []
    # before the floor's own buffer exists
    model_peak, parts = _peak_and_parts(runner, context, max(widths), part_widths, args.rounds)
    floor_read = floor_reader(nbytes, runner.device)
    times = measure(runner, context, widths, args.rounds, floor_read)
    prefill = measure_prefill(runner, args.prefill, args.rounds) if args.prefill else None
    # llama-bench after ours, never beside it: two programs on 2 cores would time each other
    peer = None if llama is None else llama_bench.run(*llama, get_num_threads(), widths, args.context, args.prefill,
                                                      args.rounds)
    floor_times = times.pop(0)
    floor = statistics.median(floor_times)
    whole = pass_table(times, floor_times, list(range(args.rounds)))
    phases = memory_phases(floor_times)
    costs = {w: ms / 1e3 for w, ms in whole["pass_ms"].items()}
    parts = {w: {**p, "rest": costs[w] - sum(p.values())} for w, p in parts.items()}
    result = {
        "model": llm.model_name, "dtype": args.dtype, "kv_cache": runner.kv_cache_label, "backend": runner.backend,
        "device": str(runner.device),
        "context": args.context, "rounds": args.rounds, "weight_bytes": nbytes,
        "read_floor_ms": floor * 1e3, "read_floor_ms_range": [min(floor_times) * 1e3, max(floor_times) * 1e3],
        "read_gb_per_s": nbytes / floor / 1e9, "read_streams_per_core": floor_read.streams,
        "pass_ms": whole["pass_ms"], "vs_one_token": whole["vs_one_token"], "vs_floor": whole["vs_floor"],
        "one_token_vs_floor": whole["vs_floor"][widths[0]],
        "phases": [pass_table(times, floor_times, rounds) for rounds in phases] if len(phases) > 1 else [],
        "peak_rss_bytes": model_peak, "rss_bytes": rss_bytes(),
        "kv_bytes": runner.kv_bytes(), "weights": runner.weights_label, "model_file_bytes": _file_bytes(args.model),
        "parts_ms": {w: {k: v * 1e3 for k, v in p.items()} for w, p in parts.items()},
        "prefill": None if prefill is None else {"tokens": args.prefill, "ms": prefill * 1e3,
                                                 "tokens_per_s": args.prefill / prefill},
        "torch_threads": torch.get_num_threads(), "machine": machine_info(),
        "llama_bench": peer,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    _print_result(result, widths, parts)
    return 0


def _print_result(result: dict, widths: list[int], parts: dict[int, dict[str, float]]) -> None:
    """``cmd_passes``' tables: the passes by width beside the read floor (one a memory speed), the prefill,
    llama-bench's, the parts (``parts``: seconds by part, by width)."""
    m, nbytes, floor = result["machine"], result["weight_bytes"], result["read_floor_ms"] / 1e3
    print(f"{result['model']}, {result['weights']}, {result['dtype']} compute, {result['kv_cache']} KV cache, "
          f"backend {result['backend']}, {result['context']}-token context; "
          f"CPU {m.get('cpu', '?')} ({m.get('cores', '?')} cores, {m.get('simd', '?')})")
    lo, hi = result["read_floor_ms_range"]
    streams = result["read_streams_per_core"]
    print(f"weights {nbytes / 1e6:.0f} MB; read floor {floor * 1e3:.1f} ms ({result['read_gb_per_s']:.1f} GB/s; "
          f"{lo:.1f}-{hi:.1f} ms over the rounds, timed between the passes; "
          f"{'one stream' if streams == 1 else f'{streams} streams in turn'} a core)")
    limit = result["model_file_bytes"] + result["kv_bytes"] + 500 * 2**20
    print(f"peak RSS loading and decoding {result['peak_rss_bytes'] / 2**20:.0f} MiB (before the read floor's own "
          "buffer); " + (f"the model file + KV cache + 500 MiB = {limit / 2**20:.0f} MiB"
                         if result["model_file_bytes"] else ""))
    whole = {k: result[k] for k in ("pass_ms", "vs_one_token", "vs_floor")}
    tables = result["phases"] or [whole]
    if result["phases"]:
        print("the memory changed speed during the run: a table for each speed "
              "(rounds split where the read floor jumps; ratios taken round by round)")
    for table in tables:
        if result["phases"]:
            print(f"\n{table['rounds']} rounds, read floor {table['read_floor_ms']:.1f} ms "
                  f"({nbytes / table['read_floor_ms'] / 1e6:.1f} GB/s):")
        print("| tokens in the pass | ms per pass | x 1-token pass | x read floor |")
        print("|---:|---:|---:|---:|")
        for w in widths:
            print(f"| {w} | {table['pass_ms'][w]:.1f} | {table['vs_one_token'][w]:.2f} | {table['vs_floor'][w]:.2f} |")
    prefill = result["prefill"]
    if prefill is not None:
        print(f"\nprefill of {prefill['tokens']} tokens into an empty cache: {prefill['ms']:.1f} ms "
              f"({prefill['tokens_per_s']:.1f} tokens/s; llama-bench's pp{prefill['tokens']})")
    if result["llama_bench"] is not None:
        _print_peer(result, result["llama_bench"], widths, get_num_threads())
    for w, p in parts.items():
        print(f"\n{w}-token pass by part (each timed alone; rest = the pass minus the parts):")
        print("| part | ms | share of the pass |")
        print("|---|---:|---:|")
        for name, sec in p.items():
            print(f"| {name} | {sec * 1e3:.1f} | {sec / (result['pass_ms'][w] / 1e3):.0%} |")
    sys.stdout.flush()


def _llama_bench(args: argparse.Namespace) -> tuple[Path, Path] | None:
    """llama-bench's binary and the model's GGUF file for --llama-bench; UsageError where either is missing."""
    if not args.llama_bench:
        return None
    gguf = gguf_file(args.model)
    if gguf is None:
        raise UsageError("--llama-bench needs a GGUF model (the file llama-bench reads)")
    binary = llama_bench.find_llama_bench()
    if binary is None:
        raise UsageError("--llama-bench: no llama-bench binary (bash scripts/build_llama_cpp.sh, or set "
                         "SPECDEC_LLAMA_BENCH)")
    return binary, gguf


def _print_peer(result: dict, peer: dict, widths: list[int], threads: int) -> None:
    print(f"\nllama.cpp b{peer['build']}'s llama-bench on the same GGUF file, {threads} threads, after this run "
          f"(ppN after the same {result['context']}-token context, mean of {result['rounds']}"
          + ("" if peer["repack"] else f"; {llama_cpp.REPACK_NOTICE}") + "):")
    print("| tokens in the pass | specdec ms | llama.cpp ms | llama.cpp / specdec |")
    print("|---:|---:|---:|---:|")
    for w in widths:
        ours, theirs = result["pass_ms"][w], peer["pass_ms"][w]
        print(f"| {w} | {ours:.1f} | {theirs:.1f} | {theirs / ours:.2f}x |")
    if peer["prefill_ms"] is not None:
        n = result["prefill"]["tokens"]
        ours, theirs = result["prefill"]["tokens_per_s"], n / peer["prefill_ms"] * 1e3
        print(f"prefill of {n} tokens: specdec {ours:.1f} tokens/s, llama.cpp {theirs:.1f} (pp{n}): "
              f"{ours / theirs:.2f}x llama.cpp's")


def _peak_and_parts(runner: ModelRunner, context: list[int], width: int, part_widths: list[int],
                    rounds: int) -> tuple[int, dict[int, dict[str, float]]]:
    """Peak RSS after loading, a prefill of ``context`` and a ``width``-token pass; then, on the same
    cache, each of ``part_widths``' passes by part (``pass_parts``; fused runners only)."""
    if part_widths and getattr(runner, "fused", None) is None:
        raise UsageError("--parts needs the fused CPU kernels (--backend cpu-kernels)")
    slot = runner.allocate()
    try:
        runner.run([SeqInput(slot, context, all_logits=False)])
        runner.run([SeqInput(slot, probe_tokens(runner, width))])
        runner.truncate(slot, len(context))
        peak = peak_rss_bytes()
        if not part_widths:
            return peak, {}
        from specdec.bench.pass_parts import part_costs

        return peak, {w: part_costs(runner, slot, w, rounds) for w in part_widths}
    finally:
        runner.free(slot)


def rss_bytes() -> int:
    """This process's resident memory now (Linux; 0 elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _file_bytes(model: str | None) -> int:
    path = gguf_file(model)
    return path.stat().st_size if path else 0
