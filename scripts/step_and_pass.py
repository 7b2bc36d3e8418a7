"""A decode step beside its target pass, in wall time (no profiler): plain decoding's step against its pass, or a
drafter's step as pass + drafting, from the engine's own counters (``SpecStats``).

    python scripts/step_and_pass.py --model qwen2.5-coder-1.5b --spec-type none --tokens 200 --ignore-eos
    python scripts/step_and_pass.py --model qwen2.5-coder-1.5b --spec-type draft-model --draft-model smollm2-135m \\
        --spec-draft-vocab slem --spec-draft-n-max 1 --force-drafts

The first-turn prompts of ``--workloads`` (``--prompts`` of them, chat template, greedy unless --temperature), one
at a time after a warm-up prompt; ``--force-drafts`` drafts the full budget every step instead of what the measured
pass costs say pays (``LLM(plan_drafts=False)``), to price a drafter alone.
"""

from __future__ import annotations

import argparse

from specdec.bench.machine import cpu_info
from specdec.bench.workloads import first_turns
from specdec.cli.args import add_model_args, add_spec_args, model_options, spec_from_args
from specdec.config import SamplingParams
from specdec.llm import LLM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(ap)
    add_spec_args(ap)
    ap.add_argument("--workloads", default="mt_bench,qa,math_reasoning")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--force-drafts", action="store_true")
    args = ap.parse_args()
    llm = LLM(args.model, spec=spec_from_args(args), plan_drafts=not args.force_drafts, **model_options(args))
    prompts = [llm.chat_prompt(m) for m in first_turns(args.workloads.split(","), args.prompts)]
    params = SamplingParams(max_new_tokens=args.tokens, temperature=args.temperature, seed=0,
                            ignore_eos=args.ignore_eos)
    llm.warmup()
    llm.generate([prompts[0]], params)
    s = llm.run_batches(prompts, params).stats
    decode = s.seconds - s.prefill_seconds
    target = s.target_seconds - s.prefill_seconds
    cpu = cpu_info()
    print(f"# {cpu['cpu']}, {cpu['cores']} cores, SIMD {cpu['simd']}; {llm.model_name}, {llm.runner.weights_label}; "
          f"--spec-type {args.spec_type or 'default'}, {len(prompts)} prompts x <= {args.tokens} tokens, "
          f"T={args.temperature}")
    print(f"tau {s.decode_tokens / s.decode_passes:.2f}  step {1e3 * decode / s.decode_passes:.1f} ms = target pass "
          f"{1e3 * target / s.decode_passes:.1f} + drafting {1e3 * s.draft_seconds / s.decode_passes:.1f} + the rest; "
          f"step / pass {decode / target:.3f}; {s.decode_tokens / decode:.1f} decode tok/s")


if __name__ == "__main__":
    main()
