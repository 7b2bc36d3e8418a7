"""`specdec train eagle3|mtp` at work: self-distil data from the target, then train and save a head
(the flags are in ``train/cli.py``; the MTP module's own parts in ``train/mtp.py``)."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from specdec.errors import ModelLoadError, UsageError
from specdec.model.eagle_checkpoint import check_target, load_head, tokenizer_hash
from specdec.model.eagle_head import EagleHead, EagleHeadConfig, default_feature_layers
from specdec.model.mtp_checkpoint import check_supported
from specdec.runners.load import load_runner
from specdec.text import load_tokenizer
from specdec.train import data as train_data
from specdec.train.config import TrainConfig
from specdec.train.mtp import MtpIO, new_mtp_head
from specdec.train.prompts import build_prompts, read_prompt_file, self_instruct_requests
from specdec.train.trainer import Tables, Trainer, split
from specdec.train.vocab import choose_vocab, coverage


def cmd_train(args: argparse.Namespace) -> int:
    out = Path(args.out)
    data = Path(args.data_dir) if args.data_dir else out / "data"
    if args.resume and not (out / "state" / "progress.json").is_file():
        raise UsageError(f"--resume: {out} holds no training state")
    if not args.resume and args.steps > 0 and (out / "state").exists():
        raise UsageError(f"{out} already holds a training run: pass --resume to continue it, or choose another --out")
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return_freed_memory()
    runner, folder = load_runner(args.target, device=str(device), max_seq_len=1024, num_slots=args.batch_size)
    target = getattr(runner, "config", None)
    if target is None:
        raise UsageError("training a head needs a target the native runner supports (Llama, Qwen, Mistral, Gemma3)")
    tokenizer = load_tokenizer(folder)
    mtp = args.method == "mtp"
    if mtp:
        try:
            check_supported(target, json.loads((folder / "config.json").read_text()))
        except ModelLoadError as exc:
            raise UsageError(str(exc).replace("draft-mtp", "train mtp", 1)) from None
    head = load_head(out / "state") if args.resume and not mtp else None
    if head is None and getattr(args, "init", None):
        head = _init_head(args, target, tokenizer)
    # a resumed head reads the layers it was built for, in collection too; an MTP module reads the final
    # state (cached with any layers): it collects the eagle3 default's, so one collection serves both
    cached = (train_data.read_manifest(data) or {}).get("layers")
    layers = head.config.feature_layers if head is not None else (
        tuple(cached) if mtp and cached else _layers(None if mtp else args.layers, target.num_layers))
    manifest = _collect(args, runner, tokenizer, data, layers)
    if not manifest["shards"]:
        raise UsageError("the training data yields no examples (no prompt produced a response)")
    if args.steps == 0:
        return 0
    try:
        store = train_data.SampleStore(data, (-1,) if mtp else layers)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    io = MtpIO(json.loads((folder / "config.json").read_text())) if mtp else None
    if head is None:
        head = new_mtp_head(runner, args.seed) if mtp else _new_head(args, target, tokenizer, runner, store, layers)
    head = head.to(device)
    parallel = 0 if mtp else head.config.parallel_tokens
    V = target.vocab_size
    rows = head.lm_head.detach() if mtp else runner.output_rows(
        head.draft_to_target(torch.arange(head.config.draft_vocab_size, device=device)).cpu())
    tables = Tables(embed=runner.embed(torch.arange(V)).to(device), target_rows=rows.to(device))
    config = TrainConfig(steps=args.steps, lr=args.lr, batch_tokens=args.batch_tokens,
                         ttt_steps=parallel or args.ttt_steps, eval_every=args.eval_every, seed=args.seed,
                         bf16=args.precision == "bf16", parallel=parallel > 0,
                         train_lm_head=getattr(args, "train_lm_head", False))
    out.mkdir(parents=True, exist_ok=True)  # (the data may live elsewhere: --data-dir)
    trainer = Trainer(head, tables, data, out, config, device, io)
    if args.resume:
        trainer.load_state()
    last = trainer.train(log=lambda line: tqdm.write(line, file=sys.stderr))
    what = "MTP module" if mtp else "P-EAGLE head" if parallel else "head"
    print(f"specdec: {what} saved to {out} (best validation tau {trainer.best_tau:.2f}; last {last.get('tau', 0):.2f})",
          file=sys.stderr)
    return 0


def return_freed_memory() -> None:
    """Serve every large CPU tensor from its own mapping, handed back to the system when freed.

    Each batch has its own sequence length, so training allocates tensors of ever-changing
    sizes; with glibc's default (a threshold that rises as large blocks are freed) they came
    from the heap, which kept the freed blocks: the default model's training grew to 6.4 GB.
    """
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD, fixed at 1 MiB
    except (OSError, AttributeError):
        pass  # not glibc


def _layers(text: str | None, num_layers: int) -> tuple[int, ...]:
    if not text:
        return default_feature_layers(num_layers)
    try:
        layers = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"--layers: expected a comma list of layer numbers, got {text!r}") from None
    if not layers or any(not 0 <= i < num_layers for i in layers):
        raise UsageError(f"--layers: layers must be in 0..{num_layers - 1}")
    return layers


def _collect(args, runner, tokenizer, data: Path, layers: tuple[int, ...]) -> dict:
    if args.data:
        try:
            prompts = list(read_prompt_file(args.data))[: args.samples]
        except (OSError, ValueError) as exc:
            raise UsageError(f"--data {args.data}: {exc}") from None
        own: list[str] = []
    else:
        prompts = build_prompts(args.samples, args.seed)
        own = self_instruct_requests(args.samples, args.seed)
    cached = train_data.read_manifest(data) or {}
    done = cached.get("prompts_done", 0)
    if set(layers) <= set(cached.get("layers", ())):
        layers = tuple(cached["layers"])  # data cached for more layers: extend it in kind
    bar = tqdm(total=len(prompts), initial=min(done, len(prompts)), desc="self-distil", unit="prompt",
               dynamic_ncols=True)

    def progress(n: int, tokens: int) -> None:
        bar.update(n - bar.n)
        bar.set_postfix(tokens=tokens)

    meta = {"target": args.target or "default", "seed": args.seed, "source": args.data or "built-in"}
    try:
        manifest = train_data.collect(
            runner, tokenizer, data, prompts, layers, seed=args.seed, greedy_fraction=args.greedy_fraction,
            max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, meta=meta, progress=progress,
            self_instruct=own,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    bar.close()
    return manifest


def _new_head(args, target, tokenizer, runner, store, layers) -> EagleHead:
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


def _init_head(args, target, tokenizer) -> EagleHead:
    """A head started from ``--init``'s weights: its layer, feature layers and draft vocabulary, with
    ``--parallel``'s mask entry fresh. A P-EAGLE head so begins where a sequential head already
    drafts the first token well: on a 2-core CPU, what little data there is goes to the mask entries."""
    try:
        start = load_head(args.init)
        check_target(start, target, target.vocab_size, tokenizer, where=args.init)
    except ModelLoadError as exc:
        raise UsageError(f"--init: {exc}") from None
    if args.layers and _layers(args.layers, target.num_layers) != start.config.feature_layers:
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
        norm = getattr(getattr(runner, "model", None), "norm", None)
        if isinstance(norm, torch.Tensor) and norm.shape == head.norm.shape:
            head.norm.copy_(norm.float())
