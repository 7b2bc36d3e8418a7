"""TrainConfig: the training run's settings (no torch here: `specdec train --help` reads its defaults)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainConfig:
    steps: int = 2000
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup: int = 50
    batch_tokens: int = 2048  # entries per optimizer step (sequences are never split)
    ttt_steps: int = 4
    decay: float = 0.8  # loss weight of step k: decay ** k
    prompt_weight: float = 0.25  # loss weight of predicting prompt tokens (responses weigh 1)
    grad_clip: float = 1.0
    eval_every: int = 100
    max_val_tokens: int = 12_000  # the first validation sequences (by prompt index): a fixed set once filled
    seed: int = 0
    bf16: bool = True  # autocast matrix products to bfloat16 (2.8x faster on an AVX-512 BF16 CPU)
    parallel: bool = False  # train a P-EAGLE head: steps >= 1 read the mask entry (``train.ttt``)
    train_lm_head: bool = False  # the LM head starts as the target's own rows; frozen, it keeps the
    # head's output in the target's final-state space (less to learn from little data, and faster)
