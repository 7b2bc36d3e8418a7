"""Train an EAGLE-3 head on cached self-distillation data, resumably.

The loop: batches of whole sequences (about ``batch_tokens`` entries each) ->
``ttt.ttt_loss`` (the head unrolled ``ttt_steps`` deep) -> AdamW with warm-up
and cosine decay. Every ``eval_every`` steps the validation split (greedy
responses of every 20th prompt) gives the per-step acceptance of a greedy chain
and its tau; the best head so far is written to ``DIR`` (speculators layout,
bfloat16), every validated head to ``DIR/checkpoints/step-N``, and the full state
(float32 head, optimizer, step) to ``DIR/state`` so ``--resume`` continues exactly.
``DIR/metrics.jsonl`` keeps one line per validation: the learning curve (tau
against training tokens seen and the distinct tokens available).

The head is an EAGLE-3 head (saved in the speculators layout) or an MTP module
(``train.mtp``: saved in the DeepSeek layout draft-mtp loads); ``HeadIO`` is how
each is written and read back.

The data folder is read again at every epoch, so a collector still adding
shards (a second ``specdec train`` process with ``--steps 0``) feeds a running
trainer.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import torch
from tqdm import tqdm

from specdec.model.eagle_checkpoint import load_head, save_head
from specdec.model.eagle_head import EagleHead
from specdec.train.config import TrainConfig
from specdec.train.data import Sample, SampleStore
from specdec.train.ttt import StepMetrics, chain_tau, make_batch, ttt_loss


class HeadIO(Protocol):
    """How a trained head is written (``save``: the checkpoint, bfloat16 unless told) and how a
    saved state is read back into the head being trained (``load_into``)."""

    def save(self, head: torch.nn.Module, folder: Path, dtype: torch.dtype = torch.bfloat16) -> Path: ...

    def load_into(self, head: torch.nn.Module, folder: Path) -> None: ...


class EagleIO:
    """EAGLE-3 heads: ``model.eagle_checkpoint``'s speculators layout."""

    def save(self, head: torch.nn.Module, folder: Path, dtype: torch.dtype = torch.bfloat16) -> Path:
        return save_head(head, folder, dtype=dtype)

    def load_into(self, head: torch.nn.Module, folder: Path) -> None:
        head.load_state_dict(load_head(folder, head.d2t.device).state_dict())


VAL_EVERY = 20  # prompts whose index is a multiple of this form the validation split


@dataclass
class Tables:
    """What the head borrows from the target during training."""

    embed: torch.Tensor  # [V, H] the target's input embeddings
    target_rows: torch.Tensor  # [Vd, H] the target's LM-head rows of the draft vocabulary


def split(store: SampleStore) -> tuple[list[int], list[int]]:
    """(train ids, validation ids): validation = greedy responses to every VAL_EVERY-th prompt
    (in a small set without one, the first greedy response)."""
    train, val = [], []
    for i, tag in enumerate(store.tags):
        if tag % VAL_EVERY == 0:
            if store.greedy[i]:
                val.append(i)
        else:
            train.append(i)
    if not val and len(train) > 1:
        first = min((i for i in train if store.greedy[i]), key=lambda i: store.tags[i], default=None)
        if first is not None:
            train.remove(first)
            val.append(first)
    return train, val


def batches(store: SampleStore, ids: list[int], budget: int, rng: random.Random) -> list[list[int]]:
    """Shuffled ids grouped by similar length (little padding), each group under ``budget`` padded entries."""
    ids = list(ids)
    rng.shuffle(ids)
    length = lambda i: store.index[i][2] - store.index[i][1] - 1  # noqa: E731
    out: list[list[int]] = []
    for lo in range(0, len(ids), 64):  # sort within windows: random across, similar within
        window = sorted(ids[lo : lo + 64], key=length)
        group: list[int] = []
        for i in window:
            if group and max(length(j) for j in [*group, i]) * (len(group) + 1) > budget:
                out.append(group)
                group = []
            group.append(i)
        if group:
            out.append(group)
    rng.shuffle(out)
    return out


class Trainer:
    def __init__(self, head: EagleHead, tables: Tables, data: Path, out: Path, config: TrainConfig,
                 device: torch.device, io: HeadIO | None = None) -> None:
        self.head, self.tables, self.data, self.out, self.config, self.device = head, tables, data, out, config, device
        self.io = io or EagleIO()
        lm_head = head.lm_head
        (lm_head if isinstance(lm_head, torch.nn.Parameter) else lm_head.weight).requires_grad_(config.train_lm_head)
        params = [p for p in head.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        self.step = 0
        self.tokens_seen = 0
        self.best_tau = 0.0
        self.rng = random.Random(config.seed)

    # -- state ---------------------------------------------------------------------------------
    def save_state(self) -> None:
        state = self.out / "state"
        self.io.save(self.head, state, dtype=torch.float32)
        torch.save(self.optimizer.state_dict(), state / "optimizer.pt.tmp")
        (state / "optimizer.pt.tmp").replace(state / "optimizer.pt")
        progress = dict(step=self.step, tokens_seen=self.tokens_seen, best_tau=self.best_tau,
                        config=asdict(self.config))
        (state / "progress.json").write_text(json.dumps(progress))

    def load_state(self) -> None:
        state = self.out / "state"
        self.io.load_into(self.head, state)
        self.optimizer.load_state_dict(torch.load(state / "optimizer.pt", weights_only=True))
        progress = json.loads((state / "progress.json").read_text())
        self.step, self.tokens_seen, self.best_tau = progress["step"], progress["tokens_seen"], progress["best_tau"]
        self.rng = random.Random(self.config.seed * 1_000_003 + self.step)  # a fresh shuffle from here on

    # -- loop ----------------------------------------------------------------------------------
    def lr_at(self, step: int) -> float:
        c = self.config
        if step < c.warmup:
            return c.lr * (step + 1) / c.warmup
        t = (step - c.warmup) / max(1, c.steps - c.warmup)
        return c.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))

    def train(self, log: Callable[[str], None] = print) -> dict:
        c = self.config
        bar = tqdm(total=c.steps, initial=self.step, desc="train", unit="step", dynamic_ncols=True,
                   mininterval=1 if sys.stderr.isatty() else 60)
        last: dict = {}
        while self.step < c.steps:
            # re-read: a collector may have added shards
            store = SampleStore(self.data, self.head.config.feature_layers)
            train_ids, val_ids = split(store)
            if not train_ids:
                raise ValueError(f"no training examples in {self.data}")
            for group in batches(store, train_ids, c.batch_tokens, self.rng):
                if self.step >= c.steps:
                    break
                stats = self.train_step([store[i] for i in group])
                bar.update(1)
                post = {"loss": f"{stats.loss:.3f}"}
                post |= {f"acc{k}": f"{v:.2f}" for k, v in enumerate(self._cond(stats.correct, stats.total))}
                if last:
                    post["val_tau"] = f"{last['tau']:.2f}"
                bar.set_postfix(post)
                if self.step % c.eval_every == 0 or self.step == c.steps:
                    last = self.validate(store, val_ids)
                    log(json.dumps(last))
        bar.close()
        return last

    def train_step(self, samples: list[Sample]) -> StepMetrics:
        self.head.train()
        batch = make_batch(samples, self.config.prompt_weight, self.device)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(self.step)
        with self._autocast():
            loss, stats = ttt_loss(self.head, batch, self.tables.embed, self.tables.target_rows,
                                   self.config.ttt_steps, self.config.decay, self.config.parallel)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), self.config.grad_clip)
        self.optimizer.step()
        self.step += 1
        self.tokens_seen += batch.num_tokens
        return stats

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.config.bf16)

    @staticmethod
    def _cond(correct: list[int], total: int) -> list[float]:
        """Per-step acceptance: P(step k right | steps < k right)."""
        prev, out = total, []
        for c in correct:
            out.append(c / prev if prev else 0.0)
            prev = c
        return out

    @torch.no_grad()
    def validate(self, store: SampleStore, val_ids: list[int]) -> dict:
        self.head.eval()
        correct = [0] * self.config.ttt_steps
        total, loss_sum, n, used = 0, 0.0, 0, 0
        for i in sorted(val_ids, key=lambda i: store.tags[i]):
            if used >= self.config.max_val_tokens:
                break
            batch = make_batch([store[i]], self.config.prompt_weight, self.device)
            with self._autocast():
                loss, stats = ttt_loss(self.head, batch, self.tables.embed, self.tables.target_rows,
                                       self.config.ttt_steps, self.config.decay, self.config.parallel)
            used += batch.num_tokens
            loss_sum, n, total = loss_sum + stats.loss, n + 1, total + stats.total
            correct = [a + b for a, b in zip(correct, stats.correct + [0] * (len(correct) - len(stats.correct)),
                                             strict=True)]
        tau = chain_tau(correct, total)
        held_out = set(val_ids)
        train_ids = [i for i in range(len(store)) if i not in held_out]
        record = dict(step=self.step, tokens_seen=self.tokens_seen, train_sequences=len(train_ids),
                      train_tokens=store.num_tokens(train_ids),
                      val_loss=loss_sum / max(n, 1), acceptance=[round(a, 4) for a in self._cond(correct, total)],
                      tau=round(tau, 4), val_tokens=total, time=time.strftime("%Y-%m-%d %H:%M:%S"))
        with (self.out / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")
        if tau > self.best_tau or not (self.out / "model.safetensors").exists():
            self.best_tau = max(tau, self.best_tau)
            self.io.save(self.head, self.out)
        self.io.save(self.head, self.out / "checkpoints" / f"step-{self.step}")
        self.save_state()
        return record
