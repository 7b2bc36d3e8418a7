"""A second turn's prefill with the first turn's K/V kept in the slot, beside the same prompt cold.

    python scripts/prompt_cache.py [--model qwen2.5-coder-1.5b] [--conversations 3] [--draft-model qwen2.5-coder-0.5b]

The first MT-bench conversations: turn 1 (64 greedy tokens), then turn 2 on the same slot (warm: the runner's
``allocate`` finds turn 1's tokens cached), then turn 2 again after ``forget_prefixes`` (cold). Prints the
tokens found cached, both prefills' seconds and whether the two outputs are the same tokens. With a draft
model (chains of 4 from its 16,384 most frequent tokens) also both turns' drafting seconds: its own slot keeps
turn 1 too, and its catch-up on turn 2 is part of drafting.
"""

from __future__ import annotations

import argparse

from specdec.bench.machine import cpu_info
from specdec.bench.workloads import load_workload
from specdec.config import SamplingParams, SpecConfig, SpecType
from specdec.llm import LLM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--conversations", type=int, default=3)
    ap.add_argument("--draft-model", help="draft with this model (its slot's cached prompt timed too)")
    args = ap.parse_args()
    spec = None if args.draft_model is None else SpecConfig(
        types=(SpecType.DRAFT_MODEL,), draft_model=args.draft_model, draft_n_max=4, draft_vocab_size=16384)
    llm = LLM(args.model, spec=spec)
    params = SamplingParams(max_new_tokens=64)
    cpu = cpu_info()
    print(f"# {cpu['cpu']}, {cpu['cores']} cores, SIMD {cpu['simd']}; {llm.model_name}, {llm.runner.weights_label}")
    for c in load_workload("mt_bench").limited(args.conversations, 2).conversations:
        first = llm.run_batches([llm.chat_prompt(c.messages(0, []))], [params])
        prompt = llm.chat_prompt(c.messages(1, [first.outputs[0].text]))
        warm = llm.run_batches([prompt], [params])
        llm.forget_prefixes()
        cold = llm.run_batches([prompt], [params])
        same = warm.outputs[0].choices[0].token_ids == cold.outputs[0].choices[0].token_ids
        print(f"turn 1: {first.stats.prompt_tokens} prompt tokens ({first.stats.cached_prompt_tokens} cached); "
              f"turn 2: {len(prompt)}, {warm.stats.cached_prompt_tokens} cached, prefill "
              f"{warm.stats.prefill_seconds:.3f} s against {cold.stats.prefill_seconds:.3f} s cold; same: {same}"
              + (f"; drafting {warm.stats.draft_seconds:.3f} s against {cold.stats.draft_seconds:.3f} s cold, "
                 f"decode {warm.stats.seconds - warm.stats.prefill_seconds:.3f} s against "
                 f"{cold.stats.seconds - cold.stats.prefill_seconds:.3f} s" if spec else ""))


if __name__ == "__main__":
    main()
