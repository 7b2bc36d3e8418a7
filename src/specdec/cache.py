"""Static KV cache: allocated once, written at explicit slots.

Each of ``num_slots`` rows holds one sequence. The runner owns each row's valid
length; everything past it is stale and masked out, so rolling back rejected
draft tokens is just moving that length (O(1), no copy).
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
        shape = (config.num_layers, num_slots, config.num_kv_heads, max_seq_len, config.head_dim)
        # k_all, v_all: [layers, slots, kv_heads, max_seq_len, head_dim]; k[layer], v[layer] are views
        self.k_all = torch.zeros(shape, dtype=dtype, device=device)
        self.v_all = torch.zeros(shape, dtype=dtype, device=device)
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
