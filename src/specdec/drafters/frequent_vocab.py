"""FR-Spec (Zhao et al., 2025): the draft model drafts from the N most frequent tokens only.

A draft model's LM head is a large share of its pass (SmolLM2-135M: 49,152 x 576 of ~135M
weights; Qwen2.5-0.5B: 151,936 x 896 of ~494M). The head is cut once, at load, to the rows of
N tokens (``NativeRunner.restrict_head``): every draft pass then multiplies by N rows. The
drafter maps each [N] row of logits back to the full vocabulary with -inf elsewhere
(``DraftVocab.expand``), so q is the draft's distribution renormalized over the subset and
exactly zero outside it, and the tokens it drafts are target ids. The target verifies over the
whole vocabulary, so a token outside the subset can still be the recovered or bonus token: the
output stays exactly the target's whatever N is; N only moves acceptance and draft cost.

Ranks: token counts of an offline corpus (``corpus.SOURCES``) under the target's tokenizer (a draft with
another tokenizer: under its own, its head cut to its own ids, cross_vocab.draft_vocab_for),
computed once per tokenizer and cached at ``$SPECDEC_CACHE/vocab-counts/<sha256>.npy``, or of a
retrieval datastore's documents when one is given (``--spec-datastore``: say the model's answers). The
tokenizer's special tokens (EOS, the chat markers) are always kept: plain text never counts
them, and a draft that cannot end a turn is rejected at every turn's end.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from specdec.corpus import SOURCES, corpus_documents
from specdec.datastore import Datastore, tokenizer_identity
from specdec.errors import ModelLoadError
from specdec.log import get_logger
from specdec.model.weights import cache_root
from specdec.runners.base import ModelRunner

logger = get_logger(__name__)

COUNT_TOKENS = 2_000_000  # corpus tokens counted for the ranks (~1 min to tokenize once, then cached)


@dataclass(frozen=True, eq=False)
class DraftVocab:
    """The tokens a reduced draft head scores: ``ids`` [N] ascending ids (the target's, or across tokenizers
    the draft's own); ``size`` the full vocabulary they index."""

    ids: torch.Tensor
    size: int

    def expand(self, logits: torch.Tensor) -> torch.Tensor:
        """[N] logits over ``ids`` -> [size] with -inf elsewhere: softmax gives q over the subset, 0 outside."""
        full = torch.full((self.size,), float("-inf"), dtype=torch.float32, device=logits.device)
        full[self.ids.to(logits.device)] = logits.float()
        return full

    def spread(self, probs: torch.Tensor) -> torch.Tensor:
        """[N] probabilities over ``ids`` -> [size] with 0 elsewhere: what softmax gives ``expand``'s row."""
        full = torch.zeros(self.size, dtype=probs.dtype, device=probs.device)
        full[self.ids.to(probs.device)] = probs
        return full


def frequent_tokens(counts: np.ndarray, n: int, keep: Iterable[int] = ()) -> np.ndarray:
    """The ``n`` token ids to draft from, ascending: ``keep`` first, then the most counted. Ties, and the
    tokens a corpus never shows, go to the lower id: a BPE vocabulary's merge order, itself a frequency
    rank of the tokenizer's own training text.

    Example: counts [5, 0, 9, 1, 3], n 3, keep [1] -> 1 kept, then 2 (9) and 0 (5): [0, 1, 2].
    """
    keep = sorted({int(k) for k in keep if 0 <= int(k) < len(counts)})
    if len(keep) > n:
        raise ValueError(f"a draft vocabulary of {n} tokens cannot hold the {len(keep)} special tokens")
    chosen = np.zeros(len(counts), dtype=bool)
    chosen[keep] = True
    ranked = np.argsort(-counts, kind="stable")
    rest = ranked[~chosen[ranked]][: n - len(keep)]
    chosen[rest] = True
    return np.flatnonzero(chosen)


def special_ids(tokenizer, eos_ids: Iterable[int] = ()) -> set[int]:
    """Ids a corpus does not count but a chat needs: EOS, every special and added token."""
    ids = set(eos_ids) | set(getattr(tokenizer, "all_special_ids", []))
    return ids | set(getattr(tokenizer, "added_tokens_decoder", {}))


def vocab_counts(tokenizer, vocab_size: int, max_tokens: int = COUNT_TOKENS) -> np.ndarray:
    """[vocab_size] int64 counts of each token in the offline corpus, cached per tokenizer."""
    identity = tokenizer_identity(tokenizer)
    path = cache_root() / "vocab-counts" / f"{identity.sha256}-{max_tokens}.npy"
    if path.is_file():
        counts = np.load(path)
        if len(counts) == vocab_size:
            return counts
    logger.warning("specdec: counting tokens of %s (%d tokens, once for this tokenizer) for the draft vocabulary",
                   " and ".join(SOURCES), max_tokens)
    docs = corpus_documents(tokenizer, SOURCES, max_tokens)
    counts = np.bincount(np.concatenate(docs), minlength=vocab_size)[:vocab_size].astype(np.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, counts)
    return counts


def store_counts(store: Datastore, vocab_size: int) -> np.ndarray:
    """[vocab_size] counts of each token in a retrieval datastore (its documents, not its separators)."""
    tokens = store.tokens[store.tokens >= 0]
    return np.bincount(tokens, minlength=vocab_size)[:vocab_size].astype(np.int64)


def restrict_draft_vocab(runner: ModelRunner, n: int, counts: np.ndarray, keep: Iterable[int] = ()) -> DraftVocab:
    """Cut ``runner``'s LM head to the ``n`` most counted tokens (plus ``keep``); the vocabulary the drafter
    expands its logits with. ModelLoadError when the runner cannot (only the native runner restricts rows)."""
    size = runner.vocab_size
    if n >= size:
        raise ModelLoadError(f"--spec-draft-vocab-size {n} is not below the draft model's vocabulary ({size})")
    if not hasattr(runner, "restrict_head"):
        raise ModelLoadError(f"--spec-draft-vocab-size needs the native runner; this draft model runs on "
                             f"{type(runner).__name__}")
    ids = torch.from_numpy(frequent_tokens(counts[:size], n, keep))
    covered = float(counts[ids.numpy()].sum()) / max(1, int(counts[:size].sum()))
    runner.restrict_head(ids)
    logger.warning("specdec: the draft model drafts from %d of %d tokens (%.1f%% of the corpus's tokens)",
                   n, size, 100 * covered)
    return DraftVocab(ids, size)
