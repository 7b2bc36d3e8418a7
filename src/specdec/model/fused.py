"""The fused CPU pass: a model's arrays as ``decoder_kernels.decode_layers`` reads them, and the pass itself.

On the ``cpu-kernels`` backend every decode and verify pass (and a short or quantized
prompt) runs the ragged rows of all its sequences through the whole layer stack in one
compiled call: embedding look-up, ``decode_layers``, the final norm and the LM head.
``FusedDecoder.from_model`` packs the arrays once (views into the model's stacked
weights, small float32 copies of the norms and rope tables); ``forward`` runs a pass.
Which passes go this way is the runner's choice (``runners.native.NativeRunner.run``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np
import torch

from specdec.cache import KVCache
from specdec.config import ModelConfig
from specdec.model import decoder_kernels, kernels
from specdec.model.decoder_kernels import Arch, LayerWeights, RopeTables, Rows
from specdec.model.quant import QuantStack
from specdec.model.transformer import Transformer

# Logits arrays up to this size are kept for the next pass (``_Spare``): 8 rows of a 152K vocabulary are 4.9 MB
_SPARE_BYTES = 64 << 20


class _Spare:
    """A pass's logits array, handed out again by the next pass once nothing else holds it.

    A fresh multi-megabyte array is a fresh mmap from glibc (the same size each pass sits at its
    mmap threshold), so the LM head's first writes page-faulted every page of it in again, every
    pass: 8 rows of Qwen2.5's 151,936 logits, 1,187 pages (`perf record -e page-faults` put them
    all in the LM head's tiles). Reuse needs no caller's cooperation: a logits tensor (or any view
    of it) keeps the array referenced, and then the next pass takes a new one."""

    def __init__(self) -> None:
        self.array: np.ndarray | None = None

    def take(self, rows: int, cols: int) -> np.ndarray:
        a = self.array
        # held by self.array, a and getrefcount's argument: 3 means no tensor or view holds it
        if a is not None and a.shape[0] >= rows and a.shape[1] == cols and sys.getrefcount(a) == 3:
            return a[:rows]
        a = np.empty((rows, cols), dtype=np.float32)
        self.array = a if a.nbytes <= _SPARE_BYTES else None
        return a[:rows]


class _CacheArrays:
    """A KV cache's NumPy views (``kernels.as_numpy``), made for the first pass over it: three tensor calls a cache
    each pass took ~80 us with the caches cold (Zen 4)."""

    def __init__(self) -> None:
        self.cache: KVCache | None = None
        self.arrays: tuple[np.ndarray, np.ndarray] = ()

    def of(self, cache: KVCache) -> tuple[np.ndarray, np.ndarray]:
        if cache is not self.cache:  # a cache's tensors live as long as it does
            self.cache, self.arrays = cache, (kernels.as_numpy(cache.k_all), kernels.as_numpy(cache.v_all))
        return self.arrays


# fused_pass's softmax (inv_t, top, sums) where no row's blocks are wanted
NO_SOFTMAX = (np.empty(0, dtype=np.float32), np.empty((0, 0), dtype=np.float32), np.empty((0, 0), dtype=np.float32))


@dataclass(frozen=True, eq=False)  # arrays: identity, not value, equality
class FusedDecoder:
    """A ``Transformer``'s fused path, built once: its layer stack as ``decode_layers``' groups."""

    model: Transformer  # which layers a pass runs
    embed: np.ndarray | tuple[np.ndarray, ...]  # [V, H] float, or a QuantMatrix's arrays
    embed_scale: np.float32  # the embedding's scale (sqrt(H) as the embedding's type rounds it), or 0
    weights: LayerWeights
    rope: RopeTables
    arch: Arch
    final_norm: np.ndarray  # [H] float32
    head: np.ndarray | tuple[np.ndarray, ...]  # [V, H] float, or a QuantMatrix's arrays
    spare: _Spare = field(default_factory=_Spare, repr=False)  # the last pass's logits array
    # made once, where each pass made them anew with the caches cold: fused_pass's static arrays (``arrays``),
    # run_mask(None); the hidden_at, hidden of a pass keeping none; the logits of an argmax pass (none); the cache's
    # arrays (``_CacheArrays``)
    arrays: tuple = field(init=False, repr=False)
    every_layer: np.ndarray = field(init=False, repr=False)
    no_hidden: tuple[np.ndarray, np.ndarray] = field(init=False, repr=False)
    no_logits: np.ndarray = field(init=False, repr=False)
    cache_arrays: _CacheArrays = field(default_factory=lambda: _CacheArrays(), repr=False)

    def __post_init__(self) -> None:
        c = self.model.config
        arrays = (self.embed, self.embed_scale, self.arch.eps, self.weights, self.rope, self.arch, self.final_norm,
                  self.head)
        object.__setattr__(self, "arrays", decoder_kernels.plain(arrays))
        object.__setattr__(self, "every_layer", self.model.run_mask(None))
        object.__setattr__(self, "no_hidden", (np.full(c.num_layers, -1, dtype=np.int64),
                                               np.empty((1, 1, c.hidden_size), dtype=np.float32)))
        object.__setattr__(self, "no_logits", np.empty((0, c.vocab_size), dtype=np.float32))

    @classmethod
    def from_model(cls, model: Transformer) -> FusedDecoder:
        c, layers = model.config, model.layers
        f32 = lambda t: t.float().contiguous().numpy()  # noqa: E731 - norms are tiny: keep float32 copies
        zeros_h = torch.zeros(c.hidden_size)
        norms = torch.stack([
            torch.stack([layer.attn_norm, layer.mlp_norm,
                         getattr(layer, "post_attn_norm", zeros_h), getattr(layer, "post_mlp_norm", zeros_h)])
            for layer in layers
        ])
        zeros_d = torch.zeros(c.head_dim)
        qk = torch.stack([torch.stack([getattr(layer, "q_norm", zeros_d), getattr(layer, "k_norm", zeros_d)])
                          for layer in layers])
        q_out = layers[0].q_size + 2 * layers[0].kv_size
        bias = torch.stack([layer.bqkv if layer.bqkv is not None else torch.zeros(q_out) for layer in layers])
        stacked = {name: w if isinstance(w, QuantStack) else kernels.as_numpy(w) for name, w in model.stacked.items()}
        rope_local = model.rope_local if model.rope_local is not None else model.rope
        head, embed = model.quantized.get("lm_head"), model.quantized.get("embed")
        dtype = model.embed.dtype if model.embed is not None else torch.float32
        return cls(
            model=model,
            embed=embed.arrays() if embed is not None else kernels.as_numpy(model.embed.contiguous()),
            embed_scale=np.float32(torch.tensor(c.hidden_size**0.5, dtype=dtype).item() if c.embed_scale else 0),
            weights=LayerWeights(
                wqkv=stacked["wqkv"], bqkv=f32(bias), wo=stacked["wo"], w_gate_up=stacked["w_gate_up"],
                w_down=stacked["w_down"], norms=f32(norms), qk_norms=f32(qk),
            ),
            rope=RopeTables(cos=f32(model.rope.real), sin=f32(model.rope.imag), cos_local=f32(rope_local.real),
                            sin_local=f32(rope_local.imag)),
            arch=_arch(c, model),
            final_norm=f32(model.norm),
            head=head.arrays() if head is not None else kernels.as_numpy(model.lm_head.contiguous()),
        )

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    def forward(
        self, rows: Rows, cache: KVCache, logits_rows: np.ndarray | None = None, hidden_layers: tuple[int, ...] = (),
        layers: tuple[int, ...] | None = None, softmax: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Rows [N] -> logits [N or len(logits_rows), V] float32, writing their K/V into ``cache``.

        Hidden states and ``layers`` as in ``Transformer.forward``, per row: [N, H] float32 each.
        softmax: (inv_t, top, sums) to fill (``kernels.softmax_blocks``; ``has_blocks``): each logits row's 64-column
        blocks' maxima and sums of terms, where its inverse temperature inv_t asks (> 0), written by the LM head's
        sweep.
        """
        n = rows.ids.shape[0]
        head_rows = np.arange(n, dtype=np.int64) if logits_rows is None else logits_rows.astype(np.int64)
        logits = self.spare.take(head_rows.shape[0], self.config.vocab_size)
        out_hidden = self._pass(rows, cache, hidden_layers, layers, head_rows, _NO_BEST, logits,
                                softmax=NO_SOFTMAX if softmax is None else softmax)
        out = torch.from_numpy(logits)
        if self.config.final_logit_softcapping:
            cap = self.config.final_logit_softcapping
            out = torch.tanh(out / cap) * cap
        return out, out_hidden

    @property
    def has_argmax(self) -> bool:
        """Whether ``forward_argmax`` gives what ``forward``'s logits' argmax would: not under a soft cap,
        whose tanh can round two logits to one value and so move a tie."""
        return not self.config.final_logit_softcapping

    @property
    def has_blocks(self) -> bool:
        """Whether ``forward``'s softmax blocks are those of the logits it returns: not under a soft cap (applied
        after the pass)."""
        return not self.config.final_logit_softcapping

    def forward_argmax(
        self, rows: Rows, cache: KVCache, hidden_layers: tuple[int, ...] = (), layers: tuple[int, ...] | None = None,
        path_only: bool = False,
    ) -> tuple[np.ndarray, list[torch.Tensor]]:
        """``forward``, but each row's argmax [N] int64 (NumPy) in place of its logits: a quantized head keeps
        only its chunks' row maxima (``kernels.qmatmul_argmax``), never the [N, V] floats. ``path_only``: only the
        rows greedy verification can reach (``runners.base.Runner.run``), the others -1 where left out."""
        n = rows.ids.shape[0]
        best = np.empty(n, dtype=np.int64)
        out_hidden = self._pass(rows, cache, hidden_layers, layers, np.arange(n, dtype=np.int64), best, self.no_logits,
                                path_only)
        return best, out_hidden

    def _pass(self, rows: Rows, cache: KVCache, hidden_layers: tuple[int, ...], layers: tuple[int, ...] | None,
              head_rows: np.ndarray, best: np.ndarray, logits: np.ndarray,
              path_only: bool = False, softmax: tuple = NO_SOFTMAX) -> list[torch.Tensor]:
        """The pass (``decoder_kernels.fused_pass``): the LM head's argmaxes into best, or where best is empty its
        logits into logits (and their softmax blocks into softmax's), over rows head_rows; returns the hidden states
        asked for."""
        n, c = rows.ids.shape[0], self.config
        kept = sorted(i for i in hidden_layers if i >= 0)  # layer order, as forward
        if hidden_layers:
            hidden_at = np.full(c.num_layers, -1, dtype=np.int64)
            hidden_at[kept] = np.arange(len(kept))
            hidden = np.empty((max(1, len(kept)), n, c.hidden_size), dtype=np.float32)
        else:
            hidden_at, hidden = self.no_hidden
        normed = np.empty((n, c.hidden_size), dtype=np.float32)
        decoder_kernels.fused_pass(
            rows.ids, rows.seqs, rows.parents, rows.kv_len, self.arrays, *self.cache_arrays.of(cache),
            self.every_layer if layers is None else self.model.run_mask(layers), hidden_at, hidden, normed,
            head_rows, best, logits, path_only, softmax,
        )
        if not hidden_layers:
            return []
        out_hidden = [torch.from_numpy(hidden[j]) for j in range(len(kept))]
        if -1 in hidden_layers:
            out_hidden.append(torch.from_numpy(normed))
        return out_hidden


_NO_BEST = np.empty(0, dtype=np.int64)  # fused_pass's best where logits are wanted


def _arch(c: ModelConfig, model: Transformer) -> Arch:
    return Arch(
        sliding=np.array([layer.sliding for layer in model.layers], dtype=np.bool_),
        window=int(c.sliding_window or 0), n_heads=c.num_heads, n_kv=c.num_kv_heads, eps=float(c.rms_norm_eps),
        scale=float(model.scale), has_bias=bool(c.attention_bias), qk_norm=bool(c.qk_norm),
        sandwich=bool(c.sandwich_norm), gelu=c.hidden_act != "silu",
    )
