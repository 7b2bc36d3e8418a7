"""What a pass costs with each KV cache type (--kv-cache-dtype), by context length and pass width: one runner,
three caches (float32, float16, bfloat16) holding the same context, the passes alternated in one process.

    python scripts/kv_cache_types.py [--model qwen2.5-coder-1.5b] [--contexts 300,1000,2000] [--widths 1,2,4]

A pass's weights are the same bytes whatever the cache; its attention reads each cached key and value once, so a
16-bit cache halves that part. Medians over the rounds, every cache type's pass back to back within a round.
"""

from __future__ import annotations

import argparse
from functools import partial

import torch

from specdec.bench.machine import cpu_info
from specdec.bench.passes import alternated, probe_tokens, synthetic_context
from specdec.cache import KVCache
from specdec.llm import LLM
from specdec.model import clib
from specdec.runners.base import SeqInput

TYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def one_pass(runner, cache: KVCache, slot: int, tokens: list[int], context: int) -> None:
    """One pass of ``tokens`` after ``context`` cached tokens, reading and writing ``cache``; then rolled back."""
    runner.cache = cache
    runner.run([SeqInput(slot, tokens)])
    runner.truncate(slot, context)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--contexts", default="300,1000,2000")
    ap.add_argument("--widths", default="1,2,4")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    widths = [int(w) for w in args.widths.split(",")]
    llm = LLM(args.model, spec="none", max_model_len=max(contexts) + max(widths) + 8)
    runner = llm.runner
    cpu = cpu_info()
    print(f"# {cpu['cpu']}, {cpu['cores']} cores, kernels {clib.isa()}; {args.model}, {runner.weights_label}; "
          f"median of {args.rounds} alternated rounds")
    print("| context | tokens in the pass | " + " | ".join(f"{name} KV ms" for name in TYPES)
          + " | float16 / float32 | bfloat16 / float32 |")
    print("|---:|---:|" + "---:|" * (len(TYPES) + 2))
    probe = probe_tokens(runner, max(widths))
    for context in contexts:
        caches = {name: KVCache(runner.config, 1, runner.cache.max_seq_len, dtype) for name, dtype in TYPES.items()}
        slot = runner.allocate()
        for cache in caches.values():  # the same context in every cache
            runner.cache = cache
            runner.truncate(slot, 0)
            runner.run([SeqInput(slot, synthetic_context(runner, context), all_logits=False)])

        for w in widths:
            calls = {name: partial(one_pass, runner, cache, slot, probe[:w], context) for name, cache in caches.items()}
            ms = {name: s * 1e3 for name, s in alternated(calls, args.rounds).items()}
            print(f"| {context} | {w} | " + " | ".join(f"{ms[name]:.2f}" for name in TYPES)
                  + f" | {ms['float16'] / ms['float32']:.3f} | {ms['bfloat16'] / ms['float32']:.3f} |", flush=True)
        runner.free(slot)


if __name__ == "__main__":
    main()
