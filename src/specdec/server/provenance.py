"""Token provenance of one choice of a request, on the event-loop side of the server.

Each engine step of the choice goes in; out come the text delta to stream (cut
at token boundaries) with its ``spec_decode`` extras, and at the end the whole
choice's ``TokenProvenance`` for a non-streamed response.
"""

from __future__ import annotations

from specdec.engine import StepResult
from specdec.provenance import PieceStream, step_origins
from specdec.server.protocol import SpecDecodeInfo, StepDetail, TokenProvenance
from specdec.text import decode


class ChoiceProvenance:
    def __init__(self, index: int, tokenizer, stops: tuple[str, ...], detail: bool) -> None:
        self.tokenizer = tokenizer
        self.pieces = PieceStream(tokenizer, stops)
        self.detail = detail
        self.num_tokens = 0
        self.pending: list[StepDetail] = []  # details of steps whose tokens were not streamed yet
        self.record = TokenProvenance(index=index, tokens=[], origins=[], steps=[] if detail else None)

    @property
    def text(self) -> str:
        return "".join(self.record.tokens)

    def push(self, step: StepResult, final: bool) -> tuple[str, SpecDecodeInfo] | None:
        """Add one step; the delta and extras to stream now, or None while its text is held back."""
        if self.detail and step.num_drafted:
            self.pending.append(self._detail(step))
        self.num_tokens += len(step.token_ids)
        pieces = self.pieces.push(step.token_ids, step_origins(step), final)
        tokens, origins = [p.text for p in pieces], [p.origin for p in pieces]
        self.record.tokens.extend(tokens)
        self.record.origins.extend(origins)
        text = "".join(tokens)
        if not text and not final:
            return None
        steps, self.pending = self.pending, []
        if self.record.steps is not None:
            self.record.steps.extend(steps)
        return text, SpecDecodeInfo(tokens=tokens, origins=origins, steps=steps if self.detail else None)

    def so_far(self) -> SpecDecodeInfo:
        """The extras of every token whose text was let out so far (for text first held back, then sent)."""
        steps = list(self.record.steps) if self.record.steps is not None else None
        return SpecDecodeInfo(tokens=list(self.record.tokens), origins=list(self.record.origins), steps=steps)

    def _detail(self, step: StepResult) -> StepDetail:
        rejected = [decode(self.tokenizer, [t]) for t in step.rejected_ids]
        return StepDetail(start=self.num_tokens, drafter=step.drafter, drafted=step.num_drafted,
                          accepted=step.num_accepted, rejected_ids=step.rejected_ids, rejected=rejected)
