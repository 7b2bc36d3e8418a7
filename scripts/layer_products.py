"""Each kind of a model's layer products, out of cache and held in L3, beside its 1-token pass and the read
floor, all alternated in one process: how far the 1-row kernels are from streaming their weights.

    python scripts/layer_products.py [--model qwen2.5-coder-1.5b] [--rounds 9] [--rows 1]

Out of cache: every layer's matrix of one kind in turn (28 different matrices for the 1.5B); in L3: the first
layer's matrix as many times. ``--rows`` activation rows (1: a decode step's, 8: a verify pass's), a compiled loop
(no Python between products); medians, with the multiply-adds a second.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from numba import njit

from specdec.bench.machine import cpu_info
from specdec.bench.passes import alternated, floor_reader, probe_tokens, synthetic_context
from specdec.model import clib, quant
from specdec.model.kernels import _FLAGS, layer_weight, product
from specdec.runners.base import SeqInput
from specdec.runners.load import load_runner

KINDS = ("wqkv", "wo", "w_gate_up", "w_down")


@njit(**_FLAGS)
def products(w, x, out, layers):  # pragma: no cover - compiled
    for i in range(layers.shape[0]):
        product(layer_weight(w, layers[i]), x, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--rows", type=int, default=1)
    args = ap.parse_args()
    runner, _ = load_runner(args.model)
    fused, c = runner.fused, runner.config
    slot = runner.allocate()
    runner.run([SeqInput(slot, synthetic_context(runner, 300), all_logits=False)])
    probe = probe_tokens(runner, 1)
    inputs = {"wqkv": c.hidden_size, "wo": c.num_heads * c.head_dim, "w_gate_up": c.hidden_size,
              "w_down": fused.weights.w_gate_up.fmt.shape[1] // 2}
    rng = np.random.default_rng(0)
    every, first = np.arange(c.num_layers), np.zeros(c.num_layers, dtype=np.int64)
    timed, sizes, macs = {}, {}, {}
    for kind in KINDS:
        w = getattr(fused.weights, kind)
        if not isinstance(w, quant.QuantStack):
            raise SystemExit(f"{args.model}: its matrices are not quantized blocks")
        x = rng.standard_normal((args.rows, inputs[kind])).astype(np.float32)
        out = np.empty((args.rows, w.fmt.shape[1]), dtype=np.float32)
        macs[kind] = args.rows * inputs[kind] * w.fmt.shape[1]
        sizes[kind] = sum(a.nbytes for a in quant.stack_layer(w, 0))
        for name, layers in (("cold", every), ("hot", first)):
            timed[f"{kind} {name}"] = lambda w=w, x=x, out=out, layers=layers: products(w, x, out, layers)

    def one_pass():
        runner.run([SeqInput(slot, probe)])
        runner.truncate(slot, 300)

    timed["pass"] = one_pass
    timed["floor"] = floor_reader(runner.weight_bytes(), torch.device("cpu"))
    med = alternated(timed, args.rounds)
    cpu = cpu_info()
    print(f"# {cpu['cpu']}, {cpu['cores']} cores, kernels {clib.isa()}; {args.model}, {runner.weights_label}")
    print(f"1-token pass {med['pass'] * 1e3:.1f} ms, read floor {med['floor'] * 1e3:.1f} ms "
          f"({runner.weight_bytes() / med['floor'] / 1e9:.1f} GB/s): {med['pass'] / med['floor']:.2f}x")
    print(f"| product ({args.rows} rows) | MB a layer | out of cache, us (GB/s, GMAC/s) | in L3, us (GB/s, GMAC/s) |")
    print("|---|---:|---:|---:|")
    for kind in KINDS:
        cold, hot = (med[f"{kind} {n}"] / c.num_layers for n in ("cold", "hot"))
        mb = sizes[kind] / 1e6
        g = macs[kind] / 1e9
        print(f"| {kind} | {mb:.2f} | {cold * 1e6:.1f} ({mb / cold / 1e3:.1f}, {g / cold:.0f}) "
              f"| {hot * 1e6:.1f} ({mb / hot / 1e3:.1f}, {g / hot:.0f}) |")


if __name__ == "__main__":
    main()
