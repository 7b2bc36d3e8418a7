"""Token provenance: who produced each committed token, and the share of the output text each token shows.

A step commits the accepted prefix of a draft, then one token of the target's own
(the recovered or bonus token). With the n-gram drafter proposing 3 tokens of
which 2 are kept, the step's origins are ``["ngram", "ngram", "target"]``; a step
without a draft commits one ``"target"`` token. So over a request the tokens
marked with a drafter's name number exactly the accepted drafted tokens (less any
an EOS cut off). Provenance only reads what the verifier decided: it cannot
change the output.

Its users: ``llm.LLM.stream`` (each event's pieces), ``terminal`` (`--show-drafts`), the demo, and the
server, whose ``jobs.ChoiceProvenance`` turns a choice's pieces into its ``spec_decode`` extras.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.engine import StepResult
from specdec.text import TextStream, decode

TARGET = "target"  # the origin of a recovered or bonus token, and of every token of plain decoding

# Tokens decoded before a step's first new token when measuring the step's tokens: enough to
# finish a character split over several byte tokens, and to keep a tokenizer's leading-space
# rule from shifting the measure (both windows below start at the same token).
_WINDOW = 4


def step_origins(step: StepResult) -> list[str]:
    """One origin per token of ``step.token_ids``: the drafter for the accepted prefix, then the target.

    A tree merged from several drafters (``--spec-type adaptive``) names each accepted token's own.
    """
    n = len(step.token_ids)
    if not step.drafter:
        return [TARGET] * n
    kept = min(step.num_accepted, n)  # an EOS may have cut the step inside the accepted prefix
    drafted = list(step.origins[:kept]) if step.origins else [step.drafter] * kept
    return drafted + [TARGET] * (n - kept)


@dataclass(frozen=True)
class TokenPiece:
    token_id: int
    text: str  # this token's share of the output text: "" for a special token or the first bytes of a character
    origin: str  # the drafter's name, or TARGET


class PieceStream:
    """Turns a growing output into text deltas cut at token boundaries, one piece per token.

    Follows TextStream's hold-back rules (half a character, the start of a stop
    string), then rounds what may be shown down to the end of a whole token, so
    each delta is the concatenation of whole tokens' pieces. Over a stream,
    ``"".join(piece.text)`` equals ``TextStream.final(output_ids)`` and every
    token is emitted exactly once (tokens after a stop string with ``""``).

    Example (byte-level BPE): tokens ["Hel", "lo", " wor", "ld"] pushed as two
    steps of two give pieces "Hel", "lo", then " wor", "ld".
    """

    def __init__(self, tokenizer, stops: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.text = TextStream(tokenizer, stops)
        self.ids: list[int] = []
        self.origins: list[str] = []
        self.ends: list[int] = []  # ends[i]: where token i's text ends in the decoded output
        self.num_sent = 0  # tokens emitted so far

    def push(self, token_ids: list[int], origins: list[str], final: bool = False) -> list[TokenPiece]:
        """Add one step's tokens and their origins; the pieces that can be shown now (all of them if final)."""
        if len(token_ids) != len(origins):
            raise ValueError(f"{len(token_ids)} tokens but {len(origins)} origins")
        self._measure(token_ids)
        self.origins.extend(origins)
        if final:
            text = self.text.final(self.ids)
            last = len(self.ids)
        else:
            text, showable = self.text.showable(self.ids)
            last = self.num_sent
            for i in range(self.num_sent, len(self.ids)):
                if self.ends[i] > showable:
                    break
                if self.ends[i] > self._start(i):  # end on a token that shows text: nothing empty trails
                    last = i + 1
        return self._emit(text, last, final)

    def _start(self, i: int) -> int:
        return self.ends[i - 1] if i else 0

    def _emit(self, text: str, last: int, final: bool) -> list[TokenPiece]:
        pieces = []
        for i in range(self.num_sent, last):
            end = len(text) if final and i == last - 1 else min(self.ends[i], len(text))
            pieces.append(TokenPiece(self.ids[i], text[min(self._start(i), end) : end], self.origins[i]))
        self.num_sent = last
        return pieces

    def _measure(self, token_ids: list[int]) -> None:
        """Where each new token's text ends: measured back from the end of the whole output's text.

        decode(window .. token i) against decode(window .. newest token) tells how many
        characters follow token i; both start at the same token, so only the step's own
        tokens are decoded again, not the whole output (whose length the stream's
        ``OutputText`` keeps).
        """
        first = len(self.ids)
        self.ids.extend(token_ids)
        self.text.output.extend(token_ids)  # the stream's incremental text: no decode of the whole output
        window = max(0, first - _WINDOW)
        tail_text = decode(self.tokenizer, self.ids[window:])
        tail = len(tail_text)
        total = len(self.text.output.text) + tail - len(tail_text.rstrip("\ufffd"))  # with any half character
        for i in range(first, len(self.ids)):
            head = decode(self.tokenizer, self.ids[window : i + 1]).rstrip("\ufffd")
            prev = self.ends[-1] if self.ends else 0
            self.ends.append(min(max(total - (tail - len(head)), prev), total))
