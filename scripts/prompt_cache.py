"""A second turn's prefill with the first turn's K/V kept in the slot, beside the same prompt cold.

    python scripts/prompt_cache.py [--model qwen2.5-coder-1.5b] [--conversations 3]

The first MT-bench conversations: turn 1 (64 greedy tokens), then turn 2 on the same slot (warm: the runner's
``allocate`` finds turn 1's tokens cached), then turn 2 again after ``forget_prefixes`` (cold). Prints the
tokens found cached, both prefills' seconds and whether the two outputs are the same tokens.
"""

from __future__ import annotations

import argparse

from specdec.bench.report import cpu_info
from specdec.bench.workloads import load_workload
from specdec.config import SamplingParams
from specdec.llm import LLM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--conversations", type=int, default=3)
    args = ap.parse_args()
    llm = LLM(args.model)
    params = SamplingParams(max_new_tokens=64)
    cpu = cpu_info()
    print(f"# {cpu['cpu']}, {cpu['cores']} cores, SIMD {cpu['simd']}; {llm.model_name}, {llm.runner.weights_label}")
    for c in load_workload("mt_bench").limited(args.conversations, 2).conversations:
        first = llm.run_batches([llm.chat_prompt(c.messages(0, []))], [params])
        prompt = llm.chat_prompt(c.messages(1, [first.outputs[0].text]))
        warm = llm.run_batches([prompt], [params])
        llm.runner.forget_prefixes()
        cold = llm.run_batches([prompt], [params])
        same = warm.outputs[0].choices[0].token_ids == cold.outputs[0].choices[0].token_ids
        print(f"turn 1: {first.stats.prompt_tokens} prompt tokens ({first.stats.cached_prompt_tokens} cached); "
              f"turn 2: {len(prompt)}, {warm.stats.cached_prompt_tokens} cached, prefill "
              f"{warm.stats.prefill_seconds:.3f} s against {cold.stats.prefill_seconds:.3f} s cold; same: {same}")


if __name__ == "__main__":
    main()
