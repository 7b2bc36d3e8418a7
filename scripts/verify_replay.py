"""Greedy verify passes with and without the LM head's path pruning (``Runner.run(path_only=)``), replayed in one
process: a drafter's real verify passes are recorded while it generates, then each is run again both ways on the same
cache, alternated round by round (``bench.passes.alternated``), with the rows the walk reached (and how many of them
got another argmax than the whole head gives: 0, or the pruning is wrong).

    python scripts/verify_replay.py --model qwen2.5-coder-1.5b --spec-type draft-model \\
        --draft-model qwen2.5-coder-0.5b --workloads mt_bench,qa --prompts 4 --tokens 96
"""

from __future__ import annotations

import argparse

import numpy as np

from specdec.bench.machine import cpu_info
from specdec.bench.passes import alternated
from specdec.bench.workloads import first_turns
from specdec.cli.args import add_model_args, add_spec_args, model_options, spec_from_args
from specdec.config import SamplingParams
from specdec.llm import LLM
from specdec.runners.base import SeqInput


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(ap)
    add_spec_args(ap)
    ap.add_argument("--workloads", default="mt_bench,qa")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    llm = LLM(args.model, spec=spec_from_args(args), **model_options(args))
    runner = llm.runner
    prompts = [llm.chat_prompt(m) for m in first_turns(args.workloads.split(","), args.prompts)]
    params = SamplingParams(max_new_tokens=args.tokens, temperature=0.0)
    llm.warmup()
    recorded: list[tuple[int, list[int], list[int] | None]] = []  # (start, tokens, parents) of each verify pass
    run = runner.run

    def recording(seqs, *a, **kw):
        if kw.get("path_only") and len(seqs) == 1 and len(seqs[0].token_ids) > 1:
            s = seqs[0]
            recorded.append((runner.lengths[s.slot], list(s.token_ids), s.parents))
        return run(seqs, *a, **kw)

    runner.run = recording
    outputs = []
    for p in prompts:
        before = len(recorded)
        out = llm.generate([p], params)[0]
        outputs.append((p + out.token_ids, recorded[before:]))
    runner.run = run
    slot = runner.allocate()
    whole: dict[bool, float] = {False: 0.0, True: 0.0}
    rows = reached = differ = 0  # rows, rows the walk reached, those whose argmax differs from the whole head's
    for tokens, passes in outputs:
        runner.truncate(slot, 0)
        runner.run([SeqInput(slot, tokens, all_logits=False)])
        for start, new, parents in reversed(passes):  # each replay writes past its start: the latest first
            seq = SeqInput(slot, new, parents)

            def verify(path_only: bool, seq: SeqInput = seq, start: int = start) -> np.ndarray:
                runner.truncate(slot, start)
                return runner.run([seq], argmax=True, path_only=path_only).argmax[0].numpy()

            for k, v in alternated({False: lambda: verify(False), True: lambda: verify(True)}, args.rounds).items():
                whole[k] += v
            rows += len(new)
            path, every = verify(True), verify(False)
            kept = path >= 0
            reached += int(kept.sum())
            differ += int((path[kept] != every[kept]).sum())
    cpu = cpu_info()
    n = sum(len(p) for _, p in outputs)
    print(f"# {cpu['cpu']}, {cpu['cores']} cores, SIMD {cpu['simd']}; {llm.model_name}, {runner.weights_label}; "
          f"--spec-type {args.spec_type or 'default'}, {len(prompts)} prompts x <= {args.tokens} tokens, greedy")
    every, path = (1e3 * whole[k] / max(n, 1) for k in (False, True))
    print(f"{n} verify passes, {rows / max(n, 1):.2f} rows a pass, {reached / max(rows, 1):.0%} of rows reached; "
          f"every row {every:.2f} ms a pass, path only {path:.2f} ms: "
          f"{whole[True] / max(whole[False], 1e-9):.3f}; {differ} reached rows' argmax differ from the whole head's")


if __name__ == "__main__":
    main()
