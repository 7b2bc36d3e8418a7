"""Whole passes with two weight layouts, alternated in one process (the order rotated every round).

``--compare groups``: the 32-value types in 8-row groups against 16-row ones (AVX-512's). The model is loaded twice:
once as the kernels pack it here, once with the 32-value layouts (Q8_0, Q5_0, Q4_0, Q4_1) left 8 rows wide
(``quant.WIDE`` narrowed while that copy loads; the K-quant layouts 16 wide in both).

``--compare padding``: the fused q/k/v matrix's rows each at their own layout's bytes (``quant.segmented``) against
every row padded to the widest, as they were stored before (a Q4_K group of Qwen2.5-Coder's mixed Q4_K/Q6_K layers
then left 5,952 bytes unread behind it); one model, the padded copy of its q/k/v stack built here.

Every pass runs over the same 300-token context; two copies in one process see the same memory speed, which on a VM
moves between processes:

    python scripts/layout_passes.py --model qwen2.5-coder-0.5b --widths 1,2,4,8 --rounds 15
    python scripts/layout_passes.py --compare padding --model qwen2.5-coder-1.5b --widths 1,2,8 --rounds 21
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import torch

from specdec.bench.passes import alternated, probe_tokens, synthetic_context
from specdec.model import quant
from specdec.runners.base import SeqInput
from specdec.runners.load import load_runner


def padded(stack: quant.QuantStack) -> quant.QuantStack:
    """``stack`` with every layer's rows at its widest row's bytes (a group's bytes at the head of its rows' run)."""
    layers, rows = stack.fmt.shape
    pieces, segments = [], np.zeros_like(stack.segments)
    segments[:, :, 0] = rows
    for layer in range(layers):
        arrays = quant.stack_layer(stack, layer)
        used = arrays.segments[arrays.segments[:, 0] < rows]
        width = int(used[:, 2].max())
        q = np.zeros((rows, width), dtype=np.uint8)
        for (first, at, per_row), end in zip(used, [*used[1:, 0], rows], strict=True):
            group = quant.GROUP_ROWS.get(int(arrays.fmt[first]), 1)
            run = arrays.q[at : at + (end - first) * per_row].reshape(-1, group * per_row)
            q[first:end].reshape(-1, group * width)[:, : group * per_row] = run
        pieces.append(q.reshape(-1))
        segments[layer, 0] = (0, 0, width)
    at = np.concatenate([[0], np.cumsum([p.size for p in pieces])]).astype(np.int64)
    return stack._replace(q=np.concatenate(pieces), at=at, segments=segments)


def load_copies(model: str, compare: str) -> dict[str, tuple]:
    """name -> (runner, its fused pass) for each layout."""
    if compare == "padding":
        runner, _ = load_runner(model)
        fused = runner.fused
        wqkv = padded(fused.weights.wqkv)
        print(f"{model}: q/k/v {fused.weights.wqkv.q.nbytes / 1e6:.1f} MB packed, {wqkv.q.nbytes / 1e6:.1f} MB padded")
        return {"packed": (runner, fused),
                "padded": (runner, dataclasses.replace(fused, weights=fused.weights._replace(wqkv=wqkv)))}
    wide = dict(quant.WIDE)
    k_quant_only = {narrow: wider for narrow, wider in wide.items() if narrow in (quant.Q4KX8, quant.Q6KX8)}
    copies = {}
    for name, layouts in (("8-row", k_quant_only), ("16-row", wide)):
        quant.WIDE.clear()
        quant.WIDE.update(layouts)
        try:
            runner, _ = load_runner(model)
        finally:
            quant.WIDE.clear()
            quant.WIDE.update(wide)
        copies[name] = (runner, runner.fused)
    return copies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", choices=("groups", "padding"), default="groups")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--widths", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    copies = load_copies(args.model, args.compare)
    slots = {}  # a runner's slot, its context cached
    for runner, _ in copies.values():
        if id(runner) not in slots:
            slots[id(runner)] = runner.allocate()
            runner.run([SeqInput(slots[id(runner)], synthetic_context(runner, 300), all_logits=False)])

    def one_pass(name: str, width: int) -> torch.Tensor:
        runner, fused = copies[name]
        runner.fused = fused
        logits = runner.run([SeqInput(slots[id(runner)], probe_tokens(runner, width))]).logits[0]
        runner.truncate(slots[id(runner)], 300)
        return logits

    print(f"{args.model}, --compare {args.compare}: medians of {args.rounds} passes (ms)")
    for w in widths:
        first, *others = copies
        if args.compare == "padding":  # the same weights' bits in either layout
            assert all(torch.equal(one_pass(first, w), one_pass(n, w)) for n in others)
        med = alternated({n: (lambda n=n, w=w: one_pass(n, w)) for n in copies}, args.rounds)
        print(f"{w} token(s): " + "  ".join(f"{n} {1e3 * t:.2f}" for n, t in med.items())
              + "  " + "  ".join(f"{n}/{first} {med[n] / med[first]:.3f}" for n in others))


if __name__ == "__main__":
    main()
