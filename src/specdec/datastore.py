"""A retrieval datastore: token sequences of a corpus and their suffix array (REST, NAACL 2024).

The store is one ``.npz`` file (``FORMAT_VERSION``):

    tokens           [N + DEPTH] int32: the documents' token ids, each followed by SEP (-1), then
                     DEPTH more SEPs so a slice of DEPTH tokens from any position stays in bounds
    sa               [M] int32/int64: the start of every suffix that begins on a token (not SEP),
                     sorted by its first ``depth`` tokens
    depth            the longest pattern + continuation the order is exact for (prefix doubling stops there)
    tokenizer_size   len(tokenizer) of the tokenizer that wrote the ids
    tokenizer_sha256 a hash of its vocabulary (``tokenizer_identity``)
    sources          what was tokenized, for the record

Suffixes that share a pattern P are one contiguous range of ``sa``; inside it their next tokens
are sorted, so the range of P + x is a sub-range found by a binary search on one token. That is
what the retrieval drafter's trie walks (``drafters.retrieval``).

Example: tokens [5, 6, 5, 7, SEP, ...] -> suffixes sorted: [5 6 5 7] (0), [5 7] (2), [6 5 7] (1),
[7] (3): sa = [0, 2, 1, 3]; the range of [5] is sa[0:2], and within it the next tokens are 6, 7.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FORMAT_VERSION = 1
SEP = -1  # ends a document; never a token id
DEFAULT_DEPTH = 64  # patterns of up to 16 tokens plus continuations of up to 48


class DatastoreError(ValueError):
    """A datastore file is missing, unreadable, of another version, or of another tokenizer: one line."""


@dataclass(frozen=True)
class TokenizerIdentity:
    """Which tokenizer wrote a store's ids: its size and a hash of its vocabulary."""

    size: int
    sha256: str

    def describe(self) -> str:
        return f"{self.size:,} tokens, vocabulary sha256 {self.sha256[:12]}"


def tokenizer_identity(tokenizer) -> TokenizerIdentity:
    """The identity of a Hugging Face tokenizer: ids mean the same text iff the vocabularies are equal."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()
    return TokenizerIdentity(len(tokenizer), digest)


def suffix_array(tokens: np.ndarray, depth: int = DEFAULT_DEPTH) -> np.ndarray:
    """[n] int tokens -> every position sorted by its suffix's first ``depth`` tokens (prefix doubling:
    after round r the order is exact on 2**r tokens; ties keep position order).

    Example: suffix_array([5, 6, 5, 7]) -> [0, 2, 1, 3] (5 6.., 5 7, 6.., 7).
    """
    n = len(tokens)
    index_dtype = np.int32 if n < 2**31 else np.int64
    # dense ranks 1..n (0 is "past the end"), so (rank, second rank) packs into one int64 without collisions
    rank = np.unique(tokens, return_inverse=True)[1].reshape(-1).astype(np.int64) + 1
    sa = np.argsort(rank, kind="stable")
    k = 1
    while k < depth:
        second = np.zeros(n, dtype=np.int64)
        second[: n - k] = rank[k:]
        key = rank * (n + 1) + second  # (rank, rank of the suffix k later) as one int64
        sa = np.argsort(key, kind="stable")
        ordered = key[sa]
        new = np.empty(n, dtype=np.int64)
        new[sa] = np.concatenate([[1], 1 + np.cumsum(ordered[1:] != ordered[:-1])])
        rank = new
        if rank.max() == n:  # every suffix distinct already
            break
        k *= 2
    return sa.astype(index_dtype)


@dataclass(frozen=True, eq=False)
class Datastore:
    tokens: np.ndarray  # [N + depth] int32, SEP-separated documents, SEP-padded
    sa: np.ndarray  # [M] suffix starts on tokens, sorted
    depth: int
    identity: TokenizerIdentity
    sources: str = ""

    @classmethod
    def build(cls, documents: list[np.ndarray] | list[list[int]], identity: TokenizerIdentity,
              depth: int = DEFAULT_DEPTH, sources: str = "") -> Datastore:
        """A store over ``documents`` (token id sequences); a continuation never runs from one into the next."""
        parts = []
        for doc in documents:
            parts += [np.asarray(doc, dtype=np.int32), np.array([SEP], dtype=np.int32)]
        parts.append(np.full(depth, SEP, dtype=np.int32))
        tokens = np.concatenate(parts)
        order = suffix_array(tokens, depth)
        sa = order[tokens[order] != SEP]  # a match never starts on a separator
        return cls(tokens, sa, depth, identity, sources)

    @property
    def num_tokens(self) -> int:
        return len(self.sa)

    def save(self, path: str | Path) -> None:
        path = Path(path).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:  # a file object: np.savez would append .npz to the name
            np.savez(f, version=FORMAT_VERSION, tokens=self.tokens, sa=self.sa, depth=self.depth,
                     tokenizer_size=self.identity.size, tokenizer_sha256=self.identity.sha256,
                     sources=self.sources)

    @classmethod
    def load(cls, path: str | Path) -> Datastore:
        """The store at ``path``; DatastoreError (one line) when it is missing or not a version-1 store."""
        path = Path(path).expanduser()
        if not path.is_file():
            raise DatastoreError(f"--spec-datastore {path}: no such file (`specdec datastore build --out {path}` "
                                 "makes one)")
        try:
            with np.load(path, allow_pickle=False) as z:
                version = int(z["version"])
                if version != FORMAT_VERSION:
                    raise DatastoreError(f"--spec-datastore {path}: format version {version}, this specdec reads "
                                         f"{FORMAT_VERSION}: rebuild it with `specdec datastore build`")
                identity = TokenizerIdentity(int(z["tokenizer_size"]), str(z["tokenizer_sha256"]))
                return cls(z["tokens"], z["sa"], int(z["depth"]), identity, str(z["sources"]))
        except DatastoreError:
            raise
        except (OSError, ValueError, KeyError) as exc:
            raise DatastoreError(f"--spec-datastore {path}: not a specdec datastore ({exc})") from None

    def check_tokenizer(self, identity: TokenizerIdentity | None, vocab_size: int, where: str = "") -> None:
        """DatastoreError unless the store's ids are the target's: the same tokenizer (when known), and
        every id below the target's vocabulary size in any case."""
        if identity is not None and identity != self.identity:
            raise DatastoreError(f"--spec-datastore {where}: built with another tokenizer ({self.identity.describe()}) "
                                 f"than the target's ({identity.describe()}): rebuild it with `specdec datastore "
                                 "build --model` for this model")
        if len(self.tokens) and int(self.tokens.max()) >= vocab_size:
            raise DatastoreError(f"--spec-datastore {where}: holds token id {int(self.tokens.max())}, outside the "
                                 f"target's vocabulary of {vocab_size}")

    # -- look-ups -------------------------------------------------------------------------------

    def find(self, pattern: list[int], lo: int = 0, hi: int | None = None) -> tuple[int, int]:
        """The range [lo, hi) of ``sa`` whose suffixes start with ``pattern`` (len <= depth); empty: lo == hi."""
        hi = len(self.sa) if hi is None else hi
        return self._bound(pattern, lo, hi, upper=False), self._bound(pattern, lo, hi, upper=True)

    def occurs(self, pattern: list[int]) -> bool:
        start = self._bound(pattern, 0, len(self.sa), upper=False)
        return start < len(self.sa) and self._prefix(start, len(pattern)) == pattern

    def _prefix(self, i: int, m: int) -> list[int]:
        s = int(self.sa[i])
        return self.tokens[s : s + m].tolist()

    def _bound(self, pattern: list[int], lo: int, hi: int, upper: bool) -> int:
        """First i in [lo, hi) whose suffix's first len(pattern) tokens are >= pattern (> with ``upper``).
        SEP (-1) sorts first, as in the suffix array (shorter documents' ends come before longer ones)."""
        m = len(pattern)
        while lo < hi:
            mid = (lo + hi) // 2
            cand = self._prefix(mid, m)
            if cand < pattern or (upper and cand == pattern):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def next_tokens(self, lo: int, hi: int, offset: int, max_scan: int = 4096) -> list[tuple[int, int, int]]:
        """(token, lo, hi) of each token that follows the range's shared prefix of ``offset`` tokens, with
        its sub-range; SEP (a document's end) left out. Inside the range the tokens at ``offset`` are
        sorted, so each sub-range is exact; past ``max_scan`` suffixes only tokens seen in an even sample of
        that many are listed (a rarer one is below 1 / max_scan of the range, too rare to draft)."""
        if hi - lo <= max_scan:
            values = self.tokens[self.sa[lo:hi] + offset]
            if hi - lo <= 64:  # most trie nodes: a Python pass beats numpy's per-call overhead
                return _runs(values.tolist(), lo)
            edges = np.flatnonzero(values[1:] != values[:-1]) + 1
            starts, ends = [0, *edges.tolist()], [*edges.tolist(), len(values)]
            return [(int(values[a]), lo + a, lo + b) for a, b in zip(starts, ends, strict=True) if values[a] != SEP]
        sample = np.unique(np.linspace(lo, hi - 1, max_scan).astype(np.int64))
        return [(token, self._key_bound(token, lo, hi, offset, False), self._key_bound(token, lo, hi, offset, True))
                for token in np.unique(self.tokens[self.sa[sample] + offset]).tolist() if token != SEP]

    def _key_bound(self, token: int, lo: int, hi: int, offset: int, upper: bool) -> int:
        """``_bound`` on the single token at ``offset`` (the range shares everything before it)."""
        while lo < hi:
            mid = (lo + hi) // 2
            value = int(self.tokens[int(self.sa[mid]) + offset])
            if value < token or (upper and value == token):
                lo = mid + 1
            else:
                hi = mid
        return lo


def _runs(values: list[int], lo: int) -> list[tuple[int, int, int]]:
    """(value, lo + start, lo + end) of each run of equal sorted ``values``, SEP runs left out."""
    out, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            if values[start] != SEP:
                out.append((values[start], lo + start, lo + i))
            start = i
    return out
