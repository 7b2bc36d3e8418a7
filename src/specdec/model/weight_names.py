"""The one table of a decoder layer's weights: our name <- the Hugging Face and the GGUF names.

``weights._convert`` (safetensors) and ``gguf_weights.load_gguf_weights`` (GGUF, blocks kept) both
walk ``layer_weights(config)``; they differ only in how a part is read (a float tensor, or a
``QuantMatrix``) and in which rope reorders the file already did (llama.cpp interleaves q/k rows
for its ``llama`` architecture; Hugging Face never does) and Gemma's +1 on norms (llama.cpp's
converter stores it, Hugging Face does not).

Several parts are concatenated by rows in the order given: q, k, v -> ``wqkv``; gate, up -> ``w_gate_up``,
whose halves then alternate in blocks of rows (``gate_up_order``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from specdec.config import ModelConfig

Rope = str | None  # "q" / "k": rows per head of num_heads / num_kv_heads heads; "head": one head; None


@dataclass(frozen=True)
class LayerWeight:
    name: str  # ours, under "layers.{i}."
    hf: tuple[str, ...]  # under "layers.{i}." of a Hugging Face checkpoint ("model." stripped)
    gguf: tuple[str, ...]  # under "blk.{i}." of a GGUF file
    rope: tuple[Rope, ...] = ()  # per part: rope dims reordered from halves to pairs (() = none)
    vector: bool = False  # a bias or norm: 1-D
    norm: bool = False  # a norm's scale (Gemma's +1 offset on Hugging Face weights)
    when: Callable[[ModelConfig], bool] = lambda c: True  # the config has this weight
    # per part, its own name unfused: an MTP block's parameters (``model.mtp_head``, which keeps q, k, v
    # apart); () where no MTP block has the weight (Gemma's sandwich norms)
    parts: tuple[str, ...] = ()
    alternate: bool = False  # two parts' rows in alternating blocks (``gate_up_order``), not one after the other

    def rope_of(self, part: int) -> Rope:
        return self.rope[part] if self.rope else None


LAYER_WEIGHTS: tuple[LayerWeight, ...] = (
    LayerWeight("wqkv", ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
                ("attn_q.weight", "attn_k.weight", "attn_v.weight"), rope=("q", "k", None),
                parts=("q_proj", "k_proj", "v_proj")),
    LayerWeight("bqkv", ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
                ("attn_q.bias", "attn_k.bias", "attn_v.bias"), rope=("q", "k", None), vector=True,
                when=lambda c: c.attention_bias, parts=("q_bias", "k_bias", "v_bias")),
    LayerWeight("wo", ("self_attn.o_proj.weight",), ("attn_output.weight",), parts=("o_proj",)),
    LayerWeight("w_gate_up", ("mlp.gate_proj.weight", "mlp.up_proj.weight"), ("ffn_gate.weight", "ffn_up.weight"),
                parts=("gate_proj", "up_proj"), alternate=True),
    LayerWeight("w_down", ("mlp.down_proj.weight",), ("ffn_down.weight",), parts=("down_proj",)),
    LayerWeight("attn_norm", ("input_layernorm.weight",), ("attn_norm.weight",), vector=True, norm=True,
                parts=("input_layernorm",)),
    # Gemma's sandwich: a norm after attention and after the MLP too
    LayerWeight("post_attn_norm", ("post_attention_layernorm.weight",), ("post_attention_norm.weight",),
                vector=True, norm=True, when=lambda c: c.sandwich_norm),
    LayerWeight("mlp_norm", ("pre_feedforward_layernorm.weight",), ("ffn_norm.weight",), vector=True, norm=True,
                when=lambda c: c.sandwich_norm),
    LayerWeight("post_mlp_norm", ("post_feedforward_layernorm.weight",), ("post_ffw_norm.weight",),
                vector=True, norm=True, when=lambda c: c.sandwich_norm),
    # elsewhere the MLP's norm is what Hugging Face calls post_attention_layernorm
    LayerWeight("mlp_norm", ("post_attention_layernorm.weight",), ("ffn_norm.weight",), vector=True, norm=True,
                when=lambda c: not c.sandwich_norm, parts=("post_attention_layernorm",)),
    LayerWeight("q_norm", ("self_attn.q_norm.weight",), ("attn_q_norm.weight",), rope=("head",), vector=True,
                norm=True, when=lambda c: c.qk_norm, parts=("q_norm",)),
    LayerWeight("k_norm", ("self_attn.k_norm.weight",), ("attn_k_norm.weight",), rope=("head",), vector=True,
                norm=True, when=lambda c: c.qk_norm, parts=("k_norm",)),
)


# an MTP block part's Hugging Face name -> its MtpHead parameter, from the table (model.mtp_checkpoint)
MTP_BLOCK_PARTS: dict[str, str] = {hf: part for w in LAYER_WEIGHTS for hf, part in zip(w.hf, w.parts, strict=False)}


def layer_weights(config: ModelConfig) -> list[LayerWeight]:
    """The weights each layer of ``config``'s model has."""
    return [w for w in LAYER_WEIGHTS if w.when(config)]


GATE_UP_BLOCK = 16  # rows a block of ``w_gate_up``'s alternating halves: a product's unit of work (kernels._UNIT)


def gate_up_block(inter: int) -> int:
    """Rows of each block in which ``w_gate_up``'s gate and up halves alternate (gate rows 0-15, up rows 0-15, gate
    rows 16-31, ...): a product's span of whole block pairs then holds both halves of its columns, and the gated
    activation runs there, on the tiles' fresh output (``kernels.qmatmul``'s ``gated``). One block, gate then
    up, where GATE_UP_BLOCK does not divide the intermediate width."""
    return GATE_UP_BLOCK if inter % GATE_UP_BLOCK == 0 else inter


def gate_up_order(inter: int) -> np.ndarray:
    """Row i of the stored ``w_gate_up`` is row order[i] of gate and up one after the other."""
    b = gate_up_block(inter)
    return (np.arange(inter // b)[:, None, None] * b + np.arange(2)[None, :, None] * inter
            + np.arange(b)[None, None, :]).reshape(-1)


def rope_heads(config: ModelConfig, rope: Rope) -> tuple[int, int]:
    """(heads, head_dim) of the rows a part's rope reorder works on."""
    heads = {"q": config.num_heads, "k": config.num_kv_heads, "head": 1}[rope]
    return heads, config.head_dim


def is_mtp_weight(name: str, num_layers: int) -> bool:
    """Whether ``name`` (a Hugging Face name, "model." stripped) belongs to a multi-token-prediction
    module shipped beside the model: DeepSeek / GLM's extra ``layers.{num_layers + i}``, Qwen3-Next's
    ``mtp.*``. The target's loader leaves them to ``model.mtp_checkpoint``."""
    if name.startswith("mtp."):
        return True
    parts = name.split(".", 2)
    return len(parts) > 2 and parts[0] == "layers" and parts[1].isdigit() and int(parts[1]) >= num_layers
