"""What a decode step spends beside its target pass, by function (cProfile over the engine), and how often
adaptive's look-up members dry-run: counts and profiles, which a VM's drifting clock does not move.

    python scripts/step_work.py [--model qwen2.5-coder-1.5b] [--spec adaptive] [--workloads math_reasoning]
                                [--prompts 3] [--batch 1] [--temperature 0.7] [--tokens 64] [--top-k 40] [--top-p 0.95]
                                [--min-p 0.05] [--rows verifier|tensor] [--draft-model M --draft-vocab-size N]
                                [--top N]

The first ``--prompts`` first-turn prompts of the workloads, in chunks of ``--batch`` sequences (EOS ignored),
after one warm-up chunk; a fresh drafter state for every chunk. docs/performance.md's twenty-third Zen 4 section:
    python scripts/step_work.py --workloads math_reasoning --prompts 4                 # the sampled verify's rows
    python scripts/step_work.py --model smollm2-135m --workloads creative,mt_bench --prompts 16 --batch 4 \\
        --temperature 1 --tokens 128                                                   # the dry runs at T=1
    python scripts/step_work.py --spec draft-model --draft-model qwen2.5-coder-0.5b --draft-vocab-size 16384 \
        --prompts 4                                          # a sampled draft model's work outside its passes
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from specdec import row_dist
from specdec.bench.machine import cpu_info
from specdec.bench.workloads import load_workload
from specdec.config import SamplingParams, SpecConfig, parse_spec_types
from specdec.llm import LLM
from specdec.model.fused import FusedDecoder

# (label, file suffix, function name) of what is reported per step
PARTS = (("target passes", "runners/native.py", "run"), ("verify", "specdec/verify.py", "verify"),
         ("  its rows' p", "specdec/row_dist.py", "row_dist"), ("  draws", "specdec/row_dist.py", "draw"),
         ("drafter propose", "drafters/adaptive.py", "propose"), ("drafter accept", "drafters/adaptive.py", "accept"),
         ("  dry runs", "drafters/adaptive.py", "_dry_run"), ("draft model", "drafters/draft_model.py", "propose"),
         ("  its passes", "drafters/draft_model.py", "_run"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--spec", default="adaptive")
    ap.add_argument("--draft-model", default=None, help="the draft model of --spec draft-model (or adaptive's member)")
    ap.add_argument("--draft-vocab-size", type=int, default=None, help="the draft head's most frequent N tokens")
    ap.add_argument("--workloads", default="math_reasoning")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--min-p", type=float, default=0.0)
    ap.add_argument("--top", type=int, default=0, help="also list the N functions with the most own time")
    ap.add_argument("--rows", choices=("head", "verifier", "tensor"), default="head",
                    help="a sampled row's softmax blocks summed by the LM head's sweep (head), by the verifier from "
                         "the logits (verifier), or the row as torch's softmax (tensor: row_dist.TensorDist)")
    args = ap.parse_args()
    if args.rows == "tensor":
        row_dist._lib = lambda: None
    if args.rows != "head":
        FusedDecoder.has_blocks = property(lambda self: False)
    spec = SpecConfig(types=parse_spec_types(args.spec), draft_model=args.draft_model,
                      draft_vocab_size=args.draft_vocab_size)
    llm = LLM(args.model, spec=spec, max_num_seqs=args.batch)
    prompts = [llm.chat_prompt(c.messages(0, [])) for name in args.workloads.split(",")
               for c in load_workload(name).conversations][: args.prompts]
    drafts = llm.drafts

    def run(chunk: list[list[int]], seed: int) -> None:
        drafts.forget()
        llm.forget_prefixes()
        seqs = [llm.new_sequence(list(p), SamplingParams(max_new_tokens=args.tokens, temperature=args.temperature,
                                                         top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                                                         seed=seed + i, ignore_eos=True))
                for i, p in enumerate(chunk)]
        llm.engine.run_batch(seqs)

    cpu = cpu_info()
    print(f"# {cpu['cpu']}, {cpu['cores']} cores, SIMD {cpu['simd']}; {llm.model_name}, {llm.runner.weights_label}; "
          f"--spec {args.spec}, T={args.temperature} top-k {args.top_k} top-p {args.top_p} min-p {args.min_p}, "
          f"rows by {args.rows}, batch {args.batch}, {len(prompts)} prompts x {args.tokens} "
          "tokens")
    llm.warmup()
    run(prompts[: args.batch], 0)
    profile = cProfile.Profile()
    t0 = time.perf_counter()
    profile.enable()
    for s in range(0, len(prompts), args.batch):
        run(prompts[s : s + args.batch], 100 + s)
    profile.disable()
    seconds = time.perf_counter() - t0
    stats = pstats.Stats(profile).stats  # {(file, line, name): (calls, primitive calls, tottime, cumtime, callers)}

    def cumulative(suffix: str, name: str) -> tuple[int, float]:
        hits = [(v[0], v[3]) for (f, _, n), v in stats.items() if n == name and f.endswith(suffix)]
        return (sum(c for c, _ in hits), sum(t for _, t in hits))

    steps = cumulative("specdec/engine.py", "_plan")[0]  # once per Engine.step (StaticBatch.step is a "step" too)
    print(f"{steps} engine steps in {seconds:.2f} s (under cProfile): {1e3 * seconds / steps:.2f} ms a step")
    for label, suffix, name in PARTS:
        calls, cum = cumulative(suffix, name)
        print(f"{label:16s} {calls:6d} calls  {cum:7.3f} s  {1e3 * cum / steps:6.2f} ms a step")
    passes, drafting = cumulative("drafters/draft_model.py", "_run"), cumulative("drafters/draft_model.py", "propose")
    if passes[0]:  # its q rows and draws (row_dist, shared with the verifier by name) are what its passes leave
        beside = drafting[1] - passes[1]
        print(f"  beside them              {beside:7.3f} s  {1e3 * beside / steps:6.2f} ms a step, "
              f"{1e3 * beside / passes[0]:.2f} ms a draft pass")
    if args.top:
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
