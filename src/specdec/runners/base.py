"""The runner contract: the target's weights and KV cache behind one call per pass.

Every pass is the same call: each sequence (a cache *slot*) brings its new
tokens, optionally shaped as a draft tree, and gets logits back. The new
tokens' K/V are written after the slot's length, which then grows by their
number. Afterwards the caller keeps what the verifier accepted:

- ``truncate(slot, length)``: roll the slot back to ``length`` tokens (a rejected
  chain suffix, or a probe that must not stay in the cache): O(1).
- ``commit(slot, start, keep)``: keep the new entries ``keep`` (indices into the
  last pass's tokens of that slot, which started at ``start``) packed at ``start``:
  the accepted path of a tree. A chain prefix is ``truncate(slot, start + n)``.

The runner alone owns the slots' lengths (``lengths[slot]``).

Shapes: ``config`` is the target's ``ModelConfig`` (None where transformers runs the model).

Hidden states: ``run(seqs, hidden_layers=(i, ...))`` also returns, per sequence,
the hidden state after each decoder layer ``i`` for every new token ([T, H];
``-1`` is the final normed state). Trained drafters (EAGLE-style heads) read
them; ``tests/test_runner.py`` pins them against transformers. Such heads also look
tokens up in the target's own tables: ``embed(ids)`` (input embeddings) and
``output_rows(ids)`` (rows of the LM head, whose product with the final normed
state gives those tokens' logits).

Layer subsets: ``run(seqs, layers=(i, ...))`` runs only those decoder layers (then the
final norm and LM head); a layer not run passes the residual through and writes no K/V.
That is a layer-skipping draft of the model itself (``drafters.layerskip``): it runs on the
sequence's own slot, where the entries before the slot's length are the full model's, and
is truncated away before the verify pass rewrites those positions for every layer. Only
runners with ``supports_layer_skip`` take it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from specdec.config import ModelConfig
from specdec.model.quant import QuantMatrix
from specdec.pass_cost import PassCost


@dataclass
class SeqInput:
    """New tokens of one sequence for a pass.

    token_ids: tokens to run, the first one following the slot's last cache entry.
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
    logits: list[torch.Tensor]  # per sequence [T_i or 1, V] float32; empty where ``argmax`` came instead
    hidden: list[list[torch.Tensor]] = field(default_factory=list)  # per sequence, per layer [T_i, H]
    seconds: float = 0.0
    argmax: list[torch.Tensor] | None = None  # per sequence [T_i] int64: each row's argmax (``run(argmax=True)``)
    # per sequence its rows' softmax blocks (top, sums) [T_i, ceil(V / 64)] float32, where ``run(blocks=...)`` asked
    # and the runner sums them in its LM head (``row_dist.BlockDist``), else None
    blocks: list[tuple[np.ndarray, np.ndarray] | None] | None = None


def shared_start(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens ``a`` and ``b`` share from the start."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class ModelRunner(ABC):
    vocab_size: int
    max_seq_len: int
    eos_token_ids: tuple[int, ...]
    device: torch.device
    dtype: torch.dtype
    supports_trees: bool = False
    supports_layer_skip: bool = False  # ``run(..., layers=)`` runs a subset of the layers
    num_layers: int = 0  # decoder layers (0 when unknown)
    # The architecture, where specdec's own decoder runs it (native runners); None for a model run as
    # transformers builds it (generic runners): heads, layer-skip costs and training read its shapes
    config: ModelConfig | None = None
    backend: str = "torch"  # how the linear layers and attention run (see runners.load)
    weights_label: str = "float"  # the weights' format, for reports ("gguf Q4_1+Q8_0 (avx2+vnni)")
    kv_dtype: torch.dtype | None = None  # the KV cache's element type (None: ``dtype``)
    # Whether a pass gives every sequence the widest one's rows (a [B, T] batch) rather than
    # running their rows back to back: what a batch's extra draft tokens cost (see budget.py).
    pads_batches: bool = True
    # Whether a token's K/V are the same bits whichever pass computed them (each row runs the same
    # instructions at any pass width): then a freed slot's entries serve the next request that starts
    # with the same tokens (``allocate``), as llama-server's prompt cache and vLLM's prefix caching do.
    keeps_prefixes: bool = False

    def __init__(self, max_seq_len: int, num_slots: int) -> None:
        self.max_seq_len = max_seq_len
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))
        self.lengths = [0] * num_slots  # host-side: read every step, a device copy would sync
        self.pass_cost = PassCost()  # decode passes' seconds by width, timed by the engine
        self._kept: list[list[int]] = [[] for _ in range(num_slots)]  # a free slot's cached tokens

    def allocate(self, prefix: Sequence[int] = ()) -> int:
        """A free slot, empty; or, given ``prefix`` (the tokens the caller will cache first) where the runner
        ``keeps_prefixes``, the free slot whose cached tokens share the longest start with it, holding that
        start (``lengths[slot]``; the caller runs the rest). Where none shares any, one that keeps nothing,
        else the one freed longest ago: a conversation's next turn finds its slot after other requests came."""
        if not self._free:
            raise RuntimeError("no free KV cache slot")

        def rank(i: int) -> tuple[int, bool, int]:
            kept = self._kept[self._free[i]]
            return shared_start(kept, prefix) if prefix else 0, not kept, i if not kept else -i

        ranks = [rank(i) for i in range(len(self._free))]  # (each slot's shared start read once)
        pick = max(range(len(ranks)), key=ranks.__getitem__)
        shared = ranks[pick][0]
        slot = self._free.pop(pick)
        self.lengths[slot], self._kept[slot] = shared, []
        return slot

    def free(self, slot: int, tokens: Sequence[int] = ()) -> None:
        """Free ``slot``; ``tokens``: what it cached, from the start (its first ``lengths[slot]`` are kept
        for a later ``allocate`` where the runner ``keeps_prefixes``)."""
        self._kept[slot] = list(tokens[: self.lengths[slot]]) if self.keeps_prefixes else []
        self.lengths[slot] = 0
        self._free.append(slot)

    def forget_prefixes(self) -> None:
        """Drop what freed slots kept: the next requests start cold (the bench's cells)."""
        self._kept = [[] for _ in range(self.num_slots)]

    def weight_bytes(self) -> int:
        """Bytes of weights a decode pass reads (0 when unknown)."""
        return 0

    def kv_bytes(self) -> int:
        """Bytes of the KV cache (0 when unknown)."""
        return 0

    @property
    def kv_cache_label(self) -> str:
        """The KV cache's element type, for reports ("float32", "bfloat16")."""
        return str(self.kv_dtype or self.dtype).removeprefix("torch.")

    @abstractmethod
    def run(self, seqs: list[SeqInput], hidden_layers: tuple[int, ...] = (),
            layers: tuple[int, ...] | None = None, argmax: bool = False, path_only: bool = False,
            blocks: list[float] | None = None) -> PassOutput:
        """Run every sequence's new tokens in one pass; their K/V are appended to the cache.

        layers: the decoder layers to run (None = all; see the module docstring).
        argmax: each row's argmax is all the caller reads (greedy verification, nothing else on the
        logits): a runner that can returns ``PassOutput.argmax`` instead of logits, the same tokens
        torch.argmax of its logits would give (ties to the lower id); others return logits.
        path_only (with argmax): the caller walks the drafts greedily (``verify.verify_argmax``), so only the rows it
        can reach need their argmax, a row being reached where each token from its sequence's first row to it is its
        parent row's argmax; a runner may leave the others out of the LM head once a parent's argmax is shown to be
        another token, and give them -1.
        blocks (every row's logits wanted): per sequence the inverse temperature (``row_dist.inverse_temperature``)
        at which the caller reads its rows' softmax in 64-column blocks, 0 for none: a runner that can sums them in
        its LM head's sweep (``PassOutput.blocks``); others leave ``blocks`` None and the caller sums them itself.
        """

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """[n] token ids -> [n, H] float32 rows of the target's input embedding table."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its embeddings")

    def output_rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        """[n] token ids -> [n, H] float32 rows of the target's LM head."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its LM head")

    def final_norm(self) -> torch.Tensor | None:
        """[H] the weight of the final norm in front of the LM head (None where unknown): a head trained
        on the target's output space starts from it."""
        return None

    def quantized_lm_head(self) -> QuantMatrix | None:
        """The LM head as the CPU kernels hold it (quantized blocks), None where it is float: a draft head
        sharing the target's LM head drafts on the same blocks instead of a float copy."""
        return None

    def truncate(self, slot: int, length: int) -> None:
        """Roll ``slot`` back to its first ``length`` tokens."""
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"cannot truncate slot {slot} of length {self.lengths[slot]} to {length}")
        self.lengths[slot] = length

    def commit(self, slot: int, start: int, keep: list[int]) -> None:
        """Keep the last pass's new entries ``keep`` packed at ``start``; drop the rest."""
        if keep != list(range(len(keep))):
            raise ValueError(f"{type(self).__name__} keeps chain prefixes only")
        self.truncate(slot, start + len(keep))
