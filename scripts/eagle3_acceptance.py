"""Acceptance of an EAGLE-3 head on held-out prompts: tau, the acceptance rate and acceptance by depth.

    python scripts/eagle3_acceptance.py --head DIR [--prompts scripts/eagle3-heldout.jsonl] [--max-new-tokens 96]
                                      [--shapes chain-3,tree-4x4-7]

Greedy, batch 1, the default model, chat-formatted prompts; the fixed draft shapes below
(the engine's draft planning off, ``Engine(plan_drafts=False)``, so every step drafts the full shape). Each
speculative output is checked token for token against plain decoding. Prints one row per
shape: tau (tokens per target pass), the acceptance rate (kept / drafted), the share of steps whose
draft had its depth-d token accepted, and drafting milliseconds per step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specdec.config import SamplingParams, SpecConfig, SpecType
from specdec.drafters.registry import DraftResources
from specdec.engine import Engine, SequenceState
from specdec.llm import LLM
from specdec.stats import SpecStats

SHAPES = {  # name: (topk, num_steps, num_draft_tokens)
    "chain-3": (1, 3, 3),
    "chain-5": (1, 5, 5),
    "tree-4x4-7": (4, 4, 7),
    "tree-4x5-11": (4, 5, 11),
}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--head", required=True, help="head folder (e.g. tests/heads/SmolLM2-135M-Instruct)")
    p.add_argument("--prompts", default=str(Path(__file__).with_name("eagle3-heldout.jsonl")))
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list from: {', '.join(SHAPES)}")
    args = p.parse_args()
    shapes = {name: SHAPES[name] for name in args.shapes.split(",")}
    llm = LLM(None, max_model_len=2048)
    prompts = [json.loads(line)["prompt"] for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    ids = [llm.chat_prompt([{"role": "user", "content": text}]) for text in prompts]
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    engine = Engine(llm.runner, draft_n_max=16, plan_drafts=False)
    plain = [run(engine, x, params, None).output_ids for x in ids]
    print(f"{len(prompts)} prompts, {sum(map(len, plain))} tokens, head: {args.head}")
    print("| shape | tau | acceptance rate | accepted at depth 1..5 (share of steps) | draft ms / step |")
    print("|---|---:|---:|---|---:|")
    for name, (topk, steps, n) in shapes.items():
        spec = SpecConfig(types=(SpecType.EAGLE3,), spec_model=args.head, eagle_topk=topk, num_steps=steps,
                          num_draft_tokens=n, draft_n_max=n)
        resources = DraftResources(spec, llm.runner, llm.tokenizer)
        total = SpecStats()
        for x, want in zip(ids, plain, strict=True):
            seq = run(engine, x, params, resources.new_drafter())
            if seq.output_ids != want:
                print(f"greedy mismatch with {name}", file=sys.stderr)
                return 1
            total.merge(seq.stats)
        depth = [a / max(total.drafts, 1) for a in total.accepted_per_pos[:5]]
        print(f"| {name} | {total.mean_accepted_len:.2f} | {total.acceptance_rate:.2f} | "
              f"{' / '.join(f'{d:.2f}' for d in depth)} | {1000 * total.draft_seconds / max(total.drafts, 1):.1f} |")
    return 0


def run(engine: Engine, prompt: list[int], params: SamplingParams, drafter) -> SequenceState:
    seq = SequenceState(prompt, params, drafter=drafter)
    for _ in engine.generate(seq):
        pass
    return seq


if __name__ == "__main__":
    sys.exit(main())
