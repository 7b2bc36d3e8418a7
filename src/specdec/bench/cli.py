"""`specdec bench`: methods and peers side by side on Spec-Bench-style workloads, with oracle analysis.

Writes OUT/report.md, OUT/results.jsonl (one record per run), OUT/run.json (command,
machine, settings, notes: what report.md is rendered from besides the records) and PNG plots.
A greedy speculative output that differs from plain decoding fails the run
(exit status 1) after writing OUT/mismatch.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from specdec.bench.config import (
    DEFAULT_METHODS,
    HEAD_METHODS,
    PASS_WIDTHS,
    PEER_NAMES,
    BenchConfig,
    methods_types,
    parse_methods,
)
from specdec.bench.workloads import WORKLOAD_NAMES, load_workload, load_workload_file
from specdec.cli.args import add_model_args, add_spec_args, model_options, positive_int, spec_from_args
from specdec.errors import UsageError

# --quick: a few prompts per workload, batch 1, greedy (creative keeps its temperature):
# a few minutes on two CPU cores with the default 135M model.
QUICK = dict(limit=1, max_turns=2, max_new_tokens=24, batch_sizes=[1], temperatures=[0.0])
FULL = dict(limit=None, max_turns=None, max_new_tokens=128, batch_sizes=[1, 4, 16], temperatures=[0.0, 0.7])


def _number_list(parse: type, minimum: float, what: str):
    """argparse type for '1,4,16': a non-empty list of ``parse`` values >= ``minimum``."""

    def convert(text: str) -> list:
        try:
            values = [parse(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}") from None
        if not values or any(v < minimum for v in values):
            raise argparse.ArgumentTypeError(f"expected {what} >= {minimum}, got {text!r}")
        return values

    return convert


_ints = _number_list(int, 1, "integers")
_floats = _number_list(float, 0, "numbers")


def _names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


# The flags of every `specdec bench` command live here, the measuring modules (torch, numba) load
# only when a command runs: --help and argument errors answer at once.
def add_passes_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--context", type=positive_int, default=300, help="tokens already in the cache (default 300)")
    p.add_argument("--widths", default=",".join(map(str, PASS_WIDTHS)), help="pass widths (default 1,2,4,8,16,32)")
    p.add_argument("--rounds", type=positive_int, default=15, help="rounds over all widths (median kept)")
    p.add_argument("--parts", action="store_true",
                   help="also time each part of a pass alone (products by matrix kind, attention, LM head, the rest)")
    p.add_argument("--prefill", type=positive_int, default=None, metavar="N",
                   help="also time a prompt of N tokens into an empty cache, logits for its last token only "
                        "(what llama-bench's ppN measures)")
    p.add_argument("--llama-bench", action="store_true",
                   help="then run llama.cpp's llama-bench on the same GGUF file and threads (each width as ppN after "
                        "the same context, the prefill as ppN) and print the two side by side "
                        "(bash scripts/build_llama_cpp.sh builds it)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


def add_accuracy_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--tokens", type=positive_int, default=1024, help="tokens of the fixed text scored")
    p.add_argument("--max-new-tokens", type=positive_int, default=64, help="greedy tokens per prompt")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


def add_bench_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="bench_command", metavar="{passes,accuracy}")
    add_passes_args(sub.add_parser("passes", help="ms per target pass by width, against the weight-read floor"))
    add_accuracy_args(sub.add_parser("accuracy", help="a quantized format vs the dequantised float32 model"))
    add_model_args(p)
    p.add_argument("--methods", default=None,
                   help="comma list of spec types; '+' chains (e.g. suffix+draft-model); 'none' is always run "
                        f"(default: {','.join(DEFAULT_METHODS)}, plus {','.join(HEAD_METHODS)} with "
                        "--spec-model, plus draft-model with --draft-model)")
    p.add_argument("--workloads", type=_names, default=None,
                   help=f"comma list from {','.join(WORKLOAD_NAMES)} (default: all)")
    p.add_argument("--workload-file", default=None,
                   help='extra JSONL workload: rows {"prompt": ...} or {"turns": [...], "system": ...}')
    p.add_argument("--batch-sizes", type=_ints, default=None, help="default 1,4,16 (--quick: 1)")
    p.add_argument("--temperatures", type=_floats, default=None, help="default 0,0.7 (--quick: 0)")
    p.add_argument("--max-new-tokens", type=positive_int, default=None, help="default 128 (--quick: 24)")
    p.add_argument("--limit", type=positive_int, default=None,
                   help="conversations per workload, spread evenly (default: all; --quick: 1)")
    p.add_argument("--max-turns", type=positive_int, default=None,
                   help="turns per conversation (default: all; --quick: 2)")
    p.add_argument("--peers", type=_names, default=list(PEER_NAMES),
                   help=f"comma list from {','.join(PEER_NAMES)}, or 'none' (default: all)")
    p.add_argument("--peer-threads", type=positive_int, default=None,
                   help="torch threads for peers (default: torch's default)")
    p.add_argument("--out", default="bench-out", help="output folder (default: bench-out)")
    p.add_argument("--quick", action="store_true", help="a few prompts per workload; minutes, not hours")
    p.add_argument("--usd-per-hour", type=float, default=1.0, help="machine price for cost per M tokens")
    add_spec_args(p, with_type=False)  # every drafter setting, as generate and serve take them
    p.add_argument("--seed", type=int, default=0, help="base seed of sampled runs")
    p.add_argument("--ignore-eos", action="store_true",
                   help="every answer runs to --max-new-tokens (equal lengths: sampled cells compare fairly)")
    p.add_argument("--no-oracle", action="store_true", help="skip the oracle replay")


def config_from_args(args: argparse.Namespace, argv: list[str] | None = None) -> BenchConfig:
    preset = QUICK if args.quick else FULL
    pick = lambda name: preset[name] if getattr(args, name) is None else getattr(args, name)
    try:
        defaults = DEFAULT_METHODS + (HEAD_METHODS if args.spec_model else ())
        text = args.methods or ",".join(defaults)
        text += ",draft-model" if args.draft_model and "draft-model" not in text else ""
        # the flags checked against every method's types at once (eagle3's n-max rule included)
        base = spec_from_args(args, types=methods_types(text))
        methods = parse_methods(text, base)
        if args.workloads is None and args.workload_file:
            names = []
        else:
            names = args.workloads or list(WORKLOAD_NAMES)
        workloads = [load_workload(n) for n in names]
        if args.workload_file:
            workloads.append(load_workload_file(args.workload_file))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    limit, max_turns = pick("limit"), pick("max_turns")
    peers = [] if args.peers == ["none"] else args.peers
    unknown = [p for p in peers if p not in PEER_NAMES]
    if unknown:
        raise UsageError(f"unknown peer {unknown[0]!r}; choose from: {', '.join(PEER_NAMES)}, none")
    return BenchConfig(
        methods=methods, workloads=[w.limited(limit, max_turns) for w in workloads], model=args.model,
        **model_options(args),
        batch_sizes=pick("batch_sizes"),
        temperatures=pick("temperatures"), max_new_tokens=pick("max_new_tokens"), limit=limit,
        ignore_eos=args.ignore_eos,
        max_turns=max_turns, peers=peers, out=Path(args.out), quick=args.quick, usd_per_hour=args.usd_per_hour,
        draft_model=args.draft_model, draft_n_max=base.draft_n_max, seed=args.seed,
        peer_threads=args.peer_threads, oracle=not args.no_oracle, command=command_line(argv),
    )


def command_line(argv: list[str] | None) -> str:
    """The command as typed (when run from the shell); the report shows it."""
    if argv is None and sys.argv[1:2] == ["bench"]:
        argv = sys.argv[1:]
    return "specdec " + shlex.join(argv) if argv else "specdec bench (called from Python)"


def cmd_bench(args: argparse.Namespace) -> int:
    if args.bench_command == "passes":
        from specdec.bench.passes import cmd_passes

        return cmd_passes(args)
    if args.bench_command == "accuracy":
        from specdec.bench.accuracy import cmd_accuracy

        return cmd_accuracy(args)
    cfg = config_from_args(args, getattr(args, "argv", None))  # input errors answer before torch loads
    import torch

    from specdec.bench import harness, metrics, plots, report  # plots: matplotlib, about a second

    cfg.default_threads = torch.get_num_threads()  # before specdec's loader changes it
    cfg.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    load_before, code = os.getloadavg(), code_version()  # the code that runs, before any edit
    print(f"[specdec bench] {len(cfg.methods)} methods x {len(cfg.workloads)} workloads, "
          f"batch sizes {cfg.batch_sizes}, temperatures {cfg.temperatures}, peers {cfg.peers or 'none'} "
          f"-> {cfg.out}", file=sys.stderr)
    try:
        result = harness.run_bench(cfg)
    except harness.GreedyMismatchError as exc:
        (cfg.out / "mismatch.txt").write_text(str(exc) + "\n")
        print(f"specdec: error: {exc}", file=sys.stderr)
        return 1
    records = metrics.cell_records(result.cells, cfg.usd_per_hour)
    if result.oracle:
        records += metrics.oracle_records(result.oracle, result.pass_costs, result.pass_cost_context)
    with open(cfg.out / "results.jsonl", "w") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")
    pngs = plots.write_plots(records, cfg.out)
    meta = run_meta(cfg, result, time.perf_counter() - t0, code)
    meta["load_before"], meta["load_after"] = load_before, os.getloadavg()
    notes = run_notes(cfg, meta) + result.notes
    (cfg.out / "report.md").write_text(report.render(records, meta, notes, [str(p) for p in pngs]))
    (cfg.out / "run.json").write_text(json.dumps({"meta": meta, "notes": notes}, indent=1) + "\n")
    print(f"[specdec bench] wrote {cfg.out / 'report.md'}, results.jsonl and {len(pngs)} plots "
          f"in {(time.perf_counter() - t0) / 60:.1f} min", file=sys.stderr)
    return 0


def run_meta(cfg: BenchConfig, result, wall: float, code: str) -> dict:
    import torch

    from specdec.bench.machine import machine_info

    return {
        "command": cfg.command, "model": cfg.model or "SmolLM2-135M-Instruct (default)", "folder": result.folder,
        "dtype": cfg.dtype, "device": cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"),
        "machine": machine_info(), "max_new_tokens": cfg.max_new_tokens, "limit": cfg.limit,
        "max_turns": cfg.max_turns, "ignore_eos": cfg.ignore_eos,
        "quick": cfg.quick, "draft_n_max": cfg.draft_n_max, "usd_per_hour": cfg.usd_per_hour,
        "requests": {w: len(r) for w, r in result.requests.items()},
        "specdec_threads": torch.get_num_threads(), "peer_threads": cfg.peer_threads or cfg.default_threads,
        "wall_seconds": wall, "code": code, "weights": result.weights, "kv_cache": result.kv_cache,
    }


def code_version() -> str:
    """The git commit specdec runs from (+ a mark for uncommitted changes to its sources), or the
    package version. Only the package counts: a report written into the checkout is not code."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True,
                                text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", str(here.parent)],
                               cwd=here,
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        try:
            return f"specdec {version('specdec')}"
        except PackageNotFoundError:
            return "unknown"
    return f"git {commit}" + (" + uncommitted changes" if dirty else "")


def run_notes(cfg: BenchConfig, meta: dict) -> list[str]:
    m = meta["machine"]
    notes = []
    if not (m["amx"] or m["avx512_bf16"]) and meta["device"] == "cpu":
        notes.append("bfloat16 has no native arithmetic on this CPU (no AMX, no AVX512-BF16): specdec's kernels "
                     "read bf16 weights and compute in float32, while torch's bf16 matmuls (the peers') are "
                     "emulated and slow; float32 is the like-for-like setting against the peers here"
                     + (" — this run used bfloat16." if cfg.dtype == "bfloat16" else "."))
    if "llama-cpp" in cfg.peers:
        ours = cfg.kv_cache_dtype if cfg.kv_cache_dtype != "auto" else meta.get("kv_cache") or cfg.dtype
        notes.append(f"KV cache: specdec {ours}, llama-server "
                     + (f"{ours} too (-ctk/-ctv, as --kv-cache-dtype asked)." if cfg.kv_cache_dtype != "auto"
                        else "f16 (its default; --kv-cache-dtype float16 runs both alike)."))
    notes.append("The creative workload always runs at temperature 1.0 (its own setting), whatever "
                 "--temperatures says; greedy checks do not apply to sampled runs.")
    notes.append("specdec's methods run in lockstep: each batch of a workload's requests runs under every method "
                 "at once, one step of each method in turn (the first rotating by batch), each timed over its own "
                 "steps, so machine drift hits all alike (where the cache lacks the slots, as many methods as fit "
                 "at a time); peers run after.")
    notes.append("Batch sizes > 1 run static batches through the engine (start B sequences, step until all "
                 "finish); tokens/s counts every sequence's tokens over the batch's wall time.")
    notes.append("Peers run at batch size 1 only (transformers' prompt-lookup and assisted generation support "
                 "no other) with a clean GenerationConfig (no top-k/top-p defaults).")
    notes.append("Peak RSS is the bench process's high-water mark when the run finished (it only grows: peers "
                 "load their own copy of the model). KV = specdec's preallocated static cache for every slot; "
                 "drafter bytes = shared drafter state (suffix cache trie, draft model) where known.")
    small = [w.name for w in cfg.workloads if w.num_requests < max(cfg.batch_sizes)]
    if max(cfg.batch_sizes) > 1 and small:
        notes.append(f"A batch holds at most the workload's requests: {', '.join(small)} have fewer than "
                     f"{max(cfg.batch_sizes)}, so their larger batch sizes run smaller batches.")
    if cfg.quick:
        notes.append("--quick: one conversation per workload (at most two turns) and short outputs; numbers "
                     "are noisy. Run without --quick for the full grid.")
    return notes
