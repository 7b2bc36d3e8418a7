"""The native runner: our decoder over a static KV cache; trees too.

Each pass goes one of three ways, chosen in ``NativeRunner.run`` alone: the fused kernels
(``model.fused``: decode, verify, short prompts, anything over GGUF blocks), the torch
model's batched ops (``model.transformer``: a float prompt's many rows through BLAS, or every
pass on the ``torch`` backend), or a long prompt over GGUF blocks in fused chunks.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch

from specdec.cache import KVCache
from specdec.config import ModelConfig
from specdec.model import decoder_kernels
from specdec.model.decoder_kernels import Rows
from specdec.model.fused import FusedDecoder
from specdec.model.kernels import SOFTMAX_BLOCK
from specdec.model.quant import QuantMatrix, int8_rows
from specdec.model.transformer import Batch, Transformer
from specdec.runners.base import ModelRunner, PassOutput, SeqInput
from specdec.tree import DraftTree

FUSED_PREFILL_ROWS = 32  # a prompt chunk this short runs faster fused than through BLAS
QUANTIZED_PREFILL_ROWS = 256  # a long prompt over GGUF blocks runs in passes of this many tokens


class NativeRunner(ModelRunner):
    supports_trees = True
    supports_layer_skip = True

    def __init__(
        self,
        model: Transformer,
        config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        max_seq_len: int,
        num_slots: int = 1,
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        """kv_dtype: the KV cache's element type (None: ``dtype``)."""
        super().__init__(max_seq_len, num_slots)
        self.model, self.config = model, config
        self.vocab_size = config.vocab_size
        self.num_layers = config.num_layers
        self.eos_token_ids = config.eos_token_ids
        self.dtype, self.device = dtype, device
        self.backend = model.backend.name
        self.weights_label = model.weights_label(dtype)
        self.kv_dtype = kv_dtype or dtype
        self.cache = KVCache(config, num_slots, max_seq_len, self.kv_dtype, device)
        self.fused = FusedDecoder.from_model(model) if model.backend.fused else None
        # The fused kernels run a batch's rows back to back (``Rows``): a sequence drafting 8
        # tokens beside plain ones costs 8 rows, not 8 per sequence. The torch path pads [B, T];
        # it could go ragged too by gathering each row's own slot of the cache, at the price
        # of a [rows, context] K/V copy per layer.
        self.pads_batches = self.fused is None
        # The fused kernels compute each row alone (``kernels.qmatmul``: any split, the same instructions;
        # attention over the keys a row sees, in key order): a cached prefix is what a fresh pass would write.
        # Not for float weights: their long prompts go to BLAS (``run``), whose rows' bits depend on the pass
        # (a server's logprobs differed from offline ones in the 7th digit with a BLAS-cached start).
        self.keeps_prefixes = self.fused is not None and model.is_quantized

    def weight_bytes(self) -> int:
        """Every layer matrix, norm and the LM head, each storage once (an untied embedding
        is looked up by row, never read whole)."""
        m, seen, total = self.model, set(), 0
        for name, t in m.named_parameters():
            if (name == "embed" and m.lm_head is not m.embed) or t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
        return total + m.quantized_bytes

    def kv_bytes(self) -> int:
        return self.cache.nbytes

    def run(self, seqs: list[SeqInput], hidden_layers: tuple[int, ...] = (),
            layers: tuple[int, ...] | None = None, argmax: bool = False, path_only: bool = False,
            blocks: list[float] | None = None) -> PassOutput:
        t0 = time.perf_counter()
        if any(s.all_logits for s in seqs) and not all(s.all_logits for s in seqs):
            raise ValueError("a pass returns either all logits or the last ones for every sequence")
        num_rows = sum(len(s.token_ids) for s in seqs)
        prompt = not seqs[0].all_logits
        # Decode and verify passes (every row's logits) take the fused path, whatever their width,
        # so a row's bits never depend on the pass; a float prompt's many rows go to BLAS. GGUF
        # blocks only the fused kernels read: a long prompt over them runs in fused chunks.
        if self.fused is None or (prompt and num_rows > FUSED_PREFILL_ROWS and not self.model.is_quantized):
            out_logits, out_hidden = self._run_batch(seqs, hidden_layers, layers)
        elif prompt and num_rows > QUANTIZED_PREFILL_ROWS:  # GGUF blocks (a float prompt went to BLAS)
            out_logits, out_hidden = self._run_prompt_chunks(seqs, hidden_layers, layers)
            return PassOutput(out_logits, out_hidden, time.perf_counter() - t0)
        elif argmax and not prompt and self.fused.has_argmax:  # the LM head keeps row maxima only
            best, out_hidden = self._run_rows(seqs, hidden_layers, layers, argmax=True, path_only=path_only)
            for s in seqs:
                self.lengths[s.slot] += len(s.token_ids)
            return PassOutput([], out_hidden, time.perf_counter() - t0, argmax=best)
        elif blocks is not None and not prompt and self.fused.has_blocks:  # the LM head sums softmax blocks too
            out_logits, out_hidden, out_blocks = self._run_rows(seqs, hidden_layers, layers, blocks=blocks)
            for s in seqs:
                self.lengths[s.slot] += len(s.token_ids)
            return PassOutput(out_logits, out_hidden, time.perf_counter() - t0, blocks=out_blocks)
        else:
            out_logits, out_hidden = self._run_rows(seqs, hidden_layers, layers)
        for s in seqs:
            self.lengths[s.slot] += len(s.token_ids)
        return PassOutput(out_logits, out_hidden, time.perf_counter() - t0)

    def _run_prompt_chunks(self, seqs: list[SeqInput], hidden_layers: tuple[int, ...],
                           layers: tuple[int, ...] | None):
        """A long prefill over GGUF blocks, one sequence and QUANTIZED_PREFILL_ROWS tokens per pass:
        the pass's scratch (its [rows, context] mask, activations) stays bounded at any prompt length."""
        out_logits, out_hidden = [], []
        for s in seqs:
            if s.parents is not None:
                raise ValueError("a prompt is a chain, not a tree")
            hidden: list[list[torch.Tensor]] = []
            for i in range(0, len(s.token_ids), QUANTIZED_PREFILL_ROWS):
                chunk = SeqInput(s.slot, s.token_ids[i : i + QUANTIZED_PREFILL_ROWS], all_logits=False)
                logits, chunk_hidden = self._run_rows([chunk], hidden_layers, layers)
                self.lengths[s.slot] += len(chunk.token_ids)
                hidden.append(chunk_hidden[0])
            out_logits.append(logits[0])
            out_hidden.append([torch.cat(layer) for layer in zip(*hidden, strict=True)] if hidden_layers else [])
        return out_logits, out_hidden

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_rows(token_ids.cpu().long()).float().to(self.device)

    def output_rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.model.head_rows(token_ids.cpu().long()).float().to(self.device)

    def final_norm(self) -> torch.Tensor:
        return self.model.norm

    def quantized_lm_head(self) -> QuantMatrix | None:
        return self.model.quantized.get("lm_head")

    def restrict_head(self, token_ids: torch.Tensor) -> None:
        """Keep only the LM head's rows ``token_ids`` ([N] ascending ids): every pass then returns logits
        [T, N], column j that of token_ids[j], and ``vocab_size`` is N. For a draft model that drafts from
        a frequent subset of the vocabulary (``drafters.frequent_vocab``): done once at load, no pass
        changes. A quantized head's rows become Q8_0 rows (``quant.int8_rows``, interleaved) of their
        dequantized values: interleaved blocks cannot be gathered row by row, and the draft only needs its
        own q, not the bits."""
        model = self.model
        rows = model.head_rows(token_ids)  # [N, H] float32
        if "lm_head" in model.quantized and rows.shape[1] % 64 == 0:
            model.quantized["lm_head"] = int8_rows(rows.numpy())
        else:
            model.quantized.pop("lm_head", None)
            dtype = model.embed.dtype if model.embed is not None else torch.float32
            model.lm_head = torch.nn.Parameter(rows.to(self.device, dtype), requires_grad=False)
            model.head = model.backend.linear(model.lm_head)
        self.config = model.config = replace(self.config, vocab_size=len(token_ids))
        self.vocab_size = len(token_ids)
        if self.fused is not None:
            self.fused = FusedDecoder.from_model(model)

    def commit(self, slot: int, start: int, keep: list[int]) -> None:
        self.cache.compact(slot, start, keep)
        self.truncate(slot, start + len(keep))

    def _run_batch(self, seqs: list[SeqInput], hidden_layers: tuple[int, ...], layers: tuple[int, ...] | None):
        batch, logits_rows = self._make_batch(seqs)
        with torch.inference_mode():
            logits, hidden = self.model(batch, self.cache, logits_rows, hidden_layers, layers)
        out_logits, out_hidden = [], []
        for i, s in enumerate(seqs):
            n = len(s.token_ids)
            out_logits.append(logits[i, :n] if s.all_logits else logits[i, :1])
            out_hidden.append([h[i, :n] for h in hidden])
        return out_logits, out_hidden

    def _run_rows(self, seqs: list[SeqInput], hidden_layers: tuple[int, ...], layers: tuple[int, ...] | None,
                  argmax: bool = False, path_only: bool = False, blocks: list[float] | None = None):
        """Per sequence its rows' logits (or their argmax [T_i]: ``argmax``, every row's or, ``path_only``, those
        greedy verification reaches) and hidden states; with ``blocks`` (every row's logits, per sequence the
        inverse temperature of its softmax blocks or 0), their blocks too (``PassOutput.blocks``)."""
        rows, spans = self._make_rows(seqs), _row_spans(seqs)
        # (no torch.inference_mode: the pass is NumPy's, and entering it cost ~50 us with the caches cold)
        if argmax:
            best, hidden = self.fused.forward_argmax(rows, self.cache, hidden_layers, layers, path_only)
            logits = [torch.from_numpy(best[r0:r1]) for r0, r1 in spans]
        elif blocks is not None:
            inv_t = np.repeat(np.array(blocks, dtype=np.float32), [r1 - r0 for r0, r1 in spans])
            width = -(-self.vocab_size // SOFTMAX_BLOCK)
            softmax = (inv_t, np.empty((len(inv_t), width), dtype=np.float32),
                       np.empty((len(inv_t), width), dtype=np.float32))
            every, hidden = self.fused.forward(rows, self.cache, None, hidden_layers, layers, softmax)
            logits = [every[r0:r1] for r0, r1 in spans]
            out = [(softmax[1][r0:r1], softmax[2][r0:r1]) if t else None
                   for t, (r0, r1) in zip(blocks, spans, strict=True)]
            return logits, [[h[r0:r1] for h in hidden] for r0, r1 in spans], out
        else:
            logits_rows = None if seqs[0].all_logits else np.array([r1 - 1 for _, r1 in spans], dtype=np.int64)
            every, hidden = self.fused.forward(rows, self.cache, logits_rows, hidden_layers, layers)
            logits = [every[r0:r1] if s.all_logits else every[i : i + 1]
                      for i, (s, (r0, r1)) in enumerate(zip(seqs, spans, strict=True))]
        return logits, [[h[r0:r1] for h in hidden] for r0, r1 in spans]

    def _make_rows(self, seqs: list[SeqInput]) -> Rows:
        at = np.array([(s.slot, self.lengths[s.slot], len(s.token_ids)) for s in seqs], dtype=np.int64)
        kv_len = self._kv_len(int((at[:, 1] + at[:, 2]).max()))
        parents = _CHAINS if all(s.parents is None for s in seqs) else np.concatenate([_parents(s) for s in seqs])
        return Rows(np.array([t for s in seqs for t in s.token_ids], dtype=np.int64), at, parents, kv_len)

    def _make_batch(self, seqs: list[SeqInput]) -> tuple[Batch, torch.Tensor | None]:
        """The torch path's [B, T] batch: the fused pass's rows (``row_layout``, the one home of a pass's layout)
        padded to the longest sequence; a pad row follows its sequence's tokens and sees its cache and itself."""
        rows = self._make_rows(seqs)
        starts, counts = rows.seqs[:, 1], rows.seqs[:, 2]
        B, T = len(seqs), int(counts.max())
        kv_len = self._kv_len(int(starts.max()) + T)  # the pads write too
        layout = decoder_kernels.row_layout(rows.seqs, rows.parents, kv_len)
        b = np.repeat(np.arange(B), counts)  # each row's sequence, and its place there
        t = np.arange(len(b)) - layout.seq_rows[b]
        write_at = starts[:, None] + np.arange(T)
        ids = np.zeros((B, T), dtype=np.int64)
        ids[b, t] = rows.ids
        positions = np.repeat(starts[:, None], T, axis=1)
        positions[b, t] = layout.positions
        mask = None
        if T > 1 or B > 1 or self._window_exceeded(kv_len):
            entries = np.arange(kv_len)
            padded = (entries < starts[:, None, None]) | (entries == write_at[:, :, None])
            padded[b, t] = layout.mask
            mask = torch.from_numpy(padded).unsqueeze(1).to(self.device)  # [B, 1, T, L]
        slots = [s.slot for s in seqs]
        batch = Batch(
            input_ids=torch.from_numpy(ids).to(self.device),
            positions=torch.from_numpy(positions).to(self.device),
            slots=torch.tensor(slots, device=self.device),
            write_at=torch.from_numpy(write_at).to(self.device),
            attn_mask=mask,
            kv_len=kv_len,
            contiguous=slots == list(range(B)),
        )
        logits_rows = None
        if not seqs[0].all_logits:
            last = [len(s.token_ids) - 1 for s in seqs]
            logits_rows = torch.tensor(last, device=self.device).unsqueeze(1)
        return batch, logits_rows

    def _kv_len(self, kv_len: int) -> int:
        """The cache entries a pass reads, checked against the context."""
        if kv_len > self.max_seq_len:
            raise ValueError(f"sequence would exceed the context of {self.max_seq_len} tokens")
        return kv_len

    def _window_exceeded(self, kv_len: int) -> bool:
        w = self.config.sliding_window
        return w is not None and kv_len > w


def _row_spans(seqs: list[SeqInput]) -> list[tuple[int, int]]:
    """Each sequence's rows r0:r1 of a pass."""
    spans, r0 = [], 0
    for s in seqs:
        spans.append((r0, r0 + len(s.token_ids)))
        r0 += len(s.token_ids)
    return spans


_CHAINS = np.empty(0, dtype=np.int64)  # Rows.parents where every sequence adds a chain


def _parents(s: SeqInput) -> np.ndarray:
    """Rows.parents of one sequence's new tokens: a chain's each the one before, a tree's as given (checked)."""
    if s.parents is None:
        return np.arange(len(s.token_ids), dtype=np.int64) - 1
    return np.array(DraftTree(s.token_ids, s.parents).parents, dtype=np.int64)
