"""Generic runner: any transformers ``AutoModelForCausalLM`` the native decoder does not cover.

Chains only (no tree masks), one forward per sequence, rollback by cropping
the model's own DynamicCache. Slower than the native runner but exact.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import torch

from specdec.errors import ModelLoadError
from specdec.runners.base import ModelRunner, PassOutput, SeqInput
from specdec.tree import is_chain


class GenericRunner(ModelRunner):
    supports_trees = False
    pads_batches = False  # one forward per sequence

    def __init__(
        self, folder: Path, dtype: torch.dtype, device: torch.device, max_seq_len: int, num_slots: int
    ) -> None:
        # Lazy: importing transformers' model classes costs ~1.3 s at every CLI start.
        from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

        try:
            config = AutoConfig.from_pretrained(folder)  # trust_remote_code stays off
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, use_safetensors=True)
        except (ValueError, OSError, KeyError) as exc:
            raise ModelLoadError(f"unsupported model in {folder}: {exc}") from None
        limit = getattr(config, "max_position_embeddings", max_seq_len) or max_seq_len
        super().__init__(min(max_seq_len, limit), num_slots)
        self.model = model.to(device).eval()
        self.device, self.dtype = device, dtype
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        eos = model.generation_config.eos_token_id
        self.eos_token_ids = tuple(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self._new_cache = lambda: DynamicCache(config=config)
        self.caches = [self._new_cache() for _ in range(num_slots)]

    def allocate(self, prefix: Sequence[int] = ()) -> int:
        slot = super().allocate(prefix)
        self.caches[slot] = self._new_cache()
        return slot

    def run(self, seqs: list[SeqInput], hidden_layers: tuple[int, ...] = (),
            layers: tuple[int, ...] | None = None, argmax: bool = False, path_only: bool = False,
            blocks: list[float] | None = None) -> PassOutput:
        if layers is not None:
            raise ValueError("the generic runner runs every layer; layer skipping needs a native model")
        t0 = time.perf_counter()
        logits, hidden = [], []
        for s in seqs:
            if s.parents is not None and not is_chain(s.parents):
                raise ValueError("the generic runner verifies chains only; trees need a native model")
            start = self.lengths[s.slot]
            ids = torch.tensor([s.token_ids], device=self.device)
            pos = torch.arange(start, start + len(s.token_ids), device=self.device)
            with torch.inference_mode():
                out = self.model(
                    input_ids=ids,
                    past_key_values=self.caches[s.slot],
                    use_cache=True,
                    cache_position=pos,
                    output_hidden_states=bool(hidden_layers),
                )
            row = out.logits[0].float()
            logits.append(row if s.all_logits else row[-1:])
            if hidden_layers:
                hidden.append([out.hidden_states[i + 1 if i >= 0 else -1][0] for i in hidden_layers])
            self.lengths[s.slot] += len(s.token_ids)
        return PassOutput(logits, hidden, time.perf_counter() - t0)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings().weight[token_ids.to(self.device)].detach().float()

    def output_rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings().weight[token_ids.to(self.device)].detach().float()

    def truncate(self, slot: int, length: int) -> None:
        remove = self.lengths[slot] - length
        super().truncate(slot, length)
        if remove > 0:
            self.caches[slot].crop(-remove)  # a negative count means "drop this many" in 4.x and 5.x alike
