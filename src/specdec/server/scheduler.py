"""Continuous batching: a bounded request queue and one thread that drives the engine.

Requests join and leave between steps. Each turn of the loop

1. drops cancelled requests (the client left), freeing their KV cache slots;
2. admits waiting requests, first come first served, while slots are free, and
   prefills up to PREFILL_TOKENS_PER_TURN prompt tokens (``engine.prefill``; about
   ``prefill_seconds`` of them while other requests decode, where asked): a longer prompt is
   cached over several turns, with the running requests' decode step between them,
   so it never stalls them for its whole prefill. A request
   whose prompt is cached at once gets its first token from a pass of its own
   sequences without drafts, so time to first token never includes a verify pass
   of the running batch (vLLM and SGLang likewise emit the first token with the
   prefill);
3. caps the step's drafting with the user's ``DraftBudget`` and runs one ``engine.step``
   over every running sequence (the engine plans the drafts from the batch's pass cost):
   each sequence keeps its own number of accepted tokens;
4. hands every request its new tokens on its asyncio queue
   (``loop.call_soon_threadsafe``) and finishes the sequences that are done.

A request that arrives during a step therefore waits for that step, its own
prefill (and those of requests ahead of it) and one narrow plain pass: with or
without speculation, the same passes.

Only this thread touches the engine, the runner and the drafters. A failure that
belongs to one request (its drafter, its stop check, its prefill) fails that
request alone; a failure of the shared target pass fails the requests in that
pass. Either way the loop keeps running.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from specdec.budget import DraftBudget
from specdec.engine import Engine, SequenceState, StepResult
from specdec.log import get_logger
from specdec.logprobs import TokenLogprob
from specdec.server.guards import GuardedDrafter, GuardedProcessors, guard_stop
from specdec.stats import SpecStats

logger = get_logger(__name__)


# Prompt tokens prefilled per turn of the loop, over all requests: a longer prompt is cached over
# several turns, the running requests decoding between them (a float prompt of up to this many
# tokens still runs as one pass, as offline).
PREFILL_TOKENS_PER_TURN = 512
# A turn's least prompt tokens under ``prefill_seconds`` (a few rows a pass already cost about what one does).
MIN_PREFILL_CHUNK = 16


class QueueFullError(Exception):
    """Every slot is taken and the waiting queue is full: the client should retry later (429)."""


class SchedulerDownError(Exception):
    """The scheduler thread has stopped (shut down, or died): nothing can be served (503)."""


@dataclass(frozen=True)
class SeqUpdate:
    """One sequence's share of a step: which choice it is and the engine's result for it."""

    index: int  # the sequence's position in its request (the choice index)
    step: StepResult  # the engine's account of the step (tokens, drafter, accepted, rejected, logprobs)

    @property
    def token_ids(self) -> list[int]:
        """Tokens committed by this step."""
        return self.step.token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.step.finish_reason

    @property
    def logprobs(self) -> tuple[TokenLogprob, ...]:
        """For token_ids, when the request asked."""
        return self.step.logprobs


@dataclass
class RequestEvent:
    """What one step produced for one request; the last one has ``done`` set."""

    updates: list[SeqUpdate] = field(default_factory=list)
    done: bool = False
    stats: SpecStats | None = None  # merged over the request's sequences, on the last event
    error: str | None = None  # the request failed (the engine raised)
    status: int = 500


class Request:
    """One API request: one or more sequences that are admitted and finished together."""

    def __init__(self, request_id: str, seqs: list[SequenceState], loop: asyncio.AbstractEventLoop) -> None:
        self.id = request_id
        self.seqs = seqs
        self.loop = loop
        self.queue: asyncio.Queue[RequestEvent] = asyncio.Queue()
        self.cancelled = False
        self.error: str | None = None  # set by a guarded callback that raised
        self.arrival = time.perf_counter()
        self.first_token_at: float | None = None
        self.ended: set[int] = set()  # indices of sequences whose slot was released

    @property
    def done(self) -> bool:
        return all(s.finished for s in self.seqs)


class Scheduler:
    """Owns the engine on one thread; ``submit`` and ``cancel`` are called from the event loop."""

    def __init__(
        self,
        engine: Engine,
        max_num_seqs: int,
        budget: DraftBudget | None = None,
        max_queue: int = 64,
        metrics=None,  # specdec.server.metrics.ServerMetrics, or None
        prefill_seconds: float | None = None,
    ) -> None:
        """prefill_seconds (``--prefill-seconds``): while other requests decode, a turn prefills what the last
        prefill's rate fits in this many seconds (each of their next tokens waits for it), where a prompt's bits do
        not depend on its chunks (``runner.keeps_prefixes``: GGUF blocks); None: PREFILL_TOKENS_PER_TURN always."""
        if prefill_seconds is not None and not 0.0 < prefill_seconds < float("inf"):
            raise ValueError(f"prefill_seconds must be a number of seconds > 0, got {prefill_seconds}")
        self.engine = engine
        self.prefill_seconds = prefill_seconds
        self.max_num_seqs = max_num_seqs
        self.budget = budget or DraftBudget(engine.draft_n_max)
        self.max_queue = max_queue
        self.metrics = metrics
        self._cond = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._prefilling: list[Request] = []  # running requests whose prompts are not all cached yet
        self._prefill_token_seconds: float | None = None  # the last timed prefill's seconds a token
        self._num_running_seqs = 0
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.down: str | None = None  # why the thread no longer serves: shutting down, or what killed it
        self.num_steps = 0

    # -- event-loop side -------------------------------------------------------------------------
    def submit(self, request_id: str, seqs: list[SequenceState], loop: asyncio.AbstractEventLoop) -> Request:
        """Queue a request; raises QueueFullError when it would wait behind ``max_queue`` sequences."""
        if not 1 <= len(seqs) <= self.max_num_seqs:
            raise ValueError(f"a request needs 1 to {self.max_num_seqs} sequences, got {len(seqs)}")
        req = Request(request_id, seqs, loop)
        for seq in seqs:
            if seq.drafter is not None:
                seq.drafter = GuardedDrafter(seq.drafter, req)
            if seq.should_stop is not None:
                seq.should_stop = guard_stop(seq.should_stop, req)
            if seq.processors is not None:
                seq.processors = GuardedProcessors(seq.processors, req)
        with self._cond:
            if self.down is not None:
                raise SchedulerDownError(self.down)
            waiting = sum(len(r.seqs) for r in self._waiting)
            room = self.max_num_seqs - self._num_running_seqs
            if waiting + len(seqs) - room > self.max_queue:
                if self.metrics is not None:
                    self.metrics.rejected.inc()
                raise QueueFullError(
                    f"the server is at capacity ({self.max_num_seqs} running sequences, "
                    f"{waiting} waiting); retry later"
                )
            self._waiting.append(req)
            self._cond.notify()
        return req

    def cancel(self, req: Request) -> None:
        """The client left: drop the request at the next turn of the loop."""
        with self._cond:
            req.cancelled = True
            self._cond.notify()

    def snapshot(self) -> dict:
        with self._cond:
            return {
                "running_requests": len(self._running),
                "running_sequences": self._num_running_seqs,
                "waiting_requests": len(self._waiting),
                "free_slots": self.max_num_seqs - self._num_running_seqs,
                "max_num_seqs": self.max_num_seqs,
                "steps": self.num_steps,
            }

    # -- thread lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="specdec-scheduler", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stopping = True
            self.down = self.down or "the server is shutting down"
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        for req in [*self._running, *self._waiting]:
            self._fail(req, "the server is shutting down", status=503)
        self._waiting.clear()

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stopping and not self._waiting and not self._running:
                        self._cond.wait()
                    if self._stopping:
                        return
                self.run_turn()
        except BaseException as exc:  # noqa: BLE001 - e.g. a Rust panic: say so, never hang the clients
            self._die(f"the scheduler thread died: {type(exc).__name__}: {exc}")

    def _die(self, reason: str) -> None:
        """The thread ends: /health reports ``reason`` (503) and every request still here gets a 503."""
        logger.critical("specdec: %s", reason, exc_info=True)
        with self._cond:
            self.down = reason
            pending = [*self._running, *self._waiting]
            self._waiting.clear()
        for req in pending:
            self._fail(req, reason, status=503)

    def run_turn(self) -> None:
        """One turn of the loop: drop cancelled requests, admit and prefill (first tokens), one step.

        The scheduler thread calls it; a test may drive an unstarted scheduler with it, turn by turn.
        """
        with self._cond:
            self._drop_cancelled()
            admitted = self._admit()
        try:
            for req in admitted:
                self._start(req)
            self._prefill_turn()
            decoding = self._decoding()
            if decoding:
                self._step(decoding)
            self._publish_state()
        except Exception as exc:  # noqa: BLE001 - a bug here must not leave every client hanging
            logger.exception("scheduler turn failed")
            for req in list(self._running):
                self._fail(req, f"scheduler error: {type(exc).__name__}: {exc}")

    def _drop_cancelled(self) -> None:
        for req in [r for r in self._waiting if r.cancelled]:
            self._waiting.remove(req)
            self._abort(req)
        for req in [r for r in self._running if r.cancelled]:
            self._release(req)
            self._abort(req)

    def _abort(self, req: Request) -> None:
        self._record_finish(req, "abort")
        # Wake a handler that may still wait (499: the client closed the request).
        self._send(req, RequestEvent(done=True, error="cancelled", status=499))

    def _admit(self) -> list[Request]:
        """Move waiting requests to running while their sequences fit (FIFO: no overtaking)."""
        admitted = []
        while self._waiting and self._num_running_seqs + len(self._waiting[0].seqs) <= self.max_num_seqs:
            req = self._waiting.popleft()
            self._running.append(req)
            self._num_running_seqs += len(req.seqs)
            admitted.append(req)
        return admitted

    # -- engine work (scheduler thread only) --------------------------------------------------
    def _start(self, req: Request) -> None:
        """Slots and per-sequence state; the prompt is prefilled by ``_prefill_turn``, turn by turn."""
        try:
            self.engine.start(req.seqs, prefill=False)
        except Exception as exc:  # noqa: BLE001 - one request's start failed; the rest go on
            logger.exception("start failed for request %s", req.id)
            self._fail(req, f"prefill failed: {type(exc).__name__}: {exc}")
            return
        self._prefilling.append(req)

    def _prefill_turn(self) -> None:
        """Prefill up to ``_prefill_budget()`` prompt tokens, first come first served: a long prompt takes
        several turns, each followed by the running requests' decode step, so it delays them by one chunk's
        pass at a time instead of its whole prefill."""
        budget = self._prefill_budget()
        for req in list(self._prefilling):
            if budget <= 0:
                break
            before = sum(self.engine.runner.lengths[s.slot] for s in req.seqs)
            try:
                seconds = self.engine.prefill(req.seqs, budget)
            except Exception as exc:  # noqa: BLE001 - one request's prefill failed; the rest go on
                logger.exception("prefill failed for request %s", req.id)
                self._prefilling.remove(req)
                self._fail(req, f"prefill failed: {type(exc).__name__}: {exc}")
                continue
            done = sum(self.engine.runner.lengths[s.slot] for s in req.seqs) - before
            budget -= done
            if done >= MIN_PREFILL_CHUNK:
                self._prefill_token_seconds = seconds / done
            if all(self.engine.prefilled(s) for s in req.seqs):
                self._prefilling.remove(req)
                self._ready(req)

    def _decoding(self) -> list[Request]:
        """The running requests whose prompts are cached: those a step decodes."""
        return [r for r in self._running if r not in self._prefilling]

    def _prefill_budget(self) -> int:
        """This turn's prompt tokens: PREFILL_TOKENS_PER_TURN, or while other requests decode under
        ``prefill_seconds`` what the last prefill's rate fits in it, within [MIN_PREFILL_CHUNK,
        PREFILL_TOKENS_PER_TURN] (PREFILL_TOKENS_PER_TURN until a prefill of MIN_PREFILL_CHUNK tokens is timed)."""
        rate = self._prefill_token_seconds
        if not (self._decoding() and self.prefill_seconds and rate and self.engine.runner.keeps_prefixes):
            return PREFILL_TOKENS_PER_TURN
        return max(MIN_PREFILL_CHUNK, min(PREFILL_TOKENS_PER_TURN, int(self.prefill_seconds / rate)))

    def _ready(self, req: Request) -> None:
        """A request whose prompts are cached: its first token now (or, scoring only, its answer)."""
        if req.error is not None:
            self._fail(req, req.error)
            return
        if self.metrics is not None:
            self.metrics.prompt_tokens.inc(sum(len(s.prompt_ids) for s in req.seqs))
        if req.done:  # max_new_tokens 0 (scoring the prompt: echo with max_tokens 0): the prefill was all
            updates = [SeqUpdate(i, StepResult.empty(s.finish_reason)) for i, s in enumerate(req.seqs)]
            self._release(req)
            self._record_finish(req, _request_reason(req))
            self._send(req, RequestEvent(updates, done=True, stats=self._merged_stats(req)))
            return
        # The first token at once, from a pass of this request alone and without drafts: its
        # client must not wait for a verify pass of the whole batch (nor for later prefills).
        self._step([req], first_token=True)

    def _step(self, reqs: list[Request], first_token: bool = False) -> None:
        """One engine step over the unfinished sequences of ``reqs``; deliver what each got."""
        seqs = [s for r in reqs for s in r.seqs if not s.finished]
        if not seqs:
            return
        # The engine itself cuts drafts so a padded batch pass fits every sequence's cache.
        k = 0 if first_token else self.budget(len(seqs))
        t0 = time.perf_counter()
        try:
            results = self.engine.step(seqs, draft_budget=k)
        except Exception as exc:  # noqa: BLE001 - the shared pass failed: fail its requests, keep looping
            logger.exception("engine step failed")
            for req in reqs:
                self._fail(req, f"engine step failed: {type(exc).__name__}: {exc}")
            return
        seconds = time.perf_counter() - t0
        self.num_steps += 1
        new_by_seq = {id(s): r for s, r in zip(seqs, results, strict=True)}
        if self.metrics is not None:
            for r in results:
                self.metrics.record_result(r)
            draft_s = sum(r.draft_seconds for r in results)
            self.metrics.record_step(len(seqs), k, seconds, draft_s, results[0].pass_seconds)
        for req in reqs:
            self._deliver_step(req, new_by_seq)

    def _deliver_step(self, req: Request, new_by_seq: dict[int, StepResult]) -> None:
        if req.error is not None:
            self._fail(req, req.error)
            return
        updates = []
        for i, seq in enumerate(req.seqs):
            step = new_by_seq.get(id(seq))
            if step is None:
                continue
            updates.append(SeqUpdate(i, step))
            if seq.finished:
                self._end_seq(req, i)
        if not updates:
            return
        if req.first_token_at is None and any(u.token_ids for u in updates):
            req.first_token_at = time.perf_counter()
            if self.metrics is not None:
                self.metrics.ttft.observe(req.first_token_at - req.arrival)
        if req.done:
            self._remove(req)
            stats = self._merged_stats(req)
            self._record_finish(req, _request_reason(req))
            self._send(req, RequestEvent(updates, done=True, stats=stats))
        else:
            self._send(req, RequestEvent(updates))

    # -- bookkeeping -------------------------------------------------------------------------------
    def _end_seq(self, req: Request, index: int) -> None:
        """Free one sequence's slot (and let its drafter see the output) once, whatever happens."""
        if index in req.ended:
            return
        req.ended.add(index)
        seq = req.seqs[index]
        try:
            self.engine.finish(seq)
        except Exception:  # noqa: BLE001 - the slot must not leak because a drafter's end() failed
            logger.exception("finishing a sequence of request %s failed", req.id)
            if seq.slot >= 0:
                self.engine.runner.free(seq.slot)
                seq.slot = -1
        with self._cond:
            self._num_running_seqs -= 1

    def _release(self, req: Request) -> None:
        for i in range(len(req.seqs)):
            self._end_seq(req, i)
        self._remove(req)

    def _remove(self, req: Request) -> None:
        with self._cond:
            if req in self._running:
                self._running.remove(req)
            if req in self._prefilling:
                self._prefilling.remove(req)

    def _fail(self, req: Request, message: str, status: int = 500) -> None:
        if req in self._running:
            self._release(req)
        self._record_finish(req, "error")
        self._send(req, RequestEvent(done=True, stats=self._merged_stats(req), error=message, status=status))

    def _merged_stats(self, req: Request) -> SpecStats:
        stats = SpecStats()
        for seq in req.seqs:
            stats.merge(seq.stats)
        stats.seconds = time.perf_counter() - req.arrival
        return stats

    def _record_finish(self, req: Request, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.record_finish(reason, sum(s.num_output for s in req.seqs), time.perf_counter() - req.arrival)

    def _publish_state(self) -> None:
        if self.metrics is not None:
            snap = self.snapshot()
            self.metrics.record_state(snap["waiting_requests"], snap["running_requests"], snap["free_slots"])

    @staticmethod
    def _send(req: Request, event: RequestEvent) -> None:
        try:
            req.loop.call_soon_threadsafe(req.queue.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass


def _request_reason(req: Request) -> str:
    reasons = {s.finish_reason for s in req.seqs}
    return "length" if "length" in reasons else "stop"
