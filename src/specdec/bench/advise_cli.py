"""`specdec advise` on the command line: flags, input checks (one error line each), the printed advice."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from specdec.bench.config import parse_methods
from specdec.bench.workloads import WORKLOAD_NAMES, Workload, load_workload, load_workload_file
from specdec.cli.args import add_model_args, model_options, positive_int
from specdec.config import SpecConfig
from specdec.errors import UsageError

if TYPE_CHECKING:  # the measuring side (advise.py, the harness) imports torch: loaded when advise runs
    from specdec.bench import advise

DEFAULT_WORKLOAD = "mt_bench"
MAX_TEMPERATURE = 2.0  # the OpenAI API's range
MAX_BATCH_SIZE = 64  # one KV cache slot of --max-model-len per sequence


def add_advise_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--workload", default=DEFAULT_WORKLOAD,
                   help=f"a workload name ({', '.join(WORKLOAD_NAMES)}) or a JSONL file of "
                        f'{{"prompt": ...}} or {{"turns": [...]}} rows (default {DEFAULT_WORKLOAD})')
    p.add_argument("--temperature", type=float, default=None,
                   help=f"sampling temperature, 0 to {MAX_TEMPERATURE:g} (default: the workload's own, else 0)")
    p.add_argument("--batch-size", type=int, default=1,
                   help=f"sequences decoded together, 1 to {MAX_BATCH_SIZE} (default 1)")
    p.add_argument("--draft-model", default=None, help="also measure this draft model (same tokenizer as the target)")
    p.add_argument("--spec-model", default=None,
                   help="also measure this EAGLE-3 head (default: the one shipped for the default model, if any)")
    p.add_argument("--spec-draft-vocab-size", type=positive_int, default=None, metavar="N",
                   help="the draft model drafts from its N most frequent tokens (FR-Spec), in draft-model and adaptive")
    p.add_argument("--spec-datastore", default=None, metavar="PATH",
                   help="also measure retrieval from this datastore (`specdec datastore build`); adaptive asks it too")
    p.add_argument("--prompts", type=positive_int, default=4, help="requests to measure (default 4)")
    p.add_argument("--max-new-tokens", type=positive_int, default=64, help="tokens per request (default 64)")
    p.add_argument("--spec-draft-n-max", type=positive_int, default=SpecConfig.draft_n_max,
                   help="most drafted tokens per step, every method")
    p.add_argument("--seed", type=int, default=0, help="base seed of sampled runs")
    p.add_argument("--json", action="store_true", help="print the advice and its numbers as one JSON object")


def read_workload(text: str) -> Workload:
    """A workload name, else a file; an unknown name and an unreadable file are UsageErrors."""
    try:
        if text in WORKLOAD_NAMES:
            return load_workload(text)
        if Path(text).suffix or "/" in text or Path(text).exists():
            return load_workload_file(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    raise UsageError(f"unknown workload {text!r}; choose from: {', '.join(WORKLOAD_NAMES)}, or give a JSONL file")


def config_from_args(args: argparse.Namespace) -> advise.AdviseConfig:
    if args.temperature is not None and not 0 <= args.temperature <= MAX_TEMPERATURE:
        raise UsageError(f"--temperature must be in [0, {MAX_TEMPERATURE:g}], got {args.temperature:g}")
    if not 1 <= args.batch_size <= MAX_BATCH_SIZE:
        raise UsageError(f"--batch-size must be in [1, {MAX_BATCH_SIZE}], got {args.batch_size}")
    if args.spec_draft_vocab_size is not None and not args.draft_model:
        raise UsageError("--spec-draft-vocab-size cuts the draft model's LM head: it needs --draft-model")
    workload = read_workload(args.workload)
    from specdec.bench import advise  # after the input checks: they answer without loading torch

    temperature = args.temperature if args.temperature is not None else (workload.temperature or 0.0)
    workload = advise.first_requests(replace(workload, temperature=temperature), args.prompts)
    return advise.AdviseConfig(
        workload=workload, temperature=temperature, batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens, draft_n_max=args.spec_draft_n_max, model=args.model,
        **model_options(args),
        draft_model=args.draft_model, spec_model=args.spec_model, draft_vocab_size=args.spec_draft_vocab_size,
        datastore=args.spec_datastore, seed=args.seed,
    )


def cmd_advise(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    from specdec.bench import advise
    from specdec.bench.harness import GreedyMismatchError

    base = SpecConfig(draft_n_max=cfg.draft_n_max, draft_model=cfg.draft_model, spec_model=cfg.spec_model,
                      draft_vocab_size=cfg.draft_vocab_size, datastore=cfg.datastore)
    try:
        methods = parse_methods(",".join(advise.candidate_names(cfg)), base)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    log = lambda line: print(f"[specdec advise] {line}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        result = advise.run_advise(cfg, methods, log)
    except GreedyMismatchError as exc:  # as in `specdec bench`: losslessness broken, exit status 1
        print(f"specdec: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result.to_dict()) if args.json else render(result), flush=True)
    return 0


def render(a: advise.Advice) -> str:
    widths = sorted(a.pass_ms)
    one = a.pass_ms[widths[0]]
    lines = [
        f"{a.model} on {a.device}; workload {a.workload} ({a.workload_kind}), {a.requests} requests x "
        f"{a.max_new_tokens} new tokens, temperature {a.temperature:g}, batch size {a.batch_size}",
        "",
        "pass cost by width (tokens in one pass: ms, x a 1-token pass): "
        + ", ".join(f"{w}: {a.pass_ms[w]:.1f} ({a.pass_ms[w] / one:.2f}x)" for w in widths),
        "",
        "| method | acceptance rate | tau | drafted per pass | tok/s | expected speedup | measured speedup |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for m in a.methods:
        rate = "-" if m.name == "none" else f"{m.acceptance_rate:.2f}"
        lines.append(f"| {m.name} | {rate} | {m.tau:.2f} | {m.drafted_per_pass:.1f} | {m.tokens_per_s:.1f} | "
                     f"{m.expected_speedup:.2f}x | {m.measured_speedup:.2f}x |")
    lines += ["", "why:"]
    lines += [f"  {i}. {r}" for i, r in enumerate(a.reasons, 1)]
    lines += ["", f"recommended: {a.recommended}", f"  {a.command}"]
    return "\n".join(lines)
