"""What the default `adaptive` costs where nothing it drafts is kept: plain vs adaptive, sampled, equal lengths.

    python scripts/adaptive_vs_plain.py [--batch-sizes 1,4,16] [--rounds 3] [--temperature 1]

Each chunk of B prompts (creative + MT-bench, 16 in all, first turn, 128 tokens, EOS ignored so both
sides generate the same number of tokens) runs plain, adaptive, adaptive, plain: on a VM whose speed
drifts by +-10% over minutes, a cell timed once per method (`specdec bench`) cannot resolve a 3%
difference; interleaved runs of the same chunk can. Every run starts with the drafters' shared state
empty (the suffix cache learns nothing from an earlier run of the same prompts).

Prints the ratio per batch size; what each method's run spent outside the passes (prompt and decode), per
decode pass (sampling, drafting, the engine's own work); and for adaptive where its decode passes
went: passes by extra rows (drafted tokens verified), their seconds and mean ms, so the cost of verifying
rejected drafts is read off directly.
"""

from __future__ import annotations

import argparse
import collections
import time

from specdec.bench.machine import cpu_info
from specdec.bench.workloads import load_workload
from specdec.config import SamplingParams
from specdec.llm import LLM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch-sizes", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    llm = LLM(args.model, spec="adaptive", max_num_seqs=max(sizes))
    prompts = [llm.chat_prompt(c.messages(0, [])) for name in ("creative", "mt_bench")
               for c in load_workload(name).conversations][:16]
    passes: list[tuple[int, int, float]] = []  # (sequences, rows, seconds) of each decode pass
    prefill = [0.0]  # seconds of the prompt passes
    run_pass = llm.runner.run

    def timed_run(seqs, *a, **k):
        out = run_pass(seqs, *a, **k)
        if seqs[0].all_logits:
            passes.append((len(seqs), sum(len(s.token_ids) for s in seqs), out.seconds))
        else:
            prefill[0] += out.seconds
        return out

    llm.runner.run = timed_run
    resources = {}

    def run(spec: str, chunk: list[list[int]], seed: int) -> tuple[float, int]:
        llm.set_spec(spec, resources.get(spec))
        resources[spec] = llm.drafts
        llm.drafts.forget()
        llm.forget_prefixes()  # both methods run the same prompts: each prefills them cold
        seqs = [llm.new_sequence(list(p), SamplingParams(max_new_tokens=args.max_new_tokens,
                                                         temperature=args.temperature, seed=seed + i, ignore_eos=True))
                for i, p in enumerate(chunk)]
        t0 = time.perf_counter()
        llm.engine.run_batch(seqs)
        return time.perf_counter() - t0, sum(len(s.output_ids) for s in seqs)

    cpu = cpu_info()
    print(f"# {cpu['cpu']}, {cpu['cores']} cores, SIMD {cpu['simd']}; model {llm.model_name}, "
          f"weights {llm.runner.weights_label}; T={args.temperature}, {args.max_new_tokens} tokens, EOS ignored")
    llm.warmup()
    for b in sizes:
        run("none", prompts[:b], 0)
        run("adaptive", prompts[:b], 0)
        seconds = {"none": 0.0, "adaptive": 0.0}
        tokens = {"none": 0, "adaptive": 0}
        by_extra: dict[int, list] = collections.defaultdict(lambda: [0, 0.0])
        in_passes = {"none": [0, 0.0], "adaptive": [0, 0.0]}  # decode passes and their seconds
        for r in range(args.rounds):
            for s in range(0, len(prompts), b):
                for spec in ("none", "adaptive", "adaptive", "none"):
                    passes.clear()
                    prefill[0] = 0.0
                    dt, n = run(spec, prompts[s:s + b], 1000 * r + s)
                    seconds[spec] += dt
                    tokens[spec] += n
                    in_passes[spec][0] += len(passes)
                    in_passes[spec][1] += sum(sec for *_, sec in passes) + prefill[0]
                    if spec == "adaptive":
                        for nseq, rows, sec in passes:
                            by_extra[rows - nseq][0] += 1
                            by_extra[rows - nseq][1] += sec
        plain, adaptive = tokens["none"] / seconds["none"], tokens["adaptive"] / seconds["adaptive"]
        print(f"batch {b}: plain {plain:.1f} tok/s, adaptive {adaptive:.1f} tok/s: {adaptive / plain:.3f}x")
        for spec, (n, sec) in in_passes.items():
            print(f"    {spec}: {n} decode passes; the run spent {1e3 * (seconds[spec] - sec) / n:.2f} ms a decode "
                  "pass outside every pass")
        total = sum(v[1] for v in by_extra.values())
        for extra in sorted(by_extra):
            n, sec = by_extra[extra]
            print(f"    adaptive passes with {extra:2d} drafted rows: {n:5d} ({sec / total:6.1%} of pass time, "
                  f"{1e3 * sec / n:.2f} ms each)")


if __name__ == "__main__":
    main()
