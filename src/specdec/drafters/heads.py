"""Trained draft heads: the one place their checkpoints become modules on the target's device.

Two kinds read the target's hidden states and draft through one decoder block of their own:
an EAGLE-3 head (``model.eagle_head``, drafters/eagle.py) and a multi-token-prediction module
(``model.mtp_head``, drafters/mtp.py). Both load here the same way: the checkpoint is read
and checked against the target (``model.eagle_checkpoint``, ``model.mtp_checkpoint``, which
know files, not runners), put on the target's device, and on a CPU quantized for int8
drafting. ``DraftHead`` is what a drafter steps through, whichever kind it holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from specdec.model.eagle_checkpoint import check_parallel, check_target, load_head
from specdec.model.eagle_head import EagleHead
from specdec.model.mtp_checkpoint import read_mtp_module
from specdec.model.mtp_head import MtpHead
from specdec.runners.base import ModelRunner


class DraftHead(Protocol):
    """One step of a trained head (H: the target's hidden size; T: rows of the step)."""

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """[T, F] target features -> [T, H] the head's input state."""

    def qkv(self, hidden: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor): ...

    def finish(self, residual: torch.Tensor, attn: torch.Tensor) -> torch.Tensor: ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[T, H] -> [T, V_draft] over the head's draft vocabulary."""

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> the target's ids."""


def load_eagle_head(folder: str, target: ModelRunner, tokenizer, parallel: bool = False) -> EagleHead:
    """The head in ``folder``, checked against the target (and, with ``parallel``, that it was trained
    for parallel drafting). None ships (``SpecConfig`` asks for the folder): a head ships only where it
    beats plain decoding, and none a 2-core CPU could train does (docs/eagle3.md)."""
    path = Path(folder).expanduser()
    head = load_head(path, target.device)
    check_target(head, target.config, target.vocab_size, tokenizer, where=str(path))
    check_parallel(head, parallel, where=str(path))
    if head.d2t.device.type == "cpu":
        head.quantize_for_cpu()
    return head


def load_mtp_head(model: str | None, target: ModelRunner) -> MtpHead:
    """The MTP module inside ``model``'s checkpoint (the one ``target`` runs, or a folder `specdec train
    mtp` wrote for it), float32 on the target's device."""
    module = read_mtp_module(model, target.config, target.output_rows)
    head = MtpHead(module.config, module.weights).to(target.device).eval()
    if head.eh_proj.device.type == "cpu":  # int8 drafting; a shared head on the target's own quantized rows
        head.quantize_for_cpu(target.quantized_lm_head() if module.shares_lm_head else None)
    return head
