"""`specdec train eagle3|mtp` at work: self-distil data from the target, then train and save a head
(the flags are in ``train/cli.py``; what each method does its own way in ``train/recipes.py``)."""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from specdec.errors import UsageError
from specdec.runners.load import load_runner
from specdec.text import load_tokenizer
from specdec.train import data as train_data
from specdec.train.config import TrainConfig
from specdec.train.prompts import build_prompts, read_prompt_file, self_instruct_requests
from specdec.train.recipes import RECIPES
from specdec.train.trainer import Tables, Trainer


def cmd_train(args: argparse.Namespace) -> int:
    """The pipeline every method shares; what differs is asked of its recipe (``train/recipes.py``)."""
    recipe = RECIPES[args.method]
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
    target = runner.config
    if target is None:
        raise UsageError("training a head needs a target the native runner supports (Llama, Qwen, Mistral, Gemma3)")
    tokenizer = load_tokenizer(folder)
    recipe.check(target, folder)
    head = recipe.start(args, target, tokenizer, out)
    # a resumed head reads the layers it was built for, in collection too
    cached = tuple((train_data.read_manifest(data) or {}).get("layers", ()))
    layers = head.config.feature_layers if head is not None else recipe.feature_layers(args, target, cached)
    manifest = _collect(args, runner, tokenizer, data, layers)
    if not manifest["shards"]:
        raise UsageError("the training data yields no examples (no prompt produced a response)")
    if args.steps == 0:
        return 0
    try:
        store = train_data.SampleStore(data, recipe.store_layers(layers))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if head is None:
        head = recipe.new_head(args, target, tokenizer, runner, store, layers)
    head = head.to(device)
    parallel = recipe.parallel_tokens(head)
    tables = Tables(embed=runner.embed(torch.arange(target.vocab_size)).to(device),
                    target_rows=recipe.target_rows(head, runner, device).to(device))
    config = TrainConfig(steps=args.steps, lr=args.lr, batch_tokens=args.batch_tokens,
                         ttt_steps=parallel or args.ttt_steps, eval_every=args.eval_every, seed=args.seed,
                         bf16=args.precision == "bf16", parallel=parallel > 0, train_lm_head=args.train_lm_head)
    out.mkdir(parents=True, exist_ok=True)  # (the data may live elsewhere: --data-dir)
    trainer = Trainer(head, tables, data, out, config, device, recipe.io(folder))
    if args.resume:
        trainer.load_state()
    last = trainer.train(log=lambda line: tqdm.write(line, file=sys.stderr))
    print(f"specdec: {recipe.label(head)} saved to {out} (best validation tau {trainer.best_tau:.2f}; "
          f"last {last.get('tau', 0):.2f})", file=sys.stderr)
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
