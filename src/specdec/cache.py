"""Static KV cache: allocated once, written at explicit slots.

Each of ``num_slots`` rows holds one sequence. A row's valid length lives in
``lengths``; everything past it is stale and masked out, so rolling back
rejected draft tokens is just moving that pointer (O(1), no copy).
"""

from __future__ import annotations

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
        shape = (num_slots, config.num_kv_heads, max_seq_len, config.head_dim)
        # k[layer], v[layer]: [slots, kv_heads, max_seq_len, head_dim]
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        # Host-side lengths: the scheduler reads them every step, a device copy would sync.
        self.lengths = [0] * num_slots

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def reset(self, slot: int) -> None:
        self.lengths[slot] = 0

    def truncate(self, slot: int, length: int) -> None:
        """Roll back ``slot`` to ``length`` tokens (drops rejected draft tokens)."""
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"cannot truncate slot {slot} of length {self.lengths[slot]} to {length}")
        self.lengths[slot] = length

    def compact(self, slot: int, start: int, keep: list[int]) -> None:
        """Move entries ``start + keep[i]`` to ``start + i`` and set the length to start + len(keep).

        After verifying a tree, the accepted path's nodes are scattered among the
        rejected ones; this packs them into place. A chain keeps 0..n-1: no copy.
        """
        if keep != list(range(len(keep))):
            src = torch.tensor([start + i for i in keep], device=self.k[0].device)
            dst = slice(start, start + len(keep))
            for cache in self.k + self.v:
                cache[slot, :, dst] = cache[slot, :, src]
        self.lengths[slot] = start + len(keep)
