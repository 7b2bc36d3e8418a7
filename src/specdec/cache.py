"""Static KV cache: allocated once, written at explicit slots.

Each of ``num_slots`` rows holds one sequence. The runner owns each row's valid
length; everything past it is stale and masked out, so rolling back rejected
draft tokens is just moving that length (O(1), no copy).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from specdec.config import ModelConfig


class KVCache:
    def __init__(
        self,
        config: ModelConfig,
        num_slots: int,
        max_seq_len: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        shape = (config.num_layers, num_slots, config.num_kv_heads, max_seq_len, config.head_dim)
        # k_all, v_all: [layers, slots, kv_heads, max_seq_len, head_dim]; k[layer], v[layer] are views
        self.k_all = zeros(shape, dtype, torch.device(device))
        self.v_all = zeros(shape, dtype, torch.device(device))
        self.k, self.v = list(self.k_all), list(self.v_all)

    @property
    def nbytes(self) -> int:
        return 2 * self.k_all.numel() * self.k_all.element_size()

    def compact(self, slot: int, start: int, keep: list[int]) -> None:
        """Move entries ``start + keep[i]`` to ``start + i`` (the accepted path of a tree).

        After verifying a tree, the accepted path's nodes are scattered among the
        rejected ones; this packs them into place. A chain keeps 0..n-1: no copy.
        """
        if keep != list(range(len(keep))):
            src = torch.tensor([start + i for i in keep], device=self.k_all.device)
            dst = slice(start, start + len(keep))
            for cache in (self.k_all, self.v_all):
                cache[:, slot, :, dst] = cache[:, slot, :, src]


_ALIGN = 4096


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed cache tensor; on the CPU numpy's memory, which asks Linux for transparent huge pages (torch's
    allocator does not): a 1-row pass's attention over 2,000 tokens of context took 0.91x the time on Zen 4
    (``scripts/attention_stream.py``; the hardware prefetcher stops at each 4 KiB page, a huge page also spares
    the TLB)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    size = dtype.itemsize
    nbytes = size * math.prod(shape)
    raw = np.zeros(nbytes + _ALIGN, dtype=np.uint8)  # (a large block starts 16 bytes into its pages)
    start = -raw.ctypes.data % _ALIGN  # rows aligned as torch's: a 512-byte key row in 8 cache lines, not 9
    return torch.from_numpy(raw[start : start + nbytes].view(f"int{8 * size}").reshape(shape)).view(dtype)
