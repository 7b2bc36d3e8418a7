"""Multi-token-prediction modules shipped inside a target's checkpoint -> ``MtpHead``.

Three layouts, for targets whose layers the native decoder runs (Llama, Mistral,
Qwen2, Qwen3 blocks); L = the model's ``num_hidden_layers``:

    DeepSeek-V3 / GLM-4.5   model.layers.{L}.{enorm,hnorm,eh_proj}.weight, shared_head.norm.weight,
                            shared_head.head.weight (else the model's own head), a decoder layer's
                            weights under the same prefix; config num_nextn_predict_layers
    Qwen3-Next / Qwen3.5    mtp.{pre_fc_norm_embedding,pre_fc_norm_hidden,fc,norm}.weight and
                            mtp.layers.0.* (the model's lm_head is the head)
    GGUF (llama.cpp)        blk.{n}.nextn.{enorm,hnorm,eh_proj,shared_head_norm,shared_head_head}.weight
                            and blk.{n}.attn_q.weight ... for n = block_count - {arch}.nextn_predict_layers

The first module of several is read (drafting reuses it for every step, as vLLM does
for one). The module's own copy of the embedding table (``embed_tokens``) is never
read: it is the model's. Refused with one line each: MoE blocks, hybrid
linear-attention models, architectures the native decoder does not run, a
checkpoint without a module; a missing or misshapen tensor is named.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from specdec.config import ModelConfig
from specdec.errors import ModelLoadError
from specdec.model.mtp_head import MtpHeadConfig, weight_names
from specdec.model.weight_names import MTP_BLOCK_PARTS, layer_weights
from specdec.model.weights import model_path, read_model_config, resolve_model

BLOCK_PARTS = MTP_BLOCK_PARTS  # a block part's Hugging Face name -> our MtpHead parameter (the weight table's)
# the module's own weights per layout: ours -> the name after the module's prefix
DEEPSEEK = {"enorm": "enorm.weight", "hnorm": "hnorm.weight", "eh_proj": "eh_proj.weight",
            "shared_head_norm": "shared_head.norm.weight", "lm_head": "shared_head.head.weight"}
QWEN3_NEXT = {"enorm": "pre_fc_norm_embedding.weight", "hnorm": "pre_fc_norm_hidden.weight", "eh_proj": "fc.weight",
              "shared_head_norm": "norm.weight"}
GGUF_NEXTN = {"enorm": "nextn.enorm.weight", "hnorm": "nextn.hnorm.weight", "eh_proj": "nextn.eh_proj.weight",
              "shared_head_norm": "nextn.shared_head_norm.weight", "lm_head": "nextn.shared_head_head.weight"}
OPTIONAL = ("lm_head",)  # absent: the model's own LM head
EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_intermediate_size")
_PERMUTED_ARCHS = ("llama",)  # llama.cpp interleaves q/k rows for these (see gguf_weights)


@dataclass(frozen=True)
class MtpModule:
    """An MTP module as read from a checkpoint, before it is built on a device (``drafters.heads``)."""

    config: MtpHeadConfig
    weights: dict[str, torch.Tensor]  # our MtpHead names, shapes checked
    shares_lm_head: bool  # the checkpoint stores no head of its own: ``lm_head`` is the target's rows


def read_mtp_module(model: str | None, target: ModelConfig | None,
                    target_rows: Callable[[torch.Tensor], torch.Tensor]) -> MtpModule:
    """The MTP module inside ``model``'s checkpoint (the target's own, or a folder that `specdec train
    mtp` wrote for it: the target's config.json and the module in the DeepSeek layout), checked against
    ``target``'s shapes. ``target_rows`` ([n] ids -> [n, H] rows of the target's LM head) fills the head
    of a module that shares the target's."""
    path = model_path(model)
    folder = resolve_model(model, weights=False)
    config, raw = read_model_config(folder)
    config = check_supported(config, raw)
    check_made_for(config, target, folder.name)
    weights, layout = read_mtp_weights(path if path.suffix == ".gguf" else folder, config)
    shared = "lm_head" not in weights  # the target's LM head is the module's
    if shared:
        weights["lm_head"] = target_rows(torch.arange(config.vocab_size))
    check_shapes(weights, config, path.name)
    head_config = MtpHeadConfig(block=config, layout=layout, mask_first_embed=layout != "qwen3-next")
    return MtpModule(head_config, weights, shared)


def check_made_for(config: ModelConfig, target: ModelConfig | None, where: str) -> None:
    """A module trained for another target (``--spec-model DIR``, `specdec train mtp`): one line naming what differs."""
    if target is None:
        return
    for what, ours, theirs in (("architecture", config.arch, target.arch),
                               ("hidden size", config.hidden_size, target.hidden_size),
                               ("vocabulary", config.vocab_size, target.vocab_size),
                               ("layer count", config.num_layers, target.num_layers)):
        if ours != theirs:
            raise ModelLoadError(f"draft-mtp: the MTP module in {where} was made for a target with {what} {ours}, "
                                 f"this one has {theirs}")


def check_supported(config: ModelConfig | None, raw: dict) -> ModelConfig:
    """``config`` when the native decoder can run its MTP block; else one line saying why not."""
    text = raw.get("text_config") or {}
    kind = raw.get("model_type") or text.get("model_type") or "this"
    layer_types = list(raw.get("layer_types") or []) + list(text.get("layer_types") or [])
    if kind.startswith(("qwen3_next", "qwen3_5")) or "linear_attention" in layer_types:
        raise ModelLoadError(f"draft-mtp: {kind} is a hybrid linear-attention model: Qwen3.5's linear-attention "
                             "layers need recurrent-state rollback first")
    if any(raw.get(k) or text.get(k) for k in EXPERT_KEYS):
        raise ModelLoadError(f"draft-mtp: {kind} has mixture-of-experts blocks: the native decoder runs dense "
                             "llama, mistral, qwen2 and qwen3 blocks only")
    if config is None or config.arch == "gemma3" or config.hidden_act != "silu":
        raise ModelLoadError(f"draft-mtp: the native decoder does not run {kind} MTP blocks (llama, mistral, "
                             "qwen2 and qwen3 only)")
    return config


def read_mtp_weights(source: Path, config: ModelConfig) -> tuple[dict[str, torch.Tensor], str]:
    """(our MtpHead weights but ``lm_head`` where the model's own is the head, the layout's name)
    from a Hugging Face folder or a GGUF file."""
    if source.suffix == ".gguf":
        return _gguf_weights(source, config), "gguf"
    files = sorted(source.glob("*.safetensors"))
    where = {name: f for f in files for name in _keys(f)}
    deepseek = f"model.layers.{config.num_layers}."
    if deepseek + DEEPSEEK["eh_proj"] in where:
        layout, prefix, names, block = "deepseek", deepseek, DEEPSEEK, deepseek
    elif "mtp." + QWEN3_NEXT["eh_proj"] in where:
        layout, prefix, names, block = "qwen3-next", "mtp.", QWEN3_NEXT, "mtp.layers.0."
    else:
        raise ModelLoadError(f"draft-mtp: {source.name} has no MTP module (no {deepseek}eh_proj.weight or "
                             "mtp.fc.weight): --spec-type draft-mtp needs a checkpoint that ships one")
    if any(n.startswith(block + "mlp.experts.") for n in where):
        raise ModelLoadError(f"draft-mtp: {source.name}'s MTP block is a mixture of experts: the native decoder "
                             "runs dense blocks only")
    wanted = {ours: prefix + theirs for ours, theirs in names.items()}
    wanted |= {ours: block + hf for hf, ours in BLOCK_PARTS.items() if ours in weight_names(config)}
    out = {}
    for ours, name in wanted.items():
        if name not in where:
            if ours in OPTIONAL:
                continue
            raise ModelLoadError(f"draft-mtp: weight {name} missing from {source.name}")
        with safe_open(str(where[name]), framework="pt") as f:
            out[ours] = f.get_tensor(name).float()
    return out, layout


def _keys(file: Path) -> list[str]:
    with safe_open(str(file), framework="pt") as f:
        return list(f.keys())


def _gguf_weights(path: Path, config: ModelConfig) -> dict[str, torch.Tensor]:
    from specdec.model.gguf_weights import read_float_tensors

    found: dict[str, str] = {}  # the file's architecture and the module's tensor prefix

    def nextn_block(meta: dict[str, object]) -> str:
        arch = found["arch"] = str(meta.get("general.architecture", ""))
        nextn = int(meta.get(f"{arch}.nextn_predict_layers") or 0)  # type: ignore[call-overload]
        if nextn < 1:
            raise ModelLoadError(f"draft-mtp: {path.name} has no nextn tensors ({arch}.nextn_predict_layers is "
                                 "not set): --spec-type draft-mtp needs a GGUF converted with its MTP module")
        blocks = int(meta.get(f"{arch}.block_count") or config.num_layers + nextn)  # type: ignore[call-overload]
        found["prefix"] = f"blk.{blocks - nextn}."
        return found["prefix"]

    tensors = read_float_tensors(path, nextn_block)
    arch, prefix = found["arch"], found["prefix"]
    gguf_of = {BLOCK_PARTS[hf]: gg for w in layer_weights(config) for hf, gg in zip(w.hf, w.gguf, strict=True)}
    wanted = {ours: prefix + theirs for ours, theirs in GGUF_NEXTN.items()}
    wanted |= {ours: prefix + gguf_of[ours] for ours in weight_names(config) if ours in gguf_of}
    out = {}
    for ours, name in wanted.items():
        if name not in tensors:
            if ours in OPTIONAL:
                continue
            raise ModelLoadError(f"draft-mtp: tensor {name} missing from {path.name}")
        out[ours] = tensors[name]
    if arch in _PERMUTED_ARCHS:  # back to Hugging Face's rope halves
        out["q_proj"] = _halves(out["q_proj"], config.num_heads, config.head_dim)
        out["k_proj"] = _halves(out["k_proj"], config.num_kv_heads, config.head_dim)
    return out


def _halves(w: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """Per head, rope rows from llama.cpp's interleaved pairs [x0, y0, x1, y1, ..] to halves [x.., y..]."""
    order = torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])
    return w.reshape(num_heads, head_dim, -1)[:, order].reshape(w.shape)


def check_shapes(weights: dict[str, torch.Tensor], c: ModelConfig, where: str) -> None:
    H, D, Hq, Hkv, hidden = c.hidden_size, c.head_dim, c.num_heads, c.num_kv_heads, c.intermediate_size
    want = {
        "enorm": (H,), "hnorm": (H,), "eh_proj": (H, 2 * H), "shared_head_norm": (H,), "lm_head": (c.vocab_size, H),
        "input_layernorm": (H,), "post_attention_layernorm": (H,), "q_proj": (Hq * D, H), "k_proj": (Hkv * D, H),
        "v_proj": (Hkv * D, H), "o_proj": (H, Hq * D), "gate_proj": (hidden, H), "up_proj": (hidden, H),
        "down_proj": (H, hidden), "q_bias": (Hq * D,), "k_bias": (Hkv * D,), "v_bias": (Hkv * D,), "q_norm": (D,),
        "k_norm": (D,),
    }
    for name, tensor in weights.items():
        if tuple(tensor.shape) != want[name]:
            raise ModelLoadError(f"draft-mtp: {where}: MTP weight {name} has shape {tuple(tensor.shape)}, the model's "
                                 f"config implies {want[name]}")
