"""How often does speculative greedy output differ from plain greedy output, per dtype?

With torch's kernels (the `torch` backend, what CUDA uses) a K-token
verify pass rounds differently from a 1-token pass, so near-ties can flip,
rarely in float32 and more often in bfloat16; this measures how often, and
where the first difference falls. specdec's CPU kernels (the `cpu-kernels` backend)
compute each row the same way at any pass width, so there it must be 0.

    python scripts/greedy_mismatch.py [--dtypes float32,bfloat16] [--backend cpu-kernels,torch] [--limit 12]
"""

from __future__ import annotations

import argparse
import json
from importlib import resources

from specdec.config import SamplingParams, SpecConfig, parse_spec_types
from specdec.engine import SequenceState
from specdec.llm import LLM


def spec_bench_prompts(limit: int) -> list[str]:
    """The first turn of ``limit`` Spec-Bench dev prompts, spread over the categories."""
    text = resources.files("specdec.bench").joinpath("workloads/spec_bench_dev.jsonl").read_text()
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    step = max(len(rows) // limit, 1)
    return [r["turns"][0] for r in rows[::step][:limit]]


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b) or a[i] != b[i]:
            return i
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--spec-type", default="ngram")
    ap.add_argument("--backend", default="cpu-kernels,torch", help="backends to compare (see specdec.model.backend)")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()
    prompts = spec_bench_prompts(args.limit)
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    print("| dtype | backend | spec type | identical outputs | first difference at (token index) |")
    print("|---|---|---|---|---|")
    for dtype, backend in [(d, b) for d in args.dtypes.split(",") for b in args.backend.split(",")]:
        spec = SpecConfig(types=parse_spec_types(args.spec_type), draft_n_max=8)
        llm = LLM(args.model, dtype=dtype, spec=spec, backend=backend)
        llm.engine.plan_drafts = False  # always draft: the point is to exercise wide passes
        same, where = 0, []
        for text in prompts:
            ids = llm.chat_prompt([{"role": "user", "content": text}])
            outs = []
            for drafter in (None, llm.drafts.new_drafter()):
                seq = SequenceState(ids, params, drafter=drafter)
                for _ in llm.engine.generate(seq):
                    pass
                outs.append(seq.output_ids)
            diff = first_difference(*outs)
            same += diff is None
            if diff is not None:
                where.append(diff)
        print(f"| {dtype} | {backend} | {args.spec_type} | {same}/{len(prompts)} | {sorted(where) or '-'} |",
              flush=True)


if __name__ == "__main__":
    main()
