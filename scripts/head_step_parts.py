"""Where an EAGLE-3 head's draft step goes: each int8 product and the attention, per call, by entries run.

    python scripts/random_heads.py --model qwen2.5-coder-1.5b --out heads     # untrained heads at its shapes
    python scripts/head_step_parts.py --model qwen2.5-coder-1.5b --head heads/seq [--k 1]

Every step drafts (the cost planner off), greedy, on the first turns of Spec-Bench dev prompts
(``head_draft_cost.dev_prompts``). A one-entry call is a steady drafting step; a call over tens or
hundreds of entries is the head's catch-up over a prompt, which ``draft_seconds`` charges to the first draft.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

from head_draft_cost import dev_prompts

from specdec.config import SamplingParams, SpecConfig, SpecType
from specdec.llm import LLM
from specdec.model import eagle_head


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--head", required=True)
    ap.add_argument("--k", type=int, default=1, help="tokens a draft")
    ap.add_argument("--prompts", type=int, default=6)
    args = ap.parse_args()
    calls: dict[str, list[tuple[int, float]]] = defaultdict(list)  # part -> (entries, seconds) a call
    fast, attention = eagle_head.CachedLayer._fast, eagle_head.cached_attention

    def timed_fast(self, name, x):
        t0 = time.perf_counter()
        y = fast(self, name, x)
        calls[name].append((x.reshape(-1, x.shape[-1]).shape[0], time.perf_counter() - t0))
        return y

    def timed_attention(q, *rest):
        t0 = time.perf_counter()
        y = attention(q, *rest)
        calls["attention"].append((q.shape[0], time.perf_counter() - t0))
        return y

    eagle_head.CachedLayer._fast, eagle_head.cached_attention = timed_fast, timed_attention
    spec = SpecConfig(types=(SpecType.EAGLE3,), spec_model=args.head, eagle_topk=1, num_steps=args.k,
                      num_draft_tokens=args.k, draft_n_max=args.k)
    llm = LLM(args.model, plan_drafts=False)
    llm.set_spec(spec)
    prompts = [llm.chat_prompt(m) for m in dev_prompts(args.prompts)]
    llm.generate(prompts[:1], SamplingParams(max_new_tokens=8))  # first calls
    calls.clear()
    outs = llm.generate(prompts, SamplingParams(max_new_tokens=48))
    seconds, steps = sum(o.stats.draft_seconds for o in outs), sum(o.stats.drafts for o in outs)
    print(f"{steps} drafting steps, {1e3 * seconds / max(steps, 1):.2f} ms a step (prompt catch-ups included)")
    print("| part | ms a one-entry call (median) | calls over more entries: total ms |")
    print("|---|---:|---:|")
    for name, seen in calls.items():
        one = [s for n, s in seen if n == 1]
        more = sum(s for n, s in seen if n > 1)
        print(f"| {name} | {1e3 * statistics.median(one) if one else float('nan'):.3f} | {1e3 * more:.1f} |")


if __name__ == "__main__":
    main()
