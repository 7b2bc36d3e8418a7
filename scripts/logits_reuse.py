"""Whole passes with the fused pass's logits array kept for the next pass (``fused._Spare``) or fresh each pass,
alternated in one process.

    python scripts/logits_reuse.py [--model qwen2.5-coder-1.5b] [--widths 1,4,8,16] [--rounds 30]

After a 300-token context, each round runs every width's pass both ways in turn (``bench.passes.alternated``)
and prints the medians and their ratio. A fresh array of a few MB is a fresh mmap whose pages the LM head's first
writes fault in (``perf stat -e page-faults -p PID`` on this loop counts them).
"""

from __future__ import annotations

import argparse
from functools import partial

from specdec.bench.machine import cpu_info
from specdec.bench.passes import alternated, probe_tokens, synthetic_context
from specdec.llm import LLM
from specdec.model import clib, fused
from specdec.runners.base import SeqInput


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--widths", default="1,4,8,16")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    runner = LLM(args.model, spec="none", max_model_len=600).runner
    slot = runner.allocate()
    runner.run([SeqInput(slot, synthetic_context(runner, 300), all_logits=False)])
    probe = probe_tokens(runner, max(widths))
    kept_bytes, spare = fused._SPARE_BYTES, runner.fused.spare
    parked: list = []  # the kept array while the fresh way runs (no other reference: it is taken again after)

    def one_pass(way: str, width: int) -> None:
        if way == "fresh" and fused._SPARE_BYTES:
            fused._SPARE_BYTES = 0
            parked.append(spare.array)
            spare.array = None
        elif way == "kept" and not fused._SPARE_BYTES:
            fused._SPARE_BYTES = kept_bytes
            spare.array = parked.pop() if parked else None
        runner.run([SeqInput(slot, probe[:width])])
        runner.truncate(slot, 300)

    calls = {(way, w): partial(one_pass, way, w) for w in widths for way in ("fresh", "kept")}
    seconds = alternated(calls, args.rounds)
    fused._SPARE_BYTES = kept_bytes
    cpu = cpu_info()
    print(f"{args.model}, kernels {clib.isa()}; CPU {cpu['cpu']} ({cpu['cores']} cores, {cpu['simd']})")
    for w in widths:
        fresh, kept = seconds[("fresh", w)], seconds[("kept", w)]
        print(f"{w} tokens: fresh {1e3 * fresh:.1f} ms, kept {1e3 * kept:.1f} ms, fresh / kept {fresh / kept:.3f}")


if __name__ == "__main__":
    main()
