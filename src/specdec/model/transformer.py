"""One native decoder for the Llama family; Qwen2/3, Mistral, SmolLM2 and Gemma3 are config flags.

Kept lean for CPU decoding, where a 1-token pass is memory-bound and every
small op costs: q/k/v and gate/up projections are fused into one matmul each,
rope is one complex multiply on q and k together (weights are permuted to the
interleaved layout at load time), norms use ``F.rms_norm``, and the attention
mask and rope factors are built once per forward, not per layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specdec.cache import KVCache
from specdec.config import ModelConfig
from specdec.model import kernels
from specdec.model.matmul import MAKERS, Linear, pick_backend


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


class Layer(nn.Module):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        c = config
        self.index = index
        self.q_size, self.kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        empty = lambda *shape: nn.Parameter(torch.empty(*shape), requires_grad=False)  # noqa: E731
        self.wqkv = empty(self.q_size + 2 * self.kv_size, c.hidden_size)
        self.bqkv = empty(self.q_size + 2 * self.kv_size) if c.attention_bias else None
        self.wo = empty(c.hidden_size, self.q_size)
        self.w_gate_up = empty(2 * c.intermediate_size, c.hidden_size)
        self.w_down = empty(c.hidden_size, c.intermediate_size)
        self.attn_norm = empty(c.hidden_size)
        self.mlp_norm = empty(c.hidden_size)
        if c.qk_norm:
            self.q_norm, self.k_norm = empty(c.head_dim), empty(c.head_dim)
        if c.sandwich_norm:
            self.post_attn_norm, self.post_mlp_norm = empty(c.hidden_size), empty(c.hidden_size)
        self.sliding = c.layer_is_sliding(index)
        self.qkv: Linear
        self.o: Linear
        self.gate_up: Linear
        self.down: Linear

    def bind_linears(self, make: Callable[..., Linear]) -> None:
        self.qkv = make(self.wqkv, self.bqkv)
        self.o = make(self.wo)
        self.gate_up = make(self.w_gate_up)
        self.down = make(self.w_down)


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig, max_seq_len: int) -> None:
        super().__init__()
        c = self.config = config
        self.embed = nn.Parameter(torch.empty(c.vocab_size, c.hidden_size), requires_grad=False)
        self.layers = nn.ModuleList(Layer(c, i) for i in range(c.num_layers))
        self.norm = nn.Parameter(torch.empty(c.hidden_size), requires_grad=False)
        self.lm_head = (
            self.embed
            if c.tie_word_embeddings
            else nn.Parameter(torch.empty(c.vocab_size, c.hidden_size), requires_grad=False)
        )
        self.scale = (c.query_pre_attn_scalar or c.head_dim) ** -0.5
        self.register_buffer("rope", rope_table(c, c.rope_theta, max_seq_len), persistent=False)
        local = c.rope_local_base_freq
        self.register_buffer(
            "rope_local", rope_table(c, local, max_seq_len) if local else None, persistent=False
        )
        self.act = (
            F.silu if c.hidden_act == "silu" else (lambda x: F.gelu(x, approximate="tanh"))
        )
        self.matmul_backend = "torch"

    def bind_linears(self, backend: str = "auto") -> str:
        """Choose how linear layers multiply (see ``matmul``); call after the weights are loaded."""
        if backend == "auto":
            backend = pick_backend(self.layers[0].w_gate_up)
        make = MAKERS[backend]
        for layer in self.layers:
            layer.bind_linears(make)
        self.head = make(self.lm_head)
        self.matmul_backend = backend
        return backend

    def forward(
        self,
        batch: Batch,
        cache: KVCache,
        logits_rows: torch.Tensor | None = None,
        hidden_layers: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Run B x T new tokens, writing their K/V into ``cache``.

        logits_rows: [B, R] indices into T whose logits are wanted (None = all T).
        Returns logits [B, R or T, V] (float32) and the hidden states [B, T, H] after
        each layer in ``hidden_layers`` (the final normed hidden state is index -1).
        """
        c = self.config
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
        for layer in self.layers:
            local = layer.sliding
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
        attend = self._row_attention if self.matmul_backend == "numpy" and T <= kernels.FEW_ROWS else self._sdpa
        attn = attend(q, layer.index, batch, cache, mask)  # [B, T, Hq * D]
        out = layer.o(attn)
        if c.sandwich_norm:
            out = rms_norm(out, layer.post_attn_norm, c.rms_norm_eps)
        x = x + out
        h = rms_norm(x, layer.mlp_norm, c.rms_norm_eps)
        gate, up = layer.gate_up(h).chunk(2, dim=-1)
        out = layer.down(self.act(gate) * up)
        if c.sandwich_norm:
            out = rms_norm(out, layer.post_mlp_norm, c.rms_norm_eps)
        return x + out

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
        attn = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, scale=self.scale, enable_gqa=True)
        return attn.transpose(1, 2).reshape(B, q.shape[2], -1)

    def _row_attention(
        self, q: torch.Tensor, index: int, batch: Batch, cache: KVCache, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """The CPU kernel (see ``kernels.attention``): rows identical at any pass width."""
        B, _, T, D = q.shape
        if mask is None:  # one token of one sequence: it sees every cache entry
            mask = torch.ones(B, 1, T, batch.kv_len, dtype=torch.bool)
        qn = q.transpose(1, 2).float().contiguous()  # [B, T, Hq, D]
        out = torch.empty_like(qn)
        kernels.attention(qn.numpy(), kernels.as_numpy(cache.k[index]), kernels.as_numpy(cache.v[index]),
                          batch.slots.numpy(), mask[:, 0].numpy(), self.scale, out.numpy())
        return out.view(B, T, -1).to(q.dtype)
