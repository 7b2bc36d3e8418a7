"""Text seams between two tokenizers: the draft's view of the target's tokens, and back.

A draft model with another tokenizer reads the committed text as its own tokenizer writes it:
``DraftContext`` keeps the draft-tokenized version of the target's committed ids (their text
decoded with special tokens kept, so a chat template's markers reach the draft as its own
special tokens where it has the same ones). It is kept up to date incrementally: the new text is
re-encoded from a few draft tokens before the end of what was stable (the look-behind), so a word
that the new tokens extend ("in" + "put") is re-split the way the draft's tokenizer splits
"input"; the draft runner then rolls its cache back to the longest common prefix.

``TokenizerPair.target_continuation`` goes the other way for SLEM: the draft's text is encoded
by the target's tokenizer after the committed text, and the last token is cut (it may merge with
what follows) unless it is the twin of the draft's last token. None of this decides what is kept: a
seam handled badly costs acceptance only.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from specdec.drafters.vocab_map import token_lengths

LOOK_BEHIND = 4  # draft tokens re-encoded before the stable end of the text
WINDOW = 4  # committed tokens decoded before the new ones (incremental detokenization)


class TokenizerPair:
    """The target's and the draft's tokenizers (transformers fast tokenizers)."""

    def __init__(self, target_tok, draft_tok) -> None:
        self.target = target_tok.backend_tokenizer  # tokenizers.Tokenizer: no Python per-token work
        self.draft = draft_tok.backend_tokenizer
        bos = draft_tok.bos_token_id
        self.draft_bos = [bos] if bos is not None and draft_tok("a").input_ids[:1] == [bos] else []
        # a tokenizer that writes a space before the first word (sentencepiece's dummy prefix)
        # cannot encode a piece of text on its own: it is re-encoded whole
        first = self.draft.encode("a", add_special_tokens=False).tokens
        self.draft_piecewise = bool(first) and not first[0].startswith(("▁", "Ġ", " "))
        self.target_special = set(target_tok.all_special_ids)
        self.draft_special = set(draft_tok.all_special_ids)
        self.draft_lengths = token_lengths(draft_tok)  # each draft token's bytes (-1: unknown)
        if draft_tok.unk_token_id is not None and draft_tok.unk_token_id < len(self.draft_lengths):
            self.draft_lengths[draft_tok.unk_token_id] = -1  # stands for text of any length

    def target_text(self, ids: Sequence[int]) -> str:
        return self.target.decode(list(ids), skip_special_tokens=False)

    def draft_text(self, before: Sequence[int], new: Sequence[int]) -> str:
        """The text that draft tokens ``new`` add after draft tokens ``before`` (their last few are
        decoded with them: a decoder may drop a leading space or hold a partial character)."""
        tail = list(before[-WINDOW:])
        whole = self.draft.decode(tail + list(new), skip_special_tokens=False)
        head = self.draft.decode(tail, skip_special_tokens=False)
        return whole[len(head):] if whole.startswith(head) else self.draft.decode(list(new))

    def target_continuation(self, context: Sequence[int], text: str, last_twin: int = -1) -> list[int]:
        """Target ids that continue ``context`` with ``text``, less the last (unstable) one unless it is
        ``last_twin`` (the target twin of the draft's last token: both tokenizers end a token there, and
        the draft wrote it whole, so it is kept without drafting what follows).

        The last few committed tokens are encoded with ``text``: where that gives them back
        unchanged, what follows is the target's own split; where the boundary merges ("in" +
        "put" -> "input"), ``text`` is encoded alone (a valid, rarer split). Cut before the
        first special token (the verifier ends the text at EOS itself).
        Example: context ..."def", text " add(x" -> encoded " add", "(x" -> [" add"] ("(x" kept
        when last_twin is its id).
        """
        tail = list(context[-WINDOW:])
        ids = self.target.encode(self.target_text(tail) + text, add_special_tokens=False).ids
        new = ids[len(tail):] if ids[: len(tail)] == tail else self.target.encode(text, add_special_tokens=False).ids
        if new and new[-1] != last_twin:
            new = new[:-1]
        for i, t in enumerate(new):
            if t in self.target_special:
                return new[:i]
        return new


class DraftContext:
    """The draft tokenizer's ids for the target's committed ids, updated incrementally.

    Example: target ids for "def add" then " (x": the text grows by " (x"; the draft's last
    LOOK_BEHIND tokens of "def add" and the new text are encoded again, and the ids before stay.
    Positions are counted in bytes of the UTF-8 text, from each draft token's own bytes (exact,
    unlike a tokenizer's offsets, which trim spaces).
    """

    def __init__(self, pair: TokenizerPair) -> None:
        self.pair = pair
        self.reset()

    def reset(self) -> None:
        self.target_ids: list[int] = []
        self.text = ""
        self.data = b""  # ``text`` as UTF-8
        self.ids: list[int] = []  # the draft's ids of ``text`` (BOS not included)
        self.ends: list[int] = []  # where each draft id ends in ``data``; -1 once one is unknown

    def update(self, target_ids: Sequence[int]) -> list[int]:
        """The draft's ids (its BOS first, where it uses one) for the text of ``target_ids``."""
        n = len(self.target_ids)
        if len(target_ids) < n or (n and target_ids[n - 1] != self.target_ids[-1]):
            self.reset()
            n = 0
        if len(target_ids) > n:
            stable = self._extend_text(target_ids, n)
            self._encode(stable)
            self.target_ids = list(target_ids)
        return self.pair.draft_bos + self.ids

    def _extend_text(self, target_ids: Sequence[int], n: int) -> int:
        """Set the text of ``target_ids``; return how many of its first bytes are unchanged."""
        start = max(0, n - WINDOW)
        head = self.pair.target_text(target_ids[start:n])
        whole = self.pair.target_text(target_ids[start:])
        if whole.startswith(head) and not head.endswith("\ufffd"):
            stable = len(self.data)
            self.text += whole[len(head):]
            self.data += whole[len(head):].encode()
            return stable
        old = self.data  # a character split across tokens: decode it whole
        self.text = self.pair.target_text(target_ids)
        self.data = self.text.encode()
        stable = 0
        while stable < min(len(old), len(self.data)) and old[stable] == self.data[stable]:
            stable += 1
        return stable

    def _encode(self, stable: int) -> None:
        keep = 0
        if self.pair.draft_piecewise and -1 not in self.ends[-1:]:
            keep = bisect_right(self.ends, stable) - LOOK_BEHIND
            # cut at a character's first byte (a character's bytes may be split across tokens)
            while keep > 0 and self.ends[keep - 1] < len(self.data) and self.data[self.ends[keep - 1]] & 0xC0 == 0x80:
                keep -= 1
            keep = max(keep, 0)
        cut = self.ends[keep - 1] if keep else 0
        enc = self.pair.draft.encode(self.data[cut:].decode("utf-8", errors="replace"), add_special_tokens=False)
        ends, pos = [], cut
        for t in enc.ids:
            size = self.pair.draft_lengths[t] if t < len(self.pair.draft_lengths) else -1
            pos = -1 if size < 0 or pos < 0 else pos + size
            ends.append(pos)
        self.ids = self.ids[:keep] + enc.ids
        self.ends = self.ends[:keep] + ends
