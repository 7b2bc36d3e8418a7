"""A multi-token-prediction (MTP) module shipped inside a checkpoint, run as a draft head.

DeepSeek-V3, GLM-4.5 and Qwen3-Next train one (or more) extra blocks beside the
model that predict the token after next from the model's last hidden state and
the next token's embedding::

    x  = eh_proj([enorm(embed(x_{p})), hnorm(h_{p-1})])    [n, 2H] -> [n, H]
    h' = block(x)                                           one decoder layer of the target's kind
    logits = head(shared_head_norm(h'))                     [n, V]: the token at p + 1

h_{p-1} is the target's final normed hidden state at position p - 1 (ModelRunner's
hidden layer -1), what vLLM, SGLang and llama.cpp feed these modules. Drafting
further, the module reads its own h' and the token it drafted, as EAGLE heads
do: ``drafters.mtp`` runs it through the EAGLE drafter's machinery (the same
``step`` / ``logits`` contract as ``EagleHead``, its own one-layer ``HeadCache``).

Rope: the drafter hands the position of the token x_p; the attention only sees
position differences, so this equals vLLM's convention (the hidden state's
position p - 1), whose one absolute effect we keep: DeepSeek-layout modules see a
zero embedding at the sequence's first entry (vLLM's ``inputs_embeds[positions == 0] = 0``).
Weights are float32 in Hugging Face's rotate-half layout (``mtp_checkpoint`` loads them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specdec.config import ModelConfig
from specdec.model.eagle_head import MAX_POSITIONS, CachedLayer, rms_norm, rotate, rotate_half_tables
from specdec.model.quant import QuantMatrix

# our parameter names (the loader maps each layout's names onto them)
MODULE_WEIGHTS = ("enorm", "hnorm", "eh_proj", "shared_head_norm", "lm_head")
BLOCK_WEIGHTS = ("input_layernorm", "q_proj", "k_proj", "v_proj", "o_proj", "post_attention_layernorm",
                 "gate_proj", "up_proj", "down_proj")
BIAS_WEIGHTS = ("q_bias", "k_bias", "v_bias")  # attention_bias (Qwen2)
QK_NORM_WEIGHTS = ("q_norm", "k_norm")  # qk_norm (Qwen3)


@dataclass(frozen=True)
class MtpHeadConfig:
    """An MTP module of a target: its block is shaped like one of the target's layers (``block``).

    feature_layers: the target hidden state it reads (-1: the final normed one), as
    ``EagleHeadConfig.feature_layers``; the vocabulary is the target's whole one.
    mask_first_embed: the first entry's embedding is zeroed (DeepSeek / GLM layout).
    layout: where the weights came from ("deepseek", "qwen3-next", "gguf"), for messages.
    """

    block: ModelConfig
    layout: str
    mask_first_embed: bool = False
    feature_layers: tuple[int, ...] = (-1,)

    @property
    def target_vocab_size(self) -> int:
        return self.block.vocab_size

    @property
    def draft_vocab_size(self) -> int:
        return self.block.vocab_size

    @property
    def num_kv_heads(self) -> int:
        return self.block.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.block.head_dim


def weight_names(config: ModelConfig) -> tuple[str, ...]:
    """Every parameter an MTP module for ``config``'s target has."""
    return (MODULE_WEIGHTS + BLOCK_WEIGHTS + (BIAS_WEIGHTS if config.attention_bias else ())
            + (QK_NORM_WEIGHTS if config.qk_norm else ()))


class MtpHead(CachedLayer):
    """An MTP module's weights and its cached decode step (the EAGLE drafter's head contract)."""

    def __init__(self, config: MtpHeadConfig, weights: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.config = config
        for name in weight_names(config.block):
            setattr(self, name, nn.Parameter(weights[name].float().contiguous(), requires_grad=False))
        # identity vocabulary map: EagleDrafter reads draft ids through d2t offsets
        self.register_buffer("d2t", torch.zeros(config.block.vocab_size, dtype=torch.long))
        self.max_positions = min(config.block.max_position_embeddings, MAX_POSITIONS)
        cos, sin = rotate_half_tables(config.block, self.max_positions)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """The target's hidden states enter as they are (``eh_proj`` mixes them with the token)."""
        return features

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids

    def quantize_for_cpu(self, target_head: QuantMatrix | None = None) -> bool:
        """Draft with int8 copies of the module's matrices (``CachedLayer._quantize``; q/k/v and
        gate/up fused), its LM head the target's own quantized one where the module has none of its
        own (``target_head``: no second copy of a 49K-152K-row matrix)."""
        cat = lambda *names: torch.cat([getattr(self, n) for n in names])  # noqa: E731
        matrices = {"eh_proj": self.eh_proj, "qkv": cat("q_proj", "k_proj", "v_proj"), "o_proj": self.o_proj,
                    "gate_up": cat("gate_proj", "up_proj"), "down_proj": self.down_proj}
        return self._quantize(matrices | {"lm_head": self.lm_head if target_head is None else target_head})

    def _float_matrix(self, part: str) -> torch.Tensor:
        return getattr(self, part)

    def _product(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """x @ W.T: on the int8 copy ``name`` where there is one, else the float parameter ``name``."""
        return self._products(name, (name,), x)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Module output [..., H] -> logits over the target's vocabulary [..., V]."""
        return self._product("lm_head", rms_norm(hidden, self.shared_head_norm, self.config.block.rms_norm_eps))

    def qkv(self, hidden: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor):
        """Entries [..., H] -> (residual x = eh_proj(..) [..., H], q [..., Hq, D], k, v [..., Hkv, D]) with
        rope applied (``EagleHead.qkv``'s contract: ``step`` and the training unroll share it)."""
        c = self.config.block
        if self.config.mask_first_embed:
            embeds = embeds.masked_fill((positions == 1).unsqueeze(-1), 0.0)  # vLLM's position 0
        x = torch.cat([rms_norm(embeds, self.enorm, c.rms_norm_eps), rms_norm(hidden, self.hnorm, c.rms_norm_eps)],
                      dim=-1)
        x = self._product("eh_proj", x)
        h = rms_norm(x, self.input_layernorm, c.rms_norm_eps)
        shape = h.shape[:-1]
        q, k, v = self._products("qkv", ("q_proj", "k_proj", "v_proj"), h)
        if c.attention_bias:
            q, k, v = q + self.q_bias, k + self.k_bias, v + self.v_bias
        q, k, v = (t.reshape(*shape, n, c.head_dim) for t, n in ((q, c.num_heads), (k, c.num_kv_heads),
                                                                 (v, c.num_kv_heads)))
        if c.qk_norm:
            q, k = rms_norm(q, self.q_norm, c.rms_norm_eps), rms_norm(k, self.k_norm, c.rms_norm_eps)
        cos, sin = self.cos[positions].unsqueeze(-2), self.sin[positions].unsqueeze(-2)
        return x, rotate(q, cos, sin), rotate(k, cos, sin), v

    def finish(self, residual: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Attention output [..., Hq * D] -> the module's output h' [..., H]."""
        c = self.config.block
        x = residual + self._product("o_proj", attn)
        m = rms_norm(x, self.post_attention_layernorm, c.rms_norm_eps)
        gate, up = self._products("gate_up", ("gate_proj", "up_proj"), m)
        return x + self._product("down_proj", F.silu(gate) * up)
