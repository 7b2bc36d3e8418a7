"""EAGLE-3 head checkpoints: a folder with config.json and model.safetensors.

Written in the layout of the ``speculators`` project (what vLLM loads), so heads
trained here run elsewhere and published heads run here::

    config.json        speculators_model_type "eagle3", transformer_layer_config (one Llama
                       layer), draft_vocab_size, target_hidden_size,
                       eagle_aux_hidden_state_layer_ids, speculators_config.verifier
    model.safetensors  fc.weight, layers.0.{input_layernorm,hidden_norm,post_attention_layernorm}.weight,
                       layers.0.self_attn.{q,k,v,o}_proj.weight, layers.0.mlp.{gate,up,down}_proj.weight,
                       norm.weight, lm_head.weight, d2t (offsets: target = d + d2t[d]), t2d (bool mask)

A P-EAGLE head (``specdec train eagle3 --parallel K``) says speculators_model_type
"peagle" with ``para_depths`` K (speculators' name for the parallel positions) and
stores its mask entry as ``mask_hidden`` [3H_t] (speculators' name) and ``mask_embed``
[H] (ours: speculators embeds a mask token id with a trained copy of the embedding
table, which we never store).

The original EAGLE-3 release (a LlamaConfig with ``draft_vocab_size``, weights under
``midlayer.``) loads as well. The target's embedding table is never stored: the head
looks tokens up in the target's own. Pickled checkpoints are refused.

Every mismatch with the target (hidden size, layer count, vocabulary, tokenizer) and
every unreadable file raises ``ModelLoadError`` with one line naming it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from specdec.config import ModelConfig
from specdec.errors import ModelLoadError
from specdec.model.eagle_head import EagleHead, EagleHeadConfig

WEIGHTS = "model.safetensors"
# our parameter -> speculators' name (the original release's "midlayer." is accepted for "layers.0.")
NAMES = {
    "fc.weight": "fc.weight",
    "fc.bias": "fc.bias",
    "input_layernorm": "layers.0.input_layernorm.weight",
    "hidden_norm": "layers.0.hidden_norm.weight",
    "post_attention_layernorm": "layers.0.post_attention_layernorm.weight",
    "q_proj.weight": "layers.0.self_attn.q_proj.weight",
    "k_proj.weight": "layers.0.self_attn.k_proj.weight",
    "v_proj.weight": "layers.0.self_attn.v_proj.weight",
    "o_proj.weight": "layers.0.self_attn.o_proj.weight",
    "gate_proj.weight": "layers.0.mlp.gate_proj.weight",
    "up_proj.weight": "layers.0.mlp.up_proj.weight",
    "down_proj.weight": "layers.0.mlp.down_proj.weight",
    "norm": "norm.weight",
    "lm_head.weight": "lm_head.weight",
    "d2t": "d2t",
    "t2d": "t2d",
    "mask_hidden": "mask_hidden",
    "mask_embed": "mask_embed",
}


def tokenizer_hash(tokenizer) -> str:
    """A short fingerprint of a tokenizer's vocabulary: heads remember which one they were trained with."""
    items = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()[:16]


def config_to_json(c: EagleHeadConfig, dtype: str = "bfloat16") -> dict:
    layer = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": c.hidden_size,
        "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
        "intermediate_size": c.intermediate_size, "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling, "vocab_size": c.target_vocab_size,
        "max_position_embeddings": c.max_position_embeddings, "hidden_act": "silu", "attention_bias": False,
        "mlp_bias": False, "tie_word_embeddings": False,
    }
    parallel = {"para_depths": c.parallel_tokens} if c.parallel_tokens else {}
    return {
        "architectures": ["PEagleSpeculator" if c.parallel_tokens else "Eagle3Speculator"],
        "speculators_model_type": "peagle" if c.parallel_tokens else "eagle3",
        **parallel,
        "speculators_version": "0.3.0",
        "torch_dtype": dtype,
        "draft_vocab_size": c.draft_vocab_size,
        "norm_before_residual": c.norm_before_residual,
        "target_hidden_size": c.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in c.feature_layers],
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5}],
            "verifier": dict(c.verifier),
        },
    }


def config_from_json(raw: dict, target_num_layers: int, has_fc_bias: bool = False) -> EagleHeadConfig:
    """Read either layout; ``target_num_layers`` resolves the default feature layers."""
    layer = raw.get("transformer_layer_config", raw)  # the original release keeps them at the top level
    try:
        H = int(layer["hidden_size"])
        heads = int(layer["num_attention_heads"])
        ids = raw.get("eagle_aux_hidden_state_layer_ids")
        layers = tuple(int(i) - 1 for i in ids) if ids else (1, target_num_layers // 2 - 1, target_num_layers - 4)
        verifier = raw.get("speculators_config", {}).get("verifier", {}) or {}
        return EagleHeadConfig(
            hidden_size=H, num_heads=heads, num_kv_heads=int(layer.get("num_key_value_heads", heads)),
            head_dim=int(layer.get("head_dim") or H // heads), intermediate_size=int(layer["intermediate_size"]),
            target_vocab_size=int(layer["vocab_size"]),
            draft_vocab_size=int(raw.get("draft_vocab_size") or layer["vocab_size"]),
            target_hidden_size=int(raw.get("target_hidden_size") or H), feature_layers=layers,
            target_num_layers=int(verifier.get("num_hidden_layers") or target_num_layers),
            rms_norm_eps=float(layer.get("rms_norm_eps", 1e-5)), rope_theta=float(layer.get("rope_theta", 10000.0)),
            rope_scaling=layer.get("rope_scaling"),
            max_position_embeddings=int(layer.get("max_position_embeddings", 8192)),
            norm_before_residual=bool(raw.get("norm_before_residual", False)), fc_bias=has_fc_bias,
            verifier=dict(verifier),
            parallel_tokens=int(raw.get("para_depths") or 0) if raw.get("speculators_model_type") == "peagle" else 0,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"not an EAGLE-3 head config (missing or bad {exc})") from None


def save_head(head: EagleHead, folder: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write ``head`` as config.json + model.safetensors (float weights in ``dtype``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    params = dict(head.named_parameters()) | {"d2t": head.d2t, "t2d": head.t2d}
    tensors = {}
    for ours, theirs in NAMES.items():
        if ours in params:
            t = params[ours].detach().cpu()
            tensors[theirs] = t.to(dtype) if t.is_floating_point() else t
    tmp = folder / (WEIGHTS + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.chmod(0o644)
    tmp.replace(folder / WEIGHTS)  # a reader never sees half a file
    name = str(dtype).removeprefix("torch.")
    (folder / "config.json").write_text(json.dumps(config_to_json(head.config, name), indent=2) + "\n")
    return folder


def load_head(folder: str | Path, device: torch.device | str = "cpu") -> EagleHead:
    """Read a head (either layout) as float32; checks files and shapes, not the target (``check_target``)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelLoadError(f"EAGLE head not found: {folder} is not a folder")
    config_path, weights_path = folder / "config.json", folder / WEIGHTS
    if not config_path.is_file():
        raise ModelLoadError(f"EAGLE head {folder} has no config.json")
    if not weights_path.is_file():
        pickles = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
        why = f" (only {pickles[0]}: pickled checkpoints are not loaded)" if pickles else ""
        raise ModelLoadError(f"EAGLE head {folder} has no {WEIGHTS}{why}")
    try:
        raw = json.loads(config_path.read_text())
        with safe_open(str(weights_path), framework="pt") as f:
            tensors = {_our_name(k): f.get_tensor(k) for k in f.keys()}
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"EAGLE head {folder}: config.json is not valid JSON ({exc.msg})") from None
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise ModelLoadError(f"EAGLE head {folder}: cannot read {WEIGHTS} (truncated or corrupt: {exc})") from None
    tensors.pop(None, None)  # e.g. a stored copy of the target's embedding table
    target_layers = int(raw.get("speculators_config", {}).get("verifier", {}).get("num_hidden_layers") or 0)
    config = config_from_json(raw, target_layers, has_fc_bias="fc.bias" in tensors)
    head = EagleHead(config)
    _fill(head, tensors, folder)
    return head.to(device).eval()


def _our_name(name: str) -> str | None:
    name = name.removeprefix("model.").replace("midlayer.", "layers.0.")
    for ours, theirs in NAMES.items():
        if name == theirs:
            return ours
    return None


def _fill(head: EagleHead, tensors: dict[str, torch.Tensor], folder: Path) -> None:
    params = dict(head.named_parameters())
    wanted = [n for n in NAMES if n in params or n in ("d2t", "t2d")]
    missing = [NAMES[n] for n in wanted if n not in tensors and n not in ("d2t", "t2d")]
    if missing:
        raise ModelLoadError(f"EAGLE head {folder}: missing weights {missing[:3]}")
    with torch.no_grad():
        for name in wanted:
            if name not in tensors:
                continue
            src = tensors[name].reshape(-1) if name == "mask_hidden" else tensors[name]  # speculators: [1, 1, F]
            dst = params[name] if name in params else getattr(head, name)
            if tuple(src.shape) != tuple(dst.shape):
                raise ModelLoadError(
                    f"EAGLE head {folder}: {NAMES[name]} has shape {tuple(src.shape)}, "
                    f"the config implies {tuple(dst.shape)}"
                )
            dst.copy_(src.to(dst.dtype))
    if "t2d" not in tensors and "d2t" in tensors:  # rebuild the mask from the offsets
        head.t2d[torch.arange(len(head.d2t)) + head.d2t] = True
    if "d2t" not in tensors:  # a full-vocabulary head
        if head.config.draft_vocab_size != head.config.target_vocab_size:
            raise ModelLoadError(f"EAGLE head {folder}: no d2t map for its reduced vocabulary")
        head.set_vocab(torch.arange(head.config.target_vocab_size))


def check_target(head: EagleHead, target_config: ModelConfig | None, target_vocab_size: int, tokenizer=None,
                 where: str = "") -> None:
    """Refuse a head trained for another target: one line naming what differs (its shapes only where
    the target's config is known)."""
    c = head.config
    prefix = f"EAGLE head {where}: " if where else "EAGLE head: "
    hidden = None if target_config is None else target_config.hidden_size
    layers = None if target_config is None else target_config.num_layers
    if hidden is not None and c.target_hidden_size != hidden:
        raise ModelLoadError(f"{prefix}made for a target with hidden size {c.target_hidden_size}, "
                             f"this one has {hidden}")
    trained_for = c.verifier.get("num_hidden_layers", layers)
    if layers is not None and (max(c.feature_layers) >= layers or trained_for != layers):
        raise ModelLoadError(
            f"{prefix}made for a target with {c.verifier.get('num_hidden_layers', max(c.feature_layers) + 1)} layers, "
            f"this one has {layers}"
        )
    if c.target_vocab_size != target_vocab_size:
        raise ModelLoadError(
            f"{prefix}made for a vocabulary of {c.target_vocab_size} tokens, the target has {target_vocab_size}"
        )
    want = c.verifier.get("tokenizer_hash")
    if want and tokenizer is not None and tokenizer_hash(tokenizer) != want:
        raise ModelLoadError(f"{prefix}made for another tokenizer (vocabulary fingerprint {want} differs)")
    check_vocab_map(head, target_vocab_size, prefix)


def check_vocab_map(head: EagleHead, target_vocab_size: int, prefix: str = "EAGLE head: ") -> None:
    """The draft -> target map must name each target id at most once, all in range, as t2d says: a
    negative id wraps to the vocabulary's end and a repeated one doubles a token's draft mass, and
    either would silently bias what the head drafts."""
    ids = torch.arange(len(head.d2t), device=head.d2t.device) + head.d2t
    if int(ids.min()) < 0:
        raise ModelLoadError(f"{prefix}its d2t map has a negative target id ({int(ids.min())})")
    if int(ids.max()) >= target_vocab_size:
        raise ModelLoadError(f"{prefix}its d2t map points past the target's vocabulary")
    if len(torch.unique(ids)) != len(ids):
        raise ModelLoadError(f"{prefix}its d2t map names {len(ids) - len(torch.unique(ids))} target ids twice")
    if int(head.t2d.sum()) != len(ids) or not bool(head.t2d[ids].all()):
        raise ModelLoadError(f"{prefix}its t2d mask disagrees with its d2t map")


def check_parallel(head: EagleHead, parallel: bool, where: str = "") -> None:
    """--spec-parallel-drafting needs a head trained for it (its K and mask entry): one line if not."""
    if parallel and not head.config.parallel_tokens:
        head_name = f"EAGLE head {where}" if where else "EAGLE head"
        raise ModelLoadError(f"--spec-parallel-drafting: the {head_name} was not trained for parallel "
                             "drafting (no para_depths / mask_hidden): train one with `specdec train eagle3 "
                             "--parallel K`, or drop --spec-parallel-drafting")
