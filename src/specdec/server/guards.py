"""What a request brings into the engine's step, wrapped so its failure fails that request alone.

A request's drafter, stop check and logits processors (penalties, bad words, its grammar) run
inside ``Engine.step``, beside every other running request. Each wrapper here catches what
its part raises, records it on the request (``GuardedPart.fail``: the scheduler answers that
request with a 500 naming the reason, after the step) and returns a harmless value, so the
step completes for everyone else. A ``BaseException`` that is not an exit (a Rust panic from
the tokenizer or llguidance arrives as ``pyo3_runtime.PanicException``, a BaseException) is
caught too: it must not end the scheduler thread.

``GuardedDrafter`` forwards every method of ``Drafter``; ``tests/test_drafters_base.py``
fails when a method is added to ``Drafter`` and not forwarded here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch

from specdec.config import SamplingParams
from specdec.drafters.base import EMPTY, Drafter, DraftProposal
from specdec.log import get_logger
from specdec.processors import SequenceProcessors
from specdec.tree import DraftTree

logger = get_logger(__name__)
EXITS = (KeyboardInterrupt, SystemExit, GeneratorExit)


class Failable(Protocol):
    """The request a guard reports to (``scheduler.Request``)."""

    id: str
    error: str | None


class GuardedPart:
    def __init__(self, request: Failable, what: str) -> None:
        self.request, self.what = request, what

    def _call(self, fn: Callable, *args, fallback: Any = None):
        """``fn(*args)``, or ``fallback`` once this request failed (now or earlier)."""
        if self.request.error is not None:
            return fallback
        try:
            return fn(*args)
        except BaseException as exc:  # noqa: BLE001 - reported as this request's 500
            if isinstance(exc, EXITS):
                raise
            logger.exception("%s failed in request %s", self.what, self.request.id)
            self.request.error = f"{self.what} failed: {type(exc).__name__}: {exc}"
            return fallback


class GuardedDrafter(GuardedPart, Drafter):
    """Forwards to a request's drafter; an exception fails that request instead of the whole step."""

    def __init__(self, inner: Drafter, request: Failable) -> None:
        super().__init__(request, f"drafter {inner.name}")
        self.inner = inner
        self.name = inner.name
        self.hidden_layers = inner.hidden_layers

    def bind_slot(self, slot: int) -> None:
        self._call(self.inner.bind_slot, slot)

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        self._call(self.inner.begin, prompt_ids, sampling)

    def observe(self, target_hidden: Mapping[int, torch.Tensor]) -> None:
        self._call(self.inner.observe, target_hidden)

    def propose(self, context: Sequence[int], max_tokens: int) -> DraftProposal:
        return self._call(self.inner.propose, context, max_tokens, fallback=EMPTY)

    def accept(self, context: Sequence[int], num_accepted: int) -> None:
        self._call(self.inner.accept, context, num_accepted)

    def end(self, context: Sequence[int]) -> None:
        self._call(self.inner.end, context)

    def windows(self):
        return self._call(self.inner.windows, fallback={})

    def catch_up_seconds(self, context: Sequence[int]) -> float:
        return self._call(self.inner.catch_up_seconds, context, fallback=0.0)

    def planned_alpha(self, alpha: float) -> float | None:
        return self._call(self.inner.planned_alpha, alpha, fallback=None)  # failed: plan no rows

    def token_seconds(self) -> float | None:
        return self._call(self.inner.token_seconds, fallback=None)


class GuardedProcessors(GuardedPart):
    """A request's penalties and grammar; after a failure its rows pass through unprocessed (the
    request is failed after the step, so nothing it samples is delivered)."""

    def __init__(self, inner: SequenceProcessors, request: Failable) -> None:
        super().__init__(request, "logits processing")
        self.inner = inner

    def cut(self, proposal: DraftProposal) -> DraftProposal:
        return self._call(self.inner.cut, proposal, fallback=EMPTY)

    def apply(self, logits: torch.Tensor, tree: DraftTree, tokens: Sequence[int]) -> torch.Tensor:
        out = self._call(self.inner.apply, logits, tree, tokens)
        return logits.float().clone() if out is None else out

    def advance(self, new_ids: Sequence[int]) -> int:
        return self._call(self.inner.advance, new_ids, fallback=len(new_ids))

    @property
    def finished(self) -> bool:
        return self.request.error is not None or bool(self._call(lambda: self.inner.finished, fallback=True))


def guard_stop(should_stop: Callable[[list[int]], bool], request: Failable) -> Callable[[list[int]], bool]:
    """A stop check that, when it raises, fails its request and ends the sequence."""
    part = GuardedPart(request, "stop check")
    return lambda output_ids: bool(part._call(should_stop, output_ids, fallback=True))
