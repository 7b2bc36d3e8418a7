"""What a trained drafter's draft costs: ms per drafting step, sequential EAGLE-3 head vs P-EAGLE vs MTP.

    python scripts/head_draft_cost.py --head H [--parallel-head P] [--mtp-module M] [--k 4] [--prompts 6]

Each configuration drafts on every step (the cost planner off), greedy, on the first turn of
Spec-Bench dev prompts (one per group, 64 tokens); a step's draft seconds are what ``propose``
took: the head's catch-up on the tokens the last verify committed, then its drafting. Rows:

- sequential, 1 token: one head step (catch-up and the first token's logits), the unit;
- sequential, K tokens: the same head unrolled K steps (1 catch-up step + K - 1 expansions);
- parallel, K tokens: one P-EAGLE pass (catch-up rows + K - 1 mask entries);
- draft-mtp, K tokens: the MTP module, K recurrent steps (on its int8 copies, and on float products).

Prints ms per drafting step and its ratio to the unit (issue 26's target: the parallel K <= 1.3x).
Configurations run interleaved, ``--rounds`` times, so a VM's drift hits them alike.
"""

from __future__ import annotations

import argparse

from specdec.bench.machine import cpu_info
from specdec.bench.workloads import SPEC_BENCH_GROUPS, load_workload
from specdec.config import SamplingParams, SpecConfig, SpecType
from specdec.llm import LLM

GROUPS = ("mt_bench", *SPEC_BENCH_GROUPS)  # Spec-Bench's dev groups


def dev_prompts(n: int) -> list[list[dict]]:
    """First turns: the first prompt of each group, then the second of each, ... (n in all)."""
    groups = [load_workload(name).conversations for name in GROUPS]
    order = [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)]
    return [c.messages(0, []) for c in order[:n]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--head", required=True, help="sequential EAGLE-3 head (e.g. tests/heads/SmolLM2-135M-Instruct)")
    ap.add_argument("--parallel-head", default=None, help="P-EAGLE head (specdec train eagle3 --parallel K)")
    ap.add_argument("--mtp-module", default=None, help="MTP module (specdec train mtp)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    k = args.k
    configs = {
        "sequential, 1 token": SpecConfig(types=(SpecType.EAGLE3,), spec_model=args.head, eagle_topk=1, num_steps=1,
                                          num_draft_tokens=1, draft_n_max=1),
        f"sequential, {k} tokens": SpecConfig(types=(SpecType.EAGLE3,), spec_model=args.head, eagle_topk=1,
                                              num_steps=k, num_draft_tokens=k, draft_n_max=k),
    }
    if args.parallel_head:
        configs[f"parallel, {k} tokens"] = SpecConfig(types=(SpecType.EAGLE3,), spec_model=args.parallel_head,
                                                      eagle_topk=1, num_steps=k, num_draft_tokens=k, draft_n_max=k,
                                                      parallel_drafting=True)
    if args.mtp_module:
        for products in ("", ", float products"):
            configs[f"draft-mtp, {k} tokens{products}"] = SpecConfig(types=(SpecType.DRAFT_MTP,),
                                                                     spec_model=args.mtp_module, draft_n_max=k)
    llm = LLM(args.model, plan_drafts=False)
    prompts = [llm.chat_prompt(m) for m in dev_prompts(args.prompts)]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
    cpu = cpu_info()
    print(f"# {cpu['cpu']}, {cpu['cores']} cores, SIMD {cpu['simd']}; model {llm.model_name}, weights "
          f"{llm.runner.weights_label}; {len(prompts)} Spec-Bench dev prompts, greedy, {args.max_new_tokens} tokens")
    llm.warmup()
    totals = {name: [0.0, 0, 0, 0] for name in configs}  # draft seconds, drafting steps, accepted, drafted
    resources: dict = {}
    for _ in range(args.rounds):
        for name, spec in configs.items():
            resources[name] = llm.set_spec(spec, resources.get(name))
            if name.endswith("float products"):
                # the module's float32 torch products, not its int8 copies
                resources[name].state(SpecType.DRAFT_MTP).fast = {}
            for out in llm.generate(prompts, params):
                s = out.stats
                totals[name][0] += s.draft_seconds
                totals[name][1] += s.drafts
                totals[name][2] += s.accepted
                totals[name][3] += s.drafted
    unit = 1e3 * totals["sequential, 1 token"][0] / max(totals["sequential, 1 token"][1], 1)
    print("| drafter | ms per drafting step | x one head step | drafted per step | accepted per step |")
    print("|---|---|---|---|---|")
    for name, (sec, steps, accepted, drafted) in totals.items():
        ms = 1e3 * sec / max(steps, 1)
        per = max(steps, 1)
        print(f"| {name} | {ms:.2f} | {ms / unit:.2f}x | {drafted / per:.2f} | {accepted / per:.2f} |")


if __name__ == "__main__":
    main()
