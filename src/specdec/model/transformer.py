"""One native decoder for the Llama family; Qwen2/3, Mistral, SmolLM2 and Gemma3 are config flags.

Kept lean for CPU decoding, where a 1-token pass is memory-bound and every
small op costs: q/k/v and gate/up projections are fused into one matmul each,
rope is one complex multiply on q and k together (weights are permuted to the
interleaved layout at load time), norms use ``F.rms_norm``, and the attention
mask and rope factors are built once per forward, not per layer.

This module is the torch model: ``forward`` runs a padded [B, T] batch op by op
(prefill, and every pass on the ``torch`` backend). The other way through the same
weights is ``model.fused`` (a ragged list of rows, the whole layer stack in one compiled
call: decode and verify passes on the ``cpu-kernels`` backend); the runner chooses.
Each layer's weights are views into one stacked tensor per kind, which is what
the compiled call reads.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from specdec.cache import KVCache
from specdec.config import ModelConfig
from specdec.errors import ModelLoadError
from specdec.model import kernels, quant
from specdec.model.backend import Backend, Linear
from specdec.model.quant import QuantMatrix, QuantStack
from specdec.model.weight_names import gate_up_block, layer_weights


@dataclass
class Batch:
    """Inputs of one forward pass over B sequences with T new tokens each.

    input_ids:   [B, T] token ids (rows may be padded; pad logits are ignored)
    positions:   [B, T] rope positions (cache length + depth in the draft tree)
    slots:       [B]    cache rows of the sequences
    write_at:    [B, T] cache index written by each token (cache length + t)
    attn_mask:   [B, T, L] bool, True where a query may attend to a cache entry;
                 None means plain causal decoding with every row at the same length
    kv_len:      L, how many cache entries the pass reads (max over rows)
    contiguous:  rows are slots 0..B-1 in order, so the cache can be viewed, not gathered
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    write_at: torch.Tensor
    attn_mask: torch.Tensor | None
    kv_len: int
    contiguous: bool


def _stack(mats: list[torch.Tensor | QuantMatrix]) -> torch.Tensor | QuantStack:
    """Layers' matrices of one kind, stacked: quantized arrays if every layer is, else float."""
    if all(isinstance(m, QuantMatrix) for m in mats):
        return quant.stack(mats)  # type: ignore[arg-type]
    return torch.stack([m if isinstance(m, torch.Tensor) else torch.from_numpy(m.dense()) for m in mats])


def _layer(stacked: torch.Tensor | QuantStack, i: int) -> torch.Tensor | None:
    return None if isinstance(stacked, QuantStack) else stacked[i]  # quantized stacks: read by the fused kernel only


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def rope_table(config: ModelConfig, base: float, max_len: int) -> torch.Tensor:
    """[max_len, head_dim // 2] complex64 rotation factors, llama3 scaling applied."""
    dim = config.head_dim
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "llama3":
        inv_freq = _llama3_scale(inv_freq, scaling)
    elif kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    t = torch.arange(max_len, dtype=torch.float64)
    angles = torch.outer(t, inv_freq).float()
    return torch.polar(torch.ones_like(angles), angles)


def _llama3_scale(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_len = s.get("original_max_position_embeddings", 8192)
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
    return torch.where(is_mid, mid, scaled)


_STACKED = ("wqkv", "wo", "w_gate_up", "w_down")  # per-layer matrices, stacked [num_layers, ...]


class Layer(nn.Module):
    """One decoder layer: views into the model's stacked weights, and their bound products."""

    def __init__(self, config: ModelConfig, index: int, weights: dict[str, torch.Tensor], backend: Backend) -> None:
        super().__init__()
        c = config
        self.index = index
        self.q_size, self.kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.sliding = c.layer_is_sliding(index)
        self.bqkv: torch.Tensor | None = None
        for name, value in weights.items():  # quantized stacks are read by the fused kernel only
            setattr(self, name, nn.Parameter(value, requires_grad=False) if isinstance(value, torch.Tensor) else None)
        if any(getattr(self, name) is None for name in _STACKED):
            return  # no op-by-op products over quantized weights: every pass is fused
        self.qkv: Linear = backend.linear(self.wqkv, self.bqkv)
        self.o: Linear = backend.linear(self.wo)
        self.gate_up: Linear = backend.linear(self.w_gate_up)
        self.down: Linear = backend.linear(self.w_down)


class Transformer(nn.Module):
    """The decoder, built from converted weights (``weights.load_state_dict``) and a backend.

    Matrices may be GGUF blocks (``QuantMatrix``, from ``gguf_weights``): then every pass runs
    fused (``model.fused``) on the integer-dot kernels, and ``forward`` is unavailable.
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor | QuantMatrix],
        backend: Backend,
        max_seq_len: int,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__()
        c = self.config = config
        self.backend = backend
        # ``weights`` is consumed (emptied as the stacks are built): a caller's reference to it must
        # not keep every per-layer matrix alive beside the stacks
        for k, v in weights.items():
            if isinstance(v, torch.Tensor):
                weights[k] = v.to(device)
        self._check_names(weights)
        # what passes multiply by, interleaved once (an untied embedding is only looked up), a matrix a thread: the
        # C packers (quant._pack) release the GIL (with NumPy packing every type, Qwen2.5-Coder-1.5B's 198 matrices
        # took 2.7 s on two threads against 6.3 s on one; Zen 4)
        packs = [k for k, v in weights.items()
                 if isinstance(v, QuantMatrix) and (k != "embed" or c.tie_word_embeddings)]
        packs.sort(key=lambda k: -weights[k].q.nbytes)  # the LM head first, not last on one thread
        if packs:
            from specdec.model import clib  # builds the kernels (here, not on two threads at once)

            wide = clib.wide_groups()

            def pack(k: str) -> None:  # each in place as it is done: the blocks are never held twice for long
                weights[k] = weights[k].interleaved(wide)

            with ThreadPoolExecutor(min(4, os.cpu_count() or 1)) as pool:
                list(pool.map(pack, packs))
        embed = weights.pop("embed")
        head = embed if c.tie_word_embeddings else weights.pop("lm_head")
        self.quantized: dict[str, QuantMatrix] = {  # the token embedding and LM head kept as blocks
            name: w for name, w in (("embed", embed), ("lm_head", head)) if isinstance(w, QuantMatrix)
        }
        self.embed = nn.Parameter(embed, requires_grad=False) if isinstance(embed, torch.Tensor) else None
        self.norm = nn.Parameter(weights.pop("norm"), requires_grad=False)
        self.lm_head = (  # None when it is quantized
            nn.Parameter(head, requires_grad=False) if isinstance(head, torch.Tensor) and head is not embed
            else self.embed if isinstance(head, torch.Tensor) else None
        )
        self.block_types = tuple(dict.fromkeys(  # GGUF type names
            t for w in (embed, head, *weights.values()) if isinstance(w, QuantMatrix) for t in w.types))
        self.quantized_bytes = (head.nbytes if isinstance(head, QuantMatrix) else 0) + sum(
            w.nbytes for w in weights.values() if isinstance(w, QuantMatrix))
        # One tensor per kind of matrix, layers stacked: the fused kernel walks them in one call;
        # quantized ones as ``quant.stack``'s arrays (float where a layer is not).
        self.stacked: dict[str, torch.Tensor | QuantStack] = {
            name: _stack([weights.pop(f"layers.{i}.{name}") for i in range(c.num_layers)]) for name in _STACKED
        }
        if self.is_quantized and not backend.fused:
            raise ModelLoadError("quantized (GGUF block) weights run on the cpu-kernels backend only")
        per_layer = [
            {name: _layer(self.stacked[name], i) for name in _STACKED}
            | {k.split(".", 2)[2]: weights.pop(k) for k in [k for k in weights if k.startswith(f"layers.{i}.")]}
            for i in range(c.num_layers)
        ]
        self.layers = nn.ModuleList(Layer(c, i, per_layer[i], backend) for i in range(c.num_layers))
        self.head: Linear | None = backend.linear(self.lm_head) if self.lm_head is not None else None
        self.scale = (c.query_pre_attn_scalar or c.head_dim) ** -0.5
        self.register_buffer("rope", rope_table(c, c.rope_theta, max_seq_len).to(device), persistent=False)
        local = c.rope_local_base_freq
        self.register_buffer(
            "rope_local", rope_table(c, local, max_seq_len).to(device) if local else None, persistent=False
        )
        self.act = (
            F.silu if c.hidden_act == "silu" else (lambda x: F.gelu(x, approximate="tanh"))
        )
        self.eval()

    def _check_names(self, weights: dict[str, torch.Tensor]) -> None:
        c = self.config
        want = {"embed", "norm"} | ({"lm_head"} if not c.tie_word_embeddings else set())
        per_layer = {w.name for w in layer_weights(c)}  # the loaders' own table: one list of a layer's weights
        want |= {f"layers.{i}.{n}" for i in range(c.num_layers) for n in per_layer}
        missing, unexpected = sorted(want - weights.keys()), sorted(weights.keys() - want)
        if missing or unexpected:
            raise ModelLoadError(f"weights do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")

    @property
    def is_quantized(self) -> bool:
        return bool(self.quantized) or any(isinstance(v, QuantStack) for v in self.stacked.values())

    def weights_label(self, dtype: torch.dtype) -> str:
        if not self.is_quantized:
            return str(dtype).removeprefix("torch.")
        from specdec.model.clib import isa

        return f"gguf {'+'.join(self.block_types)} blocks ({isa()} kernels)"

    def embed_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """[n] ids -> [n, H] rows of the input embedding (float32 where stored as blocks)."""
        return self._rows("embed", self.embed, ids)

    def head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """[n] ids -> [n, H] rows of the LM head."""
        return self._rows("lm_head", self.lm_head, ids)

    def _rows(self, name: str, dense: torch.Tensor | None, ids: torch.Tensor) -> torch.Tensor:
        blocks = self.quantized.get(name)
        if blocks is None:
            return F.embedding(ids.to(dense.device), dense).float()
        out = np.empty((ids.shape[0], blocks.k), dtype=np.float32)
        kernels.dequantize_rows(*blocks.arrays(), blocks.k, ids.numpy().astype(np.int64), out)
        return torch.from_numpy(out)

    def run_mask(self, layers: tuple[int, ...] | None) -> np.ndarray:
        """[num_layers] bool: which layers a pass runs (``layers`` their indices; None = all)."""
        n = self.config.num_layers
        if layers is None:
            return np.ones(n, dtype=np.bool_)
        if any(not 0 <= i < n for i in layers):
            raise ValueError(f"layer indices must be in [0, {n}), got {sorted(layers)}")
        mask = np.zeros(n, dtype=np.bool_)
        mask[list(layers)] = True
        return mask

    def forward(
        self,
        batch: Batch,
        cache: KVCache,
        logits_rows: torch.Tensor | None = None,
        hidden_layers: tuple[int, ...] = (),
        layers: tuple[int, ...] | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Run B x T new tokens, writing their K/V into ``cache``.

        logits_rows: [B, R] indices into T whose logits are wanted (None = all T).
        layers: the layers to run (None = all); a layer not run passes the residual through and
        writes no K/V (a layer-skipping draft; its hidden state is its input's).
        Returns logits [B, R or T, V] (float32) and the hidden states [B, T, H] after
        each layer in ``hidden_layers`` (the final normed hidden state is index -1).
        """
        c = self.config
        if self.is_quantized:
            raise RuntimeError("a model with quantized weights runs fused passes only (model.fused)")
        x = F.embedding(batch.input_ids, self.embed)  # [B, T, H]
        if c.embed_scale:
            x = x * torch.tensor(c.hidden_size**0.5, dtype=x.dtype)
        freqs = self.rope[batch.positions].unsqueeze(2)  # [B, T, 1, D/2]
        freqs_local = (
            self.rope_local[batch.positions].unsqueeze(2) if self.rope_local is not None else freqs
        )
        mask, mask_local = batch.attn_mask, batch.attn_mask
        if c.sliding_window and mask is not None:
            key_pos = torch.arange(batch.kv_len, device=mask.device)
            near = (batch.positions.unsqueeze(-1) - key_pos < c.sliding_window).unsqueeze(1)  # [B, 1, T, L]
            mask_local = mask & near
        hidden: list[torch.Tensor] = []
        run = self.run_mask(layers)
        for layer in self.layers:
            local = layer.sliding
            if run[layer.index]:
                x = self._layer(
                    layer, x, batch, cache, freqs_local if local else freqs, mask_local if local else mask
                )
            if layer.index in hidden_layers:
                hidden.append(x)
        x = rms_norm(x, self.norm, c.rms_norm_eps)
        if -1 in hidden_layers:
            hidden.append(x)
        if logits_rows is not None:
            x = x.gather(1, logits_rows.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        logits = self.head(x).float()
        if c.final_logit_softcapping:
            cap = c.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits, hidden

    def _layer(
        self,
        layer: Layer,
        x: torch.Tensor,
        batch: Batch,
        cache: KVCache,
        freqs: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        c = self.config
        B, T, _ = x.shape
        h = rms_norm(x, layer.attn_norm, c.rms_norm_eps)
        qkv = layer.qkv(h)  # [B, T, (Hq + 2 Hkv) D]
        qk, v = qkv.split([layer.q_size + layer.kv_size, layer.kv_size], dim=-1)
        qk = qk.view(B, T, c.num_heads + c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            q, k = qk.split([c.num_heads, c.num_kv_heads], dim=2)
            qk = torch.cat(
                [rms_norm(q, layer.q_norm, c.rms_norm_eps), rms_norm(k, layer.k_norm, c.rms_norm_eps)],
                dim=2,
            )
        # Rope on q and k at once: pairs (2i, 2i+1) are complex numbers rotated by freqs.
        qk_c = torch.view_as_complex(qk.float().reshape(B, T, -1, c.head_dim // 2, 2))
        qk = torch.view_as_real(qk_c * freqs).flatten(3).to(x.dtype)
        q, k = qk.split([c.num_heads, c.num_kv_heads], dim=2)
        q = q.transpose(1, 2)  # [B, Hq, T, D]
        k = k.transpose(1, 2)  # [B, Hkv, T, D]
        v = v.view(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)
        self._write_cache(layer.index, k, v, batch, cache)
        # Decode/verify passes use the row kernel (bit-identical rows at any width); prefill,
        # with its T x L scores, is far faster through torch's blocked SDPA.
        attn = self._sdpa(q, layer.index, batch, cache, mask)  # [B, T, Hq * D]
        out = layer.o(attn)
        if c.sandwich_norm:
            out = rms_norm(out, layer.post_attn_norm, c.rms_norm_eps)
        x = x + out
        h = rms_norm(x, layer.mlp_norm, c.rms_norm_eps)
        out = layer.down(self._gated(layer.gate_up(h)))
        if c.sandwich_norm:
            out = rms_norm(out, layer.post_mlp_norm, c.rms_norm_eps)
        return x + out

    def _gated(self, gate_up: torch.Tensor) -> torch.Tensor:
        """act(gate) * up [.., I] from a ``w_gate_up`` product [.., 2 I], its halves in alternating blocks."""
        pairs = gate_up.unflatten(-1, (-1, 2, gate_up_block(gate_up.shape[-1] // 2)))
        return (self.act(pairs[..., 0, :]) * pairs[..., 1, :]).flatten(-2)

    @staticmethod
    def _write_cache(index: int, k: torch.Tensor, v: torch.Tensor, batch: Batch, cache: KVCache) -> None:
        """Store the new K/V [B, Hkv, T, D] at the batch's cache entries."""
        ck, cv = cache.k[index], cache.v[index]
        if batch.contiguous and batch.input_ids.shape[0] == 1:
            # Fast path for one sequence: new tokens occupy consecutive cache entries.
            start, slot, T = int(batch.write_at[0, 0]), int(batch.slots[0]), k.shape[2]
            ck[slot, :, start : start + T] = k[0]
            cv[slot, :, start : start + T] = v[0]
            return
        rows = batch.slots.unsqueeze(1)  # [B, 1]
        ck[rows, :, batch.write_at] = k.transpose(1, 2)  # [B, T, Hkv, D] into [B, T] entries
        cv[rows, :, batch.write_at] = v.transpose(1, 2)

    def _sdpa(
        self, q: torch.Tensor, index: int, batch: Batch, cache: KVCache, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """torch's attention over this batch's cache rows; q [B, Hq, T, D] -> [B, T, Hq * D]."""
        ck, cv, L = cache.k[index], cache.v[index], batch.kv_len
        B = q.shape[0]
        if batch.contiguous:
            k_all, v_all = ck[:B, :, :L], cv[:B, :, :L]
        else:
            k_all, v_all = ck[batch.slots, :, :L], cv[batch.slots, :, :L]
        if k_all.dtype != q.dtype:  # a cache of another type (--kv-cache-dtype): widened, as the CPU kernels do
            k_all, v_all = k_all.to(q.dtype), v_all.to(q.dtype)
        attn = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, scale=self.scale, enable_gqa=True)
        return attn.transpose(1, 2).reshape(B, q.shape[2], -1)
