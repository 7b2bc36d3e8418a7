"""Logits processors that read the history, applied at every node of a verified draft.

A penalty or a grammar depends on the tokens before the position it acts on. In
a verify pass, row i of the target's logits predicts the token after draft node
i, so its history is every committed token *plus the drafted tokens on the path
from the root to node i*. Processing each row with exactly that history gives
row i the logits plain decoding would have computed had those drafted tokens
been committed one by one; the verifier then sees the same p at every position,
so greedy output stays token-identical and sampled output keeps the target's
distribution. Speculation is never switched off for them.

Example: committed output [a], draft chain [b, c], frequency_penalty f. Rows:
    row 0 (predicts the token after a):    counts {a: 1}
    row 1 (after a b):                     counts {a: 1, b: 1}
    row 2 (after a b c):                   counts {a: 1, b: 1, c: 1}
and row r is logits - f * counts_r, as in plain decoding after the same tokens.

Order (vLLM v1's): logit_bias, then repetition/frequency/presence penalties,
then min_tokens and bad_words bans, then the grammar mask (``grammar.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.config import SamplingParams
from specdec.drafters.base import DraftProposal
from specdec.grammar import GrammarMatcher, apply_bitmask
from specdec.tree import DraftTree


class HistoryProcessor:
    """presence/frequency/repetition penalties, logit_bias, min_tokens and bad_words for one sequence.

    State: the output tokens' counts ([V] float, updated by ``advance``); the
    prompt's token set for the repetition penalty. It moves to the logits' device at the first
    ``apply`` and stays there: on a GPU, copying the counts built for every row ([N+1, V], ~3 MB a
    5-row step) and the prompt mask to it each verify step cost more than the penalties.
    """

    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int], vocab_size: int,
                 eos_token_ids: Sequence[int], bad_words_ids: Sequence[Sequence[int]] = ()) -> None:
        self.params = params
        self.prompt_len = len(prompt_ids)
        self.vocab_size = vocab_size
        self.eos_token_ids = [t for t in eos_token_ids if 0 <= t < vocab_size]
        self.output_counts = torch.zeros(vocab_size)
        self.prompt_mask = torch.zeros(vocab_size, dtype=torch.bool)
        if params.repetition_penalty != 1.0:
            self.prompt_mask[torch.tensor(list(prompt_ids), dtype=torch.long)] = True
        self.bias_ids = torch.tensor([t for t, _ in params.logit_bias], dtype=torch.long)
        self.bias_values = torch.tensor([b for _, b in params.logit_bias], dtype=torch.float32)
        if len(self.bias_ids) and not 0 <= int(self.bias_ids.min()) <= int(self.bias_ids.max()) < vocab_size:
            raise ValueError(f"logit_bias token ids must be in [0, {vocab_size})")
        self.bad_words_ids = [tuple(w) for w in bad_words_ids if w]

    def advance(self, new_ids: Sequence[int]) -> None:
        """Tokens committed to the output."""
        if new_ids:
            device = self.output_counts.device
            self.output_counts.index_add_(0, torch.tensor(list(new_ids), dtype=torch.long, device=device),
                                          torch.ones(len(new_ids), device=device))

    def _move_to(self, device: torch.device) -> None:
        if self.output_counts.device != device:
            self.output_counts, self.prompt_mask = self.output_counts.to(device), self.prompt_mask.to(device)
            self.bias_ids, self.bias_values = self.bias_ids.to(device), self.bias_values.to(device)

    def apply(self, logits: torch.Tensor, tree: DraftTree, tokens: Sequence[int]) -> None:
        """In place on logits [N+1, V]: row i as plain decoding after ``tokens`` + node i's drafted path."""
        p = self.params
        paths = [[tree.tokens[m] for m in tree.path_to(i)[1:]] for i in range(tree.num_nodes)]
        self._move_to(logits.device)
        if len(self.bias_ids):
            logits[:, self.bias_ids] += self.bias_values
        if p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0:
            counts = self._counts(paths)  # [N+1, V]
            if p.repetition_penalty != 1.0:
                seen = (counts > 0) | self.prompt_mask
                scaled = torch.where(logits > 0, logits / p.repetition_penalty, logits * p.repetition_penalty)
                logits.copy_(torch.where(seen, scaled, logits))
            if p.frequency_penalty:
                logits -= p.frequency_penalty * counts
            if p.presence_penalty:
                logits -= p.presence_penalty * (counts > 0).float()
        num_output = len(tokens) - self.prompt_len  # the output index row 0 predicts
        for i, path in enumerate(paths):
            if num_output + len(path) < p.min_tokens:
                logits[i, self.eos_token_ids] = float("-inf")
            banned = self._banned_words(tokens[self.prompt_len:], path)
            if banned:
                logits[i, banned] = float("-inf")

    def _counts(self, paths: list[list[int]]) -> torch.Tensor:
        counts = self.output_counts.expand(len(paths), self.vocab_size).clone()
        rows = [i for i, path in enumerate(paths) for _ in path]
        if rows:
            cols = [t for path in paths for t in path]
            device = counts.device
            index = torch.tensor([rows, cols], dtype=torch.long, device=device)
            counts.index_put_((index[0], index[1]), torch.ones(len(rows), device=device), accumulate=True)
        return counts

    def _banned_words(self, output: Sequence[int], path: list[int]) -> list[int]:
        """Last tokens of bad words whose other tokens end the output + path (vLLM: output only)."""
        banned = []
        for word in self.bad_words_ids:
            prefix = word[:-1]
            if not prefix:
                banned.append(word[-1])
                continue
            history = list(output[-len(prefix):]) + path if len(path) < len(prefix) else path
            if tuple(history[-len(prefix):]) == prefix:
                banned.append(word[-1])
        return banned


@dataclass
class SequenceProcessors:
    """Everything that shapes one sequence's target logits beyond temperature/top-k/top-p/min-p.

    The engine calls ``cut`` on each draft, ``apply`` on each verify pass's logits
    and ``advance`` with the committed tokens.
    """

    history: HistoryProcessor | None = None
    grammar: GrammarMatcher | None = None

    def cut(self, proposal: DraftProposal) -> DraftProposal:
        """Drop drafted tokens the grammar cannot produce before they cost a verify row."""
        return proposal if self.grammar is None or not len(proposal) else self.grammar.cut(proposal)

    def apply(self, logits: torch.Tensor, tree: DraftTree, tokens: Sequence[int]) -> torch.Tensor:
        """[N+1, V] raw target logits -> processed logits (a new tensor)."""
        out = logits.float().clone()
        if self.history is not None:
            self.history.apply(out, tree, tokens)
        if self.grammar is None:
            return out
        bitmask = self.grammar.bitmask(tree).to(out.device)
        apply_bitmask(out, bitmask)
        dead = torch.isneginf(out).all(dim=-1)
        if bool(dead.any()):
            # min_tokens or bad_words banned every token the grammar allows (e.g. only EOS is left):
            # the grammar wins, as an empty distribution cannot be sampled.
            fallback = logits[dead].float().clone()
            apply_bitmask(fallback, bitmask[dead])
            out[dead] = fallback
        return out

    def advance(self, new_ids: Sequence[int]) -> int:
        """Commit tokens; returns how many belong to the output: all of them, unless the grammar
        completes before the last (the engine drops the rest, so output never runs past it)."""
        n = len(new_ids) if self.grammar is None else self.grammar.advance(new_ids)
        if self.history is not None:
            self.history.advance(new_ids[:n])
        return n

    @property
    def finished(self) -> bool:
        """The grammar is complete: nothing but EOS may follow, so the output ends here."""
        return self.grammar is not None and self.grammar.finished
