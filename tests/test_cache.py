"""The KV cache's memory: zeroed, contiguous, of its dtype, and on the CPU aligned to a page (numpy's memory,
whose large blocks start 16 bytes into their pages: unaligned, a key row spans one cache line more)."""

from __future__ import annotations

import pytest
import torch

from specdec.cache import zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cpu_cache_memory_is_zeroed_contiguous_and_page_aligned(dtype):
    t = zeros((2, 1, 2, 4096, 128), dtype, torch.device("cpu"))
    assert t.dtype == dtype and t.shape == (2, 1, 2, 4096, 128) and t.is_contiguous()
    assert t.data_ptr() % 4096 == 0
    assert not t.any()
    t[1, 0, 1, -1, -1] = 3.0  # writable, and every element its own
    assert float(t.sum()) == 3.0
