"""`specdec train mtp`: a multi-token-prediction module trained post hoc for a target that has none.

The module is DeepSeek-V3's (``model.mtp_head``): ``eh_proj`` over [enorm(embed(x_p)),
hnorm(h_{p-1})], one decoder block shaped like the target's layers, and the target's own
LM head (frozen, never stored) behind ``shared_head_norm``. It trains on the EAGLE-3
pipeline's self-distillation data (``train.data``; h_{p-1} is the cached final normed
state) with the same training-time test (``train.ttt``) and trainer (resumable, validated,
the best kept), and is saved as a folder draft-mtp loads with ``--spec-model DIR``::

    config.json        the target's config.json, plus num_nextn_predict_layers 1
    model.safetensors  model.layers.{L}.{enorm,hnorm,eh_proj}.weight, model.layers.{L}.shared_head.norm.weight
                       and the block's weights under the same prefix (L = the target's layer count)

That is the layout ``model.mtp_checkpoint`` reads from DeepSeek-V3 / GLM checkpoints; with
no ``shared_head.head.weight`` the target's LM head is the head, as in those checkpoints.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdec.config import ModelConfig
from specdec.model.mtp_checkpoint import BLOCK_PARTS, DEEPSEEK
from specdec.model.mtp_head import MtpHead, MtpHeadConfig, weight_names

WEIGHTS = "model.safetensors"


def checkpoint_names(config: ModelConfig) -> dict[str, str]:
    """Our MtpHead parameter -> its name in the checkpoint (the LM head is the target's: not stored)."""
    prefix = f"model.layers.{config.num_layers}."
    ours = {name: prefix + theirs for name, theirs in DEEPSEEK.items() if name != "lm_head"}
    wanted = set(weight_names(config))
    return ours | {name: prefix + hf for hf, name in BLOCK_PARTS.items() if name in wanted}


def new_mtp_head(runner, seed: int = 0) -> MtpHead:
    """A fresh module for ``runner``'s target: matrices small and random, norms one, the target's LM
    head and final norm behind it (its first task: the target's own output space); all but the LM
    head trainable."""
    config: ModelConfig = runner.config
    H = config.hidden_size
    gen = torch.Generator().manual_seed(seed)
    Q, KV, M = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim, config.intermediate_size
    shapes = {"eh_proj": (H, 2 * H), "q_proj": (Q, H), "k_proj": (KV, H), "v_proj": (KV, H), "o_proj": (H, Q),
              "gate_proj": (M, H), "up_proj": (M, H), "down_proj": (H, M)}
    weights = {name: 0.02 * torch.randn(shape, generator=gen) for name, shape in shapes.items()}
    weights |= {name: torch.ones(H) for name in ("enorm", "hnorm", "input_layernorm", "post_attention_layernorm")}
    weights |= dict(q_bias=torch.zeros(Q), k_bias=torch.zeros(KV), v_bias=torch.zeros(KV))
    weights |= {name: torch.ones(config.head_dim) for name in ("q_norm", "k_norm")}
    norm = runner.final_norm()
    weights["shared_head_norm"] = norm.float().cpu() if norm is not None and norm.shape == (H,) \
        else torch.ones(H)
    weights["lm_head"] = runner.output_rows(torch.arange(config.vocab_size)).float().cpu()
    head = MtpHead(MtpHeadConfig(block=config, layout="deepseek", mask_first_embed=True), weights)
    for name, p in head.named_parameters():
        p.requires_grad_(name != "lm_head")
    return head


class MtpIO:
    """``trainer.HeadIO`` for MTP modules: the folder of the module docstring. ``target_config``:
    the target's config.json (copied into each checkpoint, so draft-mtp reads the block's shape)."""

    def __init__(self, target_config: dict) -> None:
        self.target_config = {**target_config, "num_nextn_predict_layers": 1}

    def save(self, head: MtpHead, folder: Path, dtype: torch.dtype = torch.bfloat16) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        params = dict(head.named_parameters())
        tensors = {theirs: params[ours].detach().cpu().to(dtype).contiguous()
                   for ours, theirs in checkpoint_names(head.config.block).items()}
        tmp = folder / (WEIGHTS + ".tmp")
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        tmp.replace(folder / WEIGHTS)  # a reader never sees half a file
        (folder / "config.json").write_text(json.dumps(self.target_config, indent=2) + "\n")
        return folder

    def load_into(self, head: MtpHead, folder: Path) -> None:
        params = dict(head.named_parameters())
        with safe_open(str(Path(folder) / WEIGHTS), framework="pt") as f, torch.no_grad():
            for ours, theirs in checkpoint_names(head.config.block).items():
                params[ours].copy_(f.get_tensor(theirs).to(params[ours].dtype))
