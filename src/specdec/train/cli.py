"""`specdec train eagle3|mtp`: self-distil data from the target, then train and save a head.

    specdec train eagle3 --target M --out DIR [--data FILE] [--samples N] [--steps N]
                         [--draft-vocab N] [--parallel K] [--init HEAD] [--device cpu|cuda] [--resume]
    specdec train mtp    --target M --out DIR [--data-dir DIR/data of an eagle3 run] ...

eagle3 trains an EAGLE-3 head (with ``--parallel K`` a P-EAGLE head that drafts K tokens
in one pass: --spec-parallel-drafting); mtp trains a DeepSeek-style MTP module for a
target that ships none (``--spec-type draft-mtp --spec-model DIR``). Both read the same
self-distillation data, so an eagle3 run's ``--data-dir`` serves an mtp run.

Both phases resume: data already cached in DIR/data is kept and extended up to
``--samples`` prompts; ``--resume`` continues training from DIR/state. ``--steps 0``
only collects data (run it beside a training process to feed it more).

The flags; the run is ``train/run.py``, imported when a command runs, so --help and argument
errors answer without loading torch.
"""

from __future__ import annotations

import argparse

from specdec.cli.args import positive_int
from specdec.train.config import TrainConfig


def add_train_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="method", required=True, parser_class=type(p))
    e = sub.add_parser("eagle3", help="train an EAGLE-3 head for a target model")
    _add_common(e, "the head")
    e.add_argument("--draft-vocab", type=positive_int, default=8192, help="reduced draft vocabulary size")
    e.add_argument("--layers", default=None, help="target layers read, comma list (default: EAGLE-3's low,mid,high)")
    e.add_argument("--parallel", type=positive_int, default=None, metavar="K",
                   help="train a P-EAGLE head that drafts K tokens in one pass from mask entries "
                        "(--spec-parallel-drafting); sets --ttt-steps K")
    e.add_argument("--init", default=None, metavar="HEAD",
                   help="start from this EAGLE-3 head's weights, layers and draft vocabulary (same target; "
                        "--draft-vocab unused), e.g. a P-EAGLE head from a sequential one: the mask entry starts fresh")
    e.add_argument("--train-lm-head", action="store_true",
                   help="train the head's LM head too (default: frozen at the target's rows)")
    m = sub.add_parser("mtp", help="train a multi-token-prediction module for a target that has none "
                                   "(--spec-type draft-mtp --spec-model DIR)")
    _add_common(m, "the module")
    m.set_defaults(train_lm_head=False)  # its LM head is the target's, frozen and never stored


def _add_common(e: argparse.ArgumentParser, what: str) -> None:
    e.add_argument("--target", default=None, help="target model (default: SmolLM2-135M-Instruct)")
    e.add_argument("--out", required=True, help=f"folder for {what}, its data and its training state")
    e.add_argument("--data", default=None, help="prompts (JSONL with a \"prompt\" per line, or text lines) "
                                                "instead of the built-in offline sources")
    e.add_argument("--data-dir", default=None,
                   help="cached self-distillation data (default OUT/data); another run's, e.g. an eagle3 run's "
                        "OUT/data, is reused and extended")
    e.add_argument("--samples", type=int, default=4000, help="prompts to self-distil (cached; extended on reruns)")
    e.add_argument("--steps", type=int, default=2000, help="optimizer steps (0 = only collect data)")
    e.add_argument("--device", default=None, choices=["cpu", "cuda"], help="default: cuda when present")
    e.add_argument("--resume", action="store_true", help="continue the training state in --out")
    e.add_argument("--lr", type=float, default=TrainConfig.lr)
    e.add_argument("--batch-tokens", type=positive_int, default=TrainConfig.batch_tokens)
    e.add_argument("--ttt-steps", type=positive_int, default=TrainConfig.ttt_steps,
                   help="training-time test depth: steps the head is unrolled on its own predictions")
    e.add_argument("--eval-every", type=positive_int, default=TrainConfig.eval_every)
    e.add_argument("--max-new-tokens", type=positive_int, default=256, help="longest self-distilled response")
    e.add_argument("--batch-size", type=positive_int, default=12, help="sequences decoded together")
    e.add_argument("--greedy-fraction", type=float, default=0.75, help="share of greedy (vs sampled) responses")
    e.add_argument("--threads", type=positive_int, default=None, help="CPU threads (default: all)")
    e.add_argument("--precision", default="bf16", choices=["bf16", "fp32"],
                   help="training matrix products (bf16 autocast; fp32 where a CPU lacks fast bfloat16)")
    e.add_argument("--seed", type=int, default=0)


def cmd_train(args: argparse.Namespace) -> int:
    from specdec.train.run import cmd_train as run  # torch, the target, the trainer: loaded only to train

    return run(args)
