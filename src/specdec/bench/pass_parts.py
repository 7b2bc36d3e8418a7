"""Where a fused pass goes: its parts replayed alone, with the pass's own weights and shapes.

The fused kernel runs a whole pass as one compiled call, so it cannot be timed from inside
without slowing it. Instead each part is run by itself on the same arrays: every layer's
products of one matrix kind (q/k/v, output, gate/up, down), attention over the cached
context, and the LM head; ``rest`` is the measured pass minus their sum (norms, rope,
activations, the cache writes, the embedding look-up, Python and thread start-up).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from specdec.model import decoder_kernels, kernels, quant
from specdec.runners.base import SeqInput
from specdec.runners.native import NativeRunner

KINDS = ("wqkv", "wo", "w_gate_up", "w_down")


def _layer_matrix(stack, layer: int):
    """One layer's matrix of a fused stack: float [rows, k], or the (q, s, m, fmt) of ``quant.stack``."""
    return quant.stack_layer(stack, layer) if isinstance(stack, quant.QuantStack) else stack[layer]


def _product(w, x: np.ndarray, out: np.ndarray) -> None:
    if isinstance(w, quant.QuantArrays):
        kernels.qmatmul(*w, x, out)
    else:
        kernels.matmul(w, x, out)


def _rows(stack) -> int:
    """Output rows of a fused stack's matrices."""
    return stack.fmt.shape[1] if isinstance(stack, quant.QuantStack) else stack.shape[1]


def part_costs(runner: NativeRunner, slot: int, width: int, rounds: int) -> dict[str, float]:
    """Median seconds of each part of a ``width``-row pass of ``slot`` (its cache as it is now)."""
    f, c = runner.fused, runner.config
    rng = np.random.default_rng(0)
    parts: dict[str, list[float]] = {name: [] for name in (*KINDS, "attention", "lm_head")}
    passed = runner._make_rows([SeqInput(slot, [1] * width)])
    rows = decoder_kernels.row_layout(passed.seqs, passed.parents, passed.kv_len)
    k_cache, v_cache = kernels.as_numpy(runner.cache.k_all), kernels.as_numpy(runner.cache.v_all)
    q = rng.standard_normal((width, c.num_heads, c.head_dim)).astype(np.float32)
    attn = np.empty_like(q)
    head = f.head
    normed = rng.standard_normal((width, c.hidden_size)).astype(np.float32)
    logits = np.empty((width, c.vocab_size), dtype=np.float32)
    layers = [[_layer_matrix(getattr(f.weights, kind), i) for i in range(c.num_layers)] for kind in KINDS]
    inputs = (c.hidden_size, c.num_heads * c.head_dim, c.hidden_size, _rows(f.weights.w_gate_up) // 2)
    xs = [rng.standard_normal((width, k)).astype(np.float32) for k in inputs]
    outs = [np.empty((width, _rows(getattr(f.weights, kind))), dtype=np.float32) for kind in KINDS]
    for r in range(rounds + 1):  # the first round warms up (compiles, faults pages in)
        for kind, ws, x, out in zip(KINDS, layers, xs, outs, strict=True):
            t0 = time.perf_counter()
            for w in ws:
                _product(w, x, out)
            if r:
                parts[kind].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for layer in range(c.num_layers):
            window = f.arch.window if f.arch.sliding[layer] else 0
            decoder_kernels.attention(q, k_cache[layer], v_cache[layer], rows.slots, rows.positions,
                                      rows.seq_rows, rows.mask, window, f.arch.scale, attn)
        if r:
            parts["attention"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        _product(head, normed, logits)
        if r:
            parts["lm_head"].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in parts.items()}
