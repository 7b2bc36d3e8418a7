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
from specdec.model.decoder_kernels import Arch, LayerWeights, RopeTables, RowLayout
from specdec.model.quant import QuantArrays, QuantStack
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


@dataclass(frozen=True)
class Rows:
    """Inputs of one fused pass: N new tokens of S sequences, sequence by sequence, unpadded.

    input_ids: [N] token ids; layout: where each row sits (cache row, position, cache entry,
    sequence, visible keys).
    """

    input_ids: torch.Tensor
    layout: RowLayout


@dataclass(frozen=True, eq=False)  # arrays: identity, not value, equality
class FusedDecoder:
    """A ``Transformer``'s fused path, built once: its layer stack as ``decode_layers``' groups."""

    model: Transformer  # the embedding look-up and which layers a pass runs
    weights: LayerWeights
    rope: RopeTables
    arch: Arch
    final_norm: np.ndarray  # [H] float32
    head: np.ndarray | tuple[np.ndarray, ...]  # [V, H] float, or a QuantMatrix's arrays
    spare: _Spare = field(default_factory=_Spare, repr=False)  # the last pass's logits array

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
        head = model.quantized.get("lm_head")
        return cls(
            model=model,
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
        layers: tuple[int, ...] | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Rows [N] -> logits [N or len(logits_rows), V] float32, writing their K/V into ``cache``.

        Hidden states and ``layers`` as in ``Transformer.forward``, per row: [N, H] float32 each.
        """
        normed, out_hidden = self._final(rows, cache, hidden_layers, layers)
        if logits_rows is not None:
            normed = np.ascontiguousarray(normed[logits_rows])
        logits = self.spare.take(normed.shape[0], self.config.vocab_size)
        if isinstance(self.head, QuantArrays):
            kernels.qmatmul(*self.head, normed, logits)
        else:
            kernels.matmul(self.head, normed, logits)
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

    def forward_argmax(
        self, rows: Rows, cache: KVCache, hidden_layers: tuple[int, ...] = (), layers: tuple[int, ...] | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``forward``, but each row's argmax [N] int64 in place of its logits: a quantized head keeps
        only its chunks' row maxima (``kernels.qmatmul_argmax``), never the [N, V] floats."""
        normed, out_hidden = self._final(rows, cache, hidden_layers, layers)
        best = np.empty(normed.shape[0], dtype=np.int64)
        if isinstance(self.head, QuantArrays):
            kernels.qmatmul_argmax(*self.head, normed, best)
        else:
            logits = np.empty((normed.shape[0], self.config.vocab_size), dtype=np.float32)
            kernels.matmul(self.head, normed, logits)
            kernels.argmax_rows(logits, best)
        return torch.from_numpy(best), out_hidden

    def _final(self, rows: Rows, cache: KVCache, hidden_layers: tuple[int, ...], layers: tuple[int, ...] | None,
               ) -> tuple[np.ndarray, list[torch.Tensor]]:
        """The layer stack and the final norm: [N, H] normed rows, and the hidden states asked for."""
        c = self.config
        x = self.model.embed_rows(rows.input_ids)  # [N, H]
        if c.embed_scale:
            embed = self.model.embed
            dtype = embed.dtype if embed is not None else torch.float32
            x = x * torch.tensor(c.hidden_size**0.5, dtype=dtype).float()
        xn = x.contiguous().numpy()
        hidden_at = np.full(c.num_layers, -1, dtype=np.int64)
        for j, layer in enumerate(sorted(i for i in hidden_layers if i >= 0)):  # layer order, as forward
            hidden_at[layer] = j
        hidden = np.empty((max(1, int((hidden_at >= 0).sum())), *xn.shape), dtype=np.float32)
        decoder_kernels.decode_layers(
            xn, rows.layout, self.weights, kernels.as_numpy(cache.k_all), kernels.as_numpy(cache.v_all),
            self.rope, self.arch, self.model.run_mask(layers), hidden_at, hidden,
        )
        normed = np.empty_like(xn)
        decoder_kernels.rms_norm_rows(xn, self.final_norm, self.arch.eps, normed)
        out_hidden = [torch.from_numpy(hidden[j]) for j in range(int((hidden_at >= 0).sum()))]
        if -1 in hidden_layers:
            out_hidden.append(torch.from_numpy(normed))
        return normed, out_hidden


def _arch(c: ModelConfig, model: Transformer) -> Arch:
    return Arch(
        sliding=np.array([layer.sliding for layer in model.layers], dtype=np.bool_),
        window=int(c.sliding_window or 0), n_heads=c.num_heads, n_kv=c.num_kv_heads, eps=float(c.rms_norm_eps),
        scale=float(model.scale), has_bias=bool(c.attention_bias), qk_norm=bool(c.qk_norm),
        sandwich=bool(c.sandwich_norm), gelu=c.hidden_act != "silu",
    )
