"""Whole passes with the 32-value types in 8-row groups against 16-row ones (AVX-512's), alternated in one process.

The model is loaded twice: once as the kernels pack it here, once with the 32-value layouts (Q8_0, Q5_0, Q4_0,
Q4_1) left 8 rows wide (``quant.WIDE`` narrowed while that copy loads; the K-quant layouts 16 wide in both). Each
round runs every width's pass on both copies in turn, over the same 300-token context, and the medians are printed.
Two copies in one process see the same memory speed, which on a VM moves between processes:

    python scripts/layout_passes.py --model qwen2.5-coder-0.5b --widths 1,2,4,8 --rounds 15
"""

from __future__ import annotations

import argparse
import statistics
import time

from specdec.bench.passes import probe_tokens, synthetic_context
from specdec.model import quant
from specdec.runners.base import SeqInput
from specdec.runners.load import load_runner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--widths", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    wide = dict(quant.WIDE)
    k_quant_only = {narrow: wider for narrow, wider in wide.items() if narrow in (quant.Q4KX8, quant.Q6KX8)}
    copies = {}
    for name, layouts in (("8-row", k_quant_only), ("16-row", wide)):
        quant.WIDE.clear()
        quant.WIDE.update(layouts)
        try:
            runner, _ = load_runner(args.model)
        finally:
            quant.WIDE.clear()
            quant.WIDE.update(wide)
        slot = runner.allocate()
        runner.run([SeqInput(slot, synthetic_context(runner, 300), all_logits=False)])
        copies[name] = (runner, slot, probe_tokens(runner, max(widths)))
    times: dict[tuple[str, int], list[float]] = {(n, w): [] for n in copies for w in widths}
    for r in range(args.rounds + 1):  # the first round warms up
        for w in widths:
            for name, (runner, slot, probe) in copies.items():
                t0 = time.perf_counter()
                runner.run([SeqInput(slot, probe[:w])])
                seconds = time.perf_counter() - t0
                runner.truncate(slot, 300)
                if r:
                    times[(name, w)].append(seconds)
    print(f"{args.model}, 32-value layouts in 8- and 16-row groups, medians of {args.rounds} passes (ms):")
    for w in widths:
        print(f"{w} token(s): " + "  ".join(f"{n} {1e3 * statistics.median(times[(n, w)]):.2f}" for n in copies))


if __name__ == "__main__":
    main()
