"""Tokens per pass of look-up drafting under sampling, a number wall-clock noise does not move.

    python scripts/adaptive_tau.py "adaptive;suffix" [--model qwen2.5-coder-1.5b] [--temperature 0.7]

The first 4 first-turn prompts of MT-bench, math, translation and QA, seeds 1 and 2, 64 tokens each,
`--spec-draft-n-max 4`; each method (";"-separated spec types) runs them all on one LLM (the drafters'
shared state, adaptive's ledger included, carries across its requests). Prints, per group, the tokens
drafted and kept and tau (committed tokens per decode pass). docs/performance.md's twenty-second-session
tau table came from it (Qwen2.5-Coder-1.5B, T=0.7).
"""

from __future__ import annotations

import argparse
import time

from specdec.bench.workloads import load_workload
from specdec.config import SamplingParams, SpecConfig, parse_spec_types
from specdec.llm import LLM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("methods", help='spec types separated by ";", e.g. "adaptive;suffix"')
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--temperature", type=float, default=0.7)
    args = ap.parse_args()
    llm = LLM(args.model)
    prompts = [(group, llm.chat_prompt(c.messages(0, [])))
               for group in ("mt_bench", "math_reasoning", "translation", "qa")
               for c in load_workload(group).limited(4, 1).conversations]
    for method in args.methods.split(";"):
        llm.set_spec(SpecConfig(types=parse_spec_types(method), draft_n_max=4))
        totals: dict[str, list[int]] = {}
        t0 = time.perf_counter()
        for seed in (1, 2):
            for group, ids in prompts:
                stats = llm.run_batches([ids], [SamplingParams(max_new_tokens=64, temperature=args.temperature,
                                                               seed=seed)]).stats
                t = totals.setdefault(group, [0, 0, 0, 0])
                t[0] += stats.drafted
                t[1] += stats.accepted
                t[2] += stats.decode_passes
                t[3] += stats.decode_tokens
        cells = " ".join(f"{g}: drafted {d} kept {a} tau {n / p:.2f}" for g, (d, a, p, n) in totals.items())
        print(f"{method} ({time.perf_counter() - t0:.0f} s) {cells}", flush=True)


if __name__ == "__main__":
    main()
