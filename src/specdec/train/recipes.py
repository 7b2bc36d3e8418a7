"""One recipe per training method: what `specdec train eagle3` and `specdec train mtp` do differently.

``train.run.cmd_train`` is the shared pipeline (load the target, self-distil, train, save);
it asks the method's recipe each question whose answer differs: which targets it can
train for, the head it starts from, the target layers it reads, the output rows it is
distilled against and how it is saved. Adding a method is one class here and one
sub-command in ``train/cli.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Protocol

import torch

from specdec.config import ModelConfig
from specdec.errors import ModelLoadError, UsageError
from specdec.model.eagle_checkpoint import check_target, load_head, tokenizer_hash
from specdec.model.eagle_head import EagleHead, EagleHeadConfig, default_feature_layers
from specdec.model.mtp_checkpoint import check_supported
from specdec.train.mtp import MtpIO, new_mtp_head
from specdec.train.trainer import split
from specdec.train.vocab import choose_vocab, coverage


class Recipe(Protocol):
    """What a training method decides; ``args`` are its sub-command's flags (``train/cli.py``)."""

    def check(self, target: ModelConfig, folder: Path) -> None:
        """UsageError (one line) when the method cannot train for this target."""

    def start(self, args: argparse.Namespace, target: ModelConfig, tokenizer, out: Path) -> torch.nn.Module | None:
        """The head training continues from (--resume, --init), or None for a fresh one."""

    def feature_layers(self, args: argparse.Namespace, target: ModelConfig, cached: tuple[int, ...]) -> tuple[int, ...]:
        """Target layers to collect for a fresh head (``cached``: those the data already holds)."""

    def store_layers(self, layers: tuple[int, ...]) -> tuple[int, ...]:
        """The collected layers the head reads back from the store."""

    def new_head(self, args: argparse.Namespace, target: ModelConfig, tokenizer, runner, store,
                 layers: tuple[int, ...]) -> torch.nn.Module: ...

    def target_rows(self, head: torch.nn.Module, runner, device: torch.device) -> torch.Tensor:
        """[V_draft, H] the target's output rows the head's logits are distilled against."""

    def io(self, folder: Path):
        """``trainer.HeadIO`` saving the head (None: the EAGLE-3 checkpoint format)."""

    def parallel_tokens(self, head: torch.nn.Module) -> int:
        """K tokens drafted per pass (P-EAGLE), 0 for a sequential head."""

    def label(self, head: torch.nn.Module) -> str: ...


class Eagle3Recipe:
    """An EAGLE-3 head (a P-EAGLE head with --parallel K): reads low, middle and high target layers,
    drafts over a reduced vocabulary chosen from the training tokens."""

    def check(self, target: ModelConfig, folder: Path) -> None:
        pass  # every target the native runner loads

    def start(self, args, target, tokenizer, out):
        if args.resume:
            return load_head(out / "state")
        return init_head(args, target, tokenizer) if args.init else None

    def feature_layers(self, args, target, cached):
        return parse_layers(args.layers, target.num_layers)

    def store_layers(self, layers):
        return layers

    def new_head(self, args, target, tokenizer, runner, store, layers):
        return new_eagle_head(args, target, tokenizer, runner, store, layers)

    def target_rows(self, head, runner, device):
        return runner.output_rows(head.draft_to_target(torch.arange(head.config.draft_vocab_size, device=device)).cpu())

    def io(self, folder):
        return None

    def parallel_tokens(self, head):
        return head.config.parallel_tokens

    def label(self, head):
        return "P-EAGLE head" if head.config.parallel_tokens else "head"


class MtpRecipe:
    """A DeepSeek-style MTP module (``train/mtp.py``): reads the target's final state, drafts with the
    target's own LM head; resumes from the trainer's state alone."""

    def check(self, target: ModelConfig, folder: Path) -> None:
        try:
            check_supported(target, json.loads((folder / "config.json").read_text()))
        except ModelLoadError as exc:
            raise UsageError(str(exc).replace("draft-mtp", "train mtp", 1)) from None

    def start(self, args, target, tokenizer, out):
        return None  # --resume: a fresh module, then the trainer loads its state

    def feature_layers(self, args, target, cached):
        # the final state is cached with any layers: collect the eagle3 default's, so one collection serves both
        return cached or default_feature_layers(target.num_layers)

    def store_layers(self, layers):
        return (-1,)

    def new_head(self, args, target, tokenizer, runner, store, layers):
        return new_mtp_head(runner, args.seed)

    def target_rows(self, head, runner, device):
        return head.lm_head.detach()

    def io(self, folder):
        return MtpIO(json.loads((folder / "config.json").read_text()))

    def parallel_tokens(self, head):
        return 0

    def label(self, head):
        return "MTP module"


RECIPES: dict[str, Recipe] = {"eagle3": Eagle3Recipe(), "mtp": MtpRecipe()}


def parse_layers(text: str | None, num_layers: int) -> tuple[int, ...]:
    """--layers: a comma list of target layers (None: EAGLE-3's low, middle and high)."""
    if not text:
        return default_feature_layers(num_layers)
    try:
        layers = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"--layers: expected a comma list of layer numbers, got {text!r}") from None
    if not layers or any(not 0 <= i < num_layers for i in layers):
        raise UsageError(f"--layers: layers must be in 0..{num_layers - 1}")
    return layers


def new_eagle_head(args, target, tokenizer, runner, store, layers) -> EagleHead:
    """A fresh head: its draft vocabulary the training tokens' most frequent, its LM head the target's rows."""
    config = EagleHeadConfig.for_target(target, args.draft_vocab, layers, verifier_name=args.target or "default",
                                        parallel_tokens=args.parallel or 0)
    config = replace(config, verifier={**config.verifier, "tokenizer_hash": tokenizer_hash(tokenizer)})
    head = EagleHead(config)
    train_ids, _ = split(store)
    counts = store.token_counts(target.vocab_size, train_ids)
    vocab = choose_vocab(counts, config.draft_vocab_size, always=target.eos_token_ids)
    head.set_vocab(vocab)
    print(f"specdec: draft vocabulary {len(vocab)} of {target.vocab_size} tokens covers "
          f"{coverage(counts, vocab):.1%} of the training tokens", file=sys.stderr)
    init_from_target(head, runner)
    return head


def init_head(args, target, tokenizer) -> EagleHead:
    """A head started from ``--init``'s weights: its layer, feature layers and draft vocabulary, with
    ``--parallel``'s mask entry fresh. A P-EAGLE head so begins where a sequential head already
    drafts the first token well: on a 2-core CPU, what little data there is goes to the mask entries."""
    try:
        start = load_head(args.init)
        check_target(start, target, target.vocab_size, tokenizer, where=args.init)
    except ModelLoadError as exc:
        raise UsageError(f"--init: {exc}") from None
    if args.layers and parse_layers(args.layers, target.num_layers) != start.config.feature_layers:
        raise UsageError(f"--init: {args.init} reads layers {start.config.feature_layers}, not --layers {args.layers}")
    head = EagleHead(replace(start.config, parallel_tokens=args.parallel or 0))
    missing, unexpected = head.load_state_dict(start.state_dict(), strict=False)
    if unexpected or any(not name.startswith("mask_") for name in missing):
        raise UsageError(f"--init: {args.init} does not fit the head being trained ({[*missing, *unexpected]})")
    print(f"specdec: head started from {args.init}"
          + (f" ({', '.join(missing)} fresh)" if missing else ""), file=sys.stderr)
    return head


def init_from_target(head: EagleHead, runner) -> None:
    """Start the LM head from the target's rows of the draft vocabulary (and its final norm), so the
    head's first task is only to reproduce the target's last hidden state; the rest small and random."""
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)
        head.lm_head.weight.copy_(runner.output_rows(head.draft_to_target(torch.arange(head.config.draft_vocab_size))))
        norm = runner.final_norm()
        if norm is not None and norm.shape == head.norm.shape:
            head.norm.copy_(norm.float())

