"""ModelRunner: owns the target's weights and KV cache; runs prefill, decode and verify passes.

Every pass is the same call: each sequence brings its new tokens, optionally
shaped as a draft tree, and gets logits back. The new tokens' K/V are written
after the sequence's cache length; ``commit`` then keeps the accepted ones.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdec.cache import KVCache
from specdec.config import ModelConfig
from specdec.model.transformer import Batch, Transformer
from specdec.model.weights import (
    ModelLoadError,
    load_state_dict,
    read_model_config,
    resolve_model,
)
from specdec.tree import DraftTree

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class SeqInput:
    """New tokens of one sequence for a pass.

    token_ids: tokens to run, the first one following the cache's last entry.
    parents:   None for a chain; for a tree, parents[i] < i is the index of token i's
               parent within token_ids (parents[0] == -1).
    all_logits: False returns only the last token's logits (prefill).
    """

    slot: int
    token_ids: list[int]
    parents: list[int] | None = None
    all_logits: bool = True


@dataclass
class PassOutput:
    logits: list[torch.Tensor]  # per sequence [T_i or 1, V] float32
    hidden: list[list[torch.Tensor]] = field(default_factory=list)  # per sequence, per layer [T_i, H]
    seconds: float = 0.0


class ModelRunner(ABC):
    vocab_size: int
    max_seq_len: int
    eos_token_ids: tuple[int, ...]
    device: torch.device
    dtype: torch.dtype
    supports_trees: bool = False
    matmul_backend: str = "n/a"  # see model.matmul; the native runner's is chosen at load

    def __init__(self, max_seq_len: int, num_slots: int) -> None:
        self.max_seq_len = max_seq_len
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))
        self.lengths = [0] * num_slots

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("no free KV cache slot")
        slot = self._free.pop()
        self.lengths[slot] = 0
        return slot

    def free(self, slot: int) -> None:
        self.lengths[slot] = 0
        self._free.append(slot)

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    @abstractmethod
    def run(self, seqs: list[SeqInput], hidden_layers: tuple[int, ...] = ()) -> PassOutput:
        """Run every sequence's new tokens in one pass; their K/V are appended to the cache."""

    @abstractmethod
    def commit(self, slot: int, start: int, keep: list[int]) -> None:
        """Keep the new entries ``keep`` (indices into the last pass's tokens) at ``start``."""


class NativeRunner(ModelRunner):
    supports_trees = True

    def __init__(
        self,
        model: Transformer,
        config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        max_seq_len: int,
        num_slots: int = 1,
    ) -> None:
        super().__init__(max_seq_len, num_slots)
        self.model, self.config = model, config
        self.vocab_size = config.vocab_size
        self.eos_token_ids = config.eos_token_ids
        self.dtype, self.device = dtype, device
        self.cache = KVCache(config, num_slots, max_seq_len, dtype, device)
        self.lengths = self.cache.lengths  # one source of truth

    @property
    def matmul_backend(self) -> str:  # type: ignore[override]
        return self.model.matmul_backend

    def run(self, seqs: list[SeqInput], hidden_layers: tuple[int, ...] = ()) -> PassOutput:
        t0 = time.perf_counter()
        batch, logits_rows = self._make_batch(seqs)
        with torch.inference_mode():
            logits, hidden = self.model(batch, self.cache, logits_rows, hidden_layers)
        out_logits, out_hidden = [], []
        for i, s in enumerate(seqs):
            n = len(s.token_ids)
            out_logits.append(logits[i, :n] if s.all_logits else logits[i, :1])
            out_hidden.append([h[i, :n] for h in hidden])
            self.lengths[s.slot] += n
        return PassOutput(out_logits, out_hidden, time.perf_counter() - t0)

    def commit(self, slot: int, start: int, keep: list[int]) -> None:
        self.cache.compact(slot, start, keep)

    def _make_batch(self, seqs: list[SeqInput]) -> tuple[Batch, torch.Tensor | None]:
        B = len(seqs)
        T = max(len(s.token_ids) for s in seqs)
        starts = [self.lengths[s.slot] for s in seqs]
        kv_len = max(st + T for st in starts)
        if kv_len > self.max_seq_len:
            raise ValueError(f"sequence would exceed the context of {self.max_seq_len} tokens")
        ids = torch.zeros(B, T, dtype=torch.long)
        depth = torch.zeros(B, T, dtype=torch.long)
        tree_mask = torch.zeros(B, T, T, dtype=torch.bool)
        need_mask = T > 1 or B > 1 or self._window_exceeded(kv_len)
        for i, s in enumerate(seqs):
            n = len(s.token_ids)
            ids[i, :n] = torch.tensor(s.token_ids)
            if s.parents is None:
                depth[i, :n] = torch.arange(n)
                tree_mask[i, :n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
            else:
                tree = DraftTree(s.token_ids, s.parents)
                depth[i, :n] = torch.tensor(tree.depths)
                tree_mask[i, :n, :n] = tree.ancestor_mask()
            tree_mask[i, n:, n:] = torch.eye(T - n, dtype=torch.bool)  # pads see themselves
        start_t = torch.tensor(starts).unsqueeze(1)  # [B, 1]
        mask = None
        if need_mask:
            rel = torch.arange(kv_len).unsqueeze(0) - start_t  # [B, L] index among new tokens
            in_new = (rel >= 0) & (rel < T)
            new_part = tree_mask.gather(2, rel.clamp(0, T - 1).unsqueeze(1).expand(B, T, kv_len))
            mask = ((rel < 0).unsqueeze(1) | (in_new.unsqueeze(1) & new_part)).unsqueeze(1)
            mask = mask.to(self.device)  # [B, 1, T, L]
        slots = [s.slot for s in seqs]
        batch = Batch(
            input_ids=ids.to(self.device),
            positions=(start_t + depth).to(self.device),
            slots=torch.tensor(slots, device=self.device),
            write_at=(start_t + torch.arange(T)).to(self.device),
            attn_mask=mask,
            kv_len=kv_len,
            contiguous=slots == list(range(B)),
        )
        logits_rows = None
        if not all(s.all_logits for s in seqs):
            last = [len(s.token_ids) - 1 for s in seqs]
            logits_rows = torch.tensor(last, device=self.device).unsqueeze(1)
            if any(s.all_logits for s in seqs):
                raise ValueError("a pass returns either all logits or the last ones for every sequence")
        return batch, logits_rows

    def _window_exceeded(self, kv_len: int) -> bool:
        w = self.config.sliding_window
        return w is not None and kv_len > w


def load_runner(
    model: str | None = None,
    dtype: str = "float32",
    device: str | None = None,
    max_seq_len: int = 4096,
    num_slots: int = 1,
    force_generic: bool = False,
    matmul: str = "auto",
) -> tuple[ModelRunner, Path]:
    """Load ``model`` (see ``resolve_model``) into the native runner, or the generic one."""
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    torch_dtype = DTYPES[dtype]
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    folder = resolve_model(model)
    config, raw = read_model_config(folder)
    if config is None or force_generic:
        from specdec.generic_runner import GenericRunner

        return GenericRunner(folder, torch_dtype, dev, max_seq_len, num_slots), folder
    max_seq_len = min(max_seq_len, config.max_position_embeddings)
    net = Transformer(config, max_seq_len)
    state = load_state_dict(folder, config, torch_dtype)
    missing, unexpected = net.load_state_dict(state, strict=False, assign=True)
    missing = [m for m in missing if not (m == "lm_head" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ModelLoadError(f"weights do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if config.tie_word_embeddings:
        net.lm_head = net.embed
    net.to(dev).eval()
    runner = NativeRunner(net, config, torch_dtype, dev, max_seq_len, num_slots)
    _bind_matmul(runner, matmul)
    return runner, folder


def _bind_matmul(runner: ModelRunner, backend: str = "auto") -> str:
    """Bind the native runner's matmul backend ("auto" = timed; see ``model.matmul``).

    Returns the backend in use ("n/a" for the generic runner). Off CPU, or in a dtype
    the CPU kernels lack, it is always torch.
    """
    if not isinstance(runner, NativeRunner):
        return "n/a"
    if runner.device.type != "cpu" or runner.dtype not in (torch.float32, torch.bfloat16):
        backend = "torch"
    used = runner.model.bind_linears(backend)
    if runner.device.type == "cpu":
        # NumPy's BLAS and numba run their own threads; torch's OpenMP pool spinning beside
        # them made every small op 3-4x slower here, and one thread loses nothing on tiny ops.
        torch.set_num_threads(1 if used == "numpy" else os.cpu_count() or 1)
    return used
