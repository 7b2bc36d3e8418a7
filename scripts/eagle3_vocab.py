"""How big should an EAGLE-3 head's draft vocabulary be? Coverage, acceptance and draft cost by size.

    python scripts/eagle3_vocab.py --data RUN/data --head DIR [--sizes 4096,8192,16384,32768,49152]
                                 [--out /tmp/eagle3-vocab] [--prompts scripts/eagle3-heldout.jsonl]

A head trained with the LM head frozen at the target's own rows (the default of `specdec train
eagle3`) keeps its layer's output in the target's final-state space, so the same trained layer can
be given any draft vocabulary: the N most frequent tokens of the training split, with the target's
rows for them. For each N this prints
- coverage: the share of validation tokens inside the vocabulary (an upper bound on acceptance),
- validation chain tau and acceptance at depths 1-4 (the trainer's own validation),
- real drafting on held-out chat prompts (scripts/eagle3_acceptance.py's tree 4x4/7, greedy, the
  engine checking every output against plain decoding): tau and drafting ms per step.
Timings move with other processes: run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import torch

from specdec.model.eagle_checkpoint import load_head, save_head
from specdec.model.eagle_head import EagleHead
from specdec.runners.load import load_runner
from specdec.train.data import SampleStore
from specdec.train.trainer import Tables, TrainConfig, Trainer, split
from specdec.train.vocab import choose_vocab, coverage


def with_vocab(head: EagleHead, runner, counts: torch.Tensor, size: int) -> EagleHead:
    """The trained layer of ``head`` with the ``size`` most frequent tokens and the target's rows for them."""
    variant = EagleHead(replace(head.config, draft_vocab_size=size))
    state = {k: v for k, v in head.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")}
    variant.load_state_dict(state, strict=False)
    vocab = choose_vocab(counts, size, always=runner.config.eos_token_ids)
    variant.set_vocab(vocab)
    with torch.no_grad():
        variant.lm_head.weight.copy_(runner.output_rows(vocab).float())
    return variant


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True, help="a training run's data folder (its train/validation split)")
    p.add_argument("--head", required=True, help="the head whose layer is re-vocabularied (e.g. tests/heads/...)")
    p.add_argument("--sizes", default="4096,8192,16384,32768,49152")
    p.add_argument("--out", default="/tmp/eagle3-vocab")
    p.add_argument("--prompts", default=str(Path(__file__).with_name("eagle3-heldout.jsonl")))
    p.add_argument("--max-new-tokens", type=int, default=96)
    args = p.parse_args()
    runner, _ = load_runner(None, max_seq_len=1024)
    head = load_head(args.head)
    # the premise: the trained head's LM head is the target's own rows (frozen in training)
    own = runner.output_rows(head.draft_to_target(torch.arange(head.config.draft_vocab_size))).float()
    drift = float((head.lm_head.weight.detach() - own).abs().max() / own.abs().max())
    print(f"head {args.head}: LM head vs the target's rows, max relative difference {drift:.4f}")
    store = SampleStore(Path(args.data), head.config.feature_layers)
    train_ids, val_ids = split(store)
    V = runner.config.vocab_size
    counts = store.token_counts(V, train_ids)
    val_counts = store.token_counts(V, val_ids)
    embed = runner.embed(torch.arange(V))
    print("| draft vocab | LM head int8 MB | coverage (train) | coverage (validation) | validation tau | "
          "acceptance 1-4 | held-out tau (tree 4x4/7) | draft ms / step |")
    print("|---:|---:|---:|---:|---:|---|---:|---:|")
    for size in (int(s) for s in args.sizes.split(",")):
        variant = with_vocab(head, runner, counts, min(size, V))
        folder = Path(args.out) / f"vocab-{size}"
        save_head(variant, folder)
        tables = Tables(embed, variant.lm_head.weight.detach().clone())
        trainer = Trainer(variant, tables, Path(args.data), folder / "validation", TrainConfig(), torch.device("cpu"))
        (folder / "validation").mkdir(exist_ok=True)
        record = trainer.validate(store, val_ids)
        vocab = variant.draft_to_target(torch.arange(variant.config.draft_vocab_size))
        drafted = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("eagle3_acceptance.py")), "--head", str(folder),
             "--prompts", args.prompts, "--max-new-tokens", str(args.max_new_tokens), "--shapes", "tree-4x4-7"],
            capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1].split("|")
        mb = variant.config.draft_vocab_size * variant.config.hidden_size * (1 + 4 / 32) / 2**20
        print(f"| {variant.config.draft_vocab_size} | {mb:.1f} | {coverage(counts, vocab):.1%} | "
              f"{coverage(val_counts, vocab):.1%} | {record['tau']:.3f} | "
              f"{' / '.join(f'{a:.3f}' for a in record['acceptance'])} | {drafted[2].strip()} | "
              f"{drafted[-2].strip()} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
