"""What adaptive's own methods cost in wall time (no profiler): its accept, dry runs, plan and propose.

    python scripts/adaptive_overhead.py [--model smollm2-135m] [--batch 4] [--temperature 1]

16 creative + MT-bench first-turn prompts, 128 tokens each (EOS ignored), in batches, after a warm-up batch;
every batch starts with the drafters' shared state empty and nothing cached. Each method is timed with
``time.perf_counter`` around it; prints calls, us a call and the share of the run.
docs/performance.md's twenty-fourth Zen 4 section ("What adaptive's own work costs") came from it.
"""

from __future__ import annotations

import argparse
import collections
import time

from specdec.bench.machine import cpu_info
from specdec.bench.workloads import load_workload
from specdec.config import SamplingParams
from specdec.drafters.adaptive import AdaptiveDrafter
from specdec.llm import LLM

METHODS = ("accept", "_dry_run", "planned_alpha", "propose")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=1.0)
    args = ap.parse_args()
    seconds: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()

    def timed(name: str):
        method = getattr(AdaptiveDrafter, name)

        def wrapper(self, *a, **k):
            t0 = time.perf_counter()
            out = method(self, *a, **k)
            seconds[name] += time.perf_counter() - t0
            calls[name] += 1
            return out

        return wrapper

    for name in METHODS:
        setattr(AdaptiveDrafter, name, timed(name))
    llm = LLM(args.model, spec="adaptive", max_num_seqs=args.batch)
    prompts = [llm.chat_prompt(c.messages(0, [])) for name in ("creative", "mt_bench")
               for c in load_workload(name).conversations][:16]

    def run(chunk: list[list[int]], seed: int) -> float:
        llm.drafts.forget()
        llm.forget_prefixes()
        seqs = [llm.new_sequence(list(p), SamplingParams(max_new_tokens=128, temperature=args.temperature,
                                                         seed=seed + i, ignore_eos=True))
                for i, p in enumerate(chunk)]
        t0 = time.perf_counter()
        llm.engine.run_batch(seqs)
        return time.perf_counter() - t0

    cpu = cpu_info()
    print(f"# {cpu['cpu']}, {cpu['cores']} cores, SIMD {cpu['simd']}; {llm.model_name}, {llm.runner.weights_label}; "
          f"batch {args.batch}, T={args.temperature}")
    llm.warmup()
    run(prompts[: args.batch], 0)
    seconds.clear()
    calls.clear()
    total = sum(run(prompts[s : s + args.batch], 100 + s) for s in range(0, len(prompts), args.batch))
    print(f"run {total:.3f} s")
    for name in METHODS:
        n = max(1, calls[name])
        print(f"{name:14s} {calls[name]:6d} calls {1e6 * seconds[name] / n:7.1f} us a call "
              f"{100 * seconds[name] / total:5.2f}% of the run")


if __name__ == "__main__":
    main()
