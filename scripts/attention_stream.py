"""How fast a pass's attention streams the KV cache, by context length and pass width, with the cache on
the pages it gets (``cache.zeros``: numpy's memory, transparent huge pages) against the same cache on
torch's allocator (4 KiB pages), alternated in one process.

    python scripts/attention_stream.py [--model qwen2.5-coder-1.5b] [--contexts 300,1000,2000] [--widths 1,8]

Every layer's attention of one pass (random queries against the cached context: each layer reads its own
keys and values, as a pass does), timed over all layers, median of 31 alternated rounds, per layer.
"""

from __future__ import annotations

import argparse
from functools import partial

import numpy as np
import torch
from numba import njit

from specdec.bench.machine import cpu_info
from specdec.bench.passes import alternated, synthetic_context
from specdec.cache import zeros
from specdec.model import clib, decoder_kernels, kernels
from specdec.model.kernels import _FLAGS
from specdec.runners.base import SeqInput
from specdec.runners.load import load_runner


@njit(**_FLAGS)
def every_layer(q, k_cache, v_cache, rows, scale, out):  # pragma: no cover - compiled
    slots, positions, _, seq_rows, mask, _ = rows
    for layer in range(k_cache.shape[0]):
        decoder_kernels.attention(q, k_cache[layer], v_cache[layer], slots, positions, seq_rows, mask, 0, scale, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--contexts", default="300,1000,2000")
    ap.add_argument("--widths", default="1,8")
    ap.add_argument("--rounds", type=int, default=31)
    args = ap.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    runner, _ = load_runner(args.model, max_seq_len=max(contexts) + 64)
    c, arch = runner.config, runner.fused.arch
    cpu = cpu_info()
    print(f"# {cpu['cpu']}, {cpu['cores']} cores, kernels {clib.isa()}; {args.model}, KV {runner.cache.k_all.dtype}")
    print("| context | rows | torch's pages (us a layer) | the cache's (us a layer) | ratio |")
    print("|---:|---:|---:|---:|---:|")
    rng = np.random.default_rng(0)
    for context in contexts:
        slot = runner.allocate()
        runner.run([SeqInput(slot, synthetic_context(runner, context), all_logits=False)])
        k, v = runner.cache.k_all, runner.cache.v_all
        caches = {
            "torch": (torch.zeros(k.shape, dtype=k.dtype).copy_(k), torch.zeros(v.shape, dtype=v.dtype).copy_(v)),
            "cache": (zeros(k.shape, k.dtype, k.device).copy_(k), zeros(v.shape, v.dtype, v.device).copy_(v)),
        }
        for width in [int(w) for w in args.widths.split(",")]:
            passed = runner._make_rows([SeqInput(slot, [1] * width)])
            rows = decoder_kernels.row_layout(passed.seqs, passed.parents, passed.kv_len)
            q = rng.standard_normal((width, c.num_heads, c.head_dim)).astype(np.float32)
            out = np.empty_like(q)
            calls = {name: partial(every_layer, q, kernels.as_numpy(kc), kernels.as_numpy(vc), rows, arch.scale, out)
                     for name, (kc, vc) in caches.items()}
            med = alternated(calls, args.rounds)
            t, h = (med[n] / c.num_layers * 1e6 for n in ("torch", "cache"))
            print(f"| {context} | {width} | {t:.1f} | {h:.1f} | {h / t:.2f} |")
        runner.free(slot)


if __name__ == "__main__":
    main()
