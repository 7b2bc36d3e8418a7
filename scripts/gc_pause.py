"""How long the garbage collector's full collections stall a process serving a loaded model.

    python scripts/gc_pause.py [--model smollm2-135m] [--warmup]

Counts the full (generation 2) collections, and their pauses, over sampled ``adaptive`` requests on
Spec-Bench dev prompts, then times one ``gc.collect()``. ``--warmup`` calls ``LLM.warmup`` first, which
freezes the loaded heap out of the collector (``llm.freeze_heap``).
"""

from __future__ import annotations

import argparse
import gc
import time

from head_draft_cost import dev_prompts

from specdec.config import SamplingParams
from specdec.llm import LLM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--warmup", action="store_true")
    ap.add_argument("--prompts", type=int, default=24)
    args = ap.parse_args()
    llm = LLM(args.model, spec="adaptive")
    if args.warmup:
        llm.warmup()
    prompts = [llm.chat_prompt(m) for m in dev_prompts(args.prompts)]
    started: dict[int, float] = {}
    pauses: list[float] = []

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            started[info["generation"]] = time.perf_counter()
        elif info["generation"] == 2:
            pauses.append(time.perf_counter() - started[2])

    gc.callbacks.append(watch)
    for i in range(0, len(prompts), 4):
        llm.generate(prompts[i:i + 4], SamplingParams(max_new_tokens=256, temperature=0.7, seed=i))
    gc.callbacks.remove(watch)
    print(f"{len(gc.get_objects())} tracked objects; {len(pauses)} full collections during the requests, "
          f"longest {1e3 * max(pauses, default=0):.1f} ms, {1e3 * sum(pauses):.1f} ms in all")
    t0 = time.perf_counter()
    gc.collect()
    print(f"one full collection now: {1e3 * (time.perf_counter() - t0):.1f} ms")


if __name__ == "__main__":
    main()
