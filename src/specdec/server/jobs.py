"""A submitted request on the event-loop side: scheduler events -> an API response or SSE chunks.

One class per endpoint over a shared base: ``Job`` owns what both share (collecting each
choice's tokens, logprobs, provenance and finish reason; usage and ``spec_decode`` extras;
waiting, cancelling on disconnect, the stream's framing); ``CompletionJob`` (/v1/completions:
echo, the legacy logprobs shape) and ``ChatJob`` (/v1/chat/completions: the role chunk, chat
logprobs, tool calls) say what a choice, a chunk and a response look like.

Choice i answers prompt i // n.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import ClassVar

from specdec.config import SamplingParams
from specdec.engine import StepResult
from specdec.llm import LLM
from specdec.provenance import PieceStream, step_origins
from specdec.server.errors import APIError, error_event
from specdec.server.logprob_format import TokenTexts, chat_logprobs, completion_logprobs
from specdec.server.metrics import ServerMetrics
from specdec.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatStreamChoice,
    CompletionChoice,
    CompletionChunk,
    CompletionRequest,
    CompletionResponse,
    DeltaMessage,
    PromptTokensDetails,
    SamplingRequest,
    SpecDecodeInfo,
    StepDetail,
    TokenProvenance,
    UsageInfo,
    dump_chunk,
)
from specdec.server.scheduler import Request, Scheduler
from specdec.server.tools import ToolReply, forced_call
from specdec.text import decode


@dataclass
class ServerState:
    llm: LLM
    scheduler: Scheduler
    metrics: ServerMetrics
    model_name: str
    max_model_len: int
    max_num_seqs: int


class ChoiceProvenance:
    """Token provenance of one choice (``specdec.provenance``: each token's origin and its share of the
    text): each engine step of the choice goes in; out come the text delta to stream (cut at token
    boundaries) with its ``spec_decode`` extras, and at the end the whole choice's ``TokenProvenance``
    for a non-streamed response."""

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


class Job:
    """What both endpoints share; a subclass names its endpoint's shapes and request fields."""

    id_prefix: ClassVar[str]  # the response id: f"{id_prefix}-{hex}"
    prompt_param: ClassVar[str]  # the request field a too-long prompt is blamed on
    grammar_param: ClassVar[str | None]  # the field a structured-output constraint comes from
    chunk_class: ClassVar[type]

    def __init__(self, state: ServerState, req: Request, body: SamplingRequest, prompts: list[list[int]]) -> None:
        self.state, self.req, self.body = state, req, body
        self.prompt_tokens = sum(len(p) for p in prompts)
        self.prompts = [p for p in prompts for _ in range(body.n)]
        self.outputs: list[list[int]] = [[] for _ in req.seqs]
        self.logprobs: list[list] = [[] for _ in req.seqs]
        self.reasons: list[str | None] = [None for _ in req.seqs]
        self.choices = [ChoiceProvenance(i, state.llm.tokenizer, body.stops, body.spec_decode_detail)
                        for i in range(len(req.seqs))]
        self.token_texts = TokenTexts(state.llm.tokenizer)
        self.finished = False
        self.created = int(time.time())

    @classmethod
    def sampling_params(cls, body: SamplingRequest, max_new_tokens: int) -> SamplingParams:
        """The engine's settings for one prompt (ValueError when invalid)."""
        return body.to_sampling_params(max_new_tokens)

    # -- what an endpoint says -----------------------------------------------------------------
    def _choice(self, i: int, text: str):
        """Choice i of the non-streamed response."""
        raise NotImplementedError

    def _update_chunk(self, u, send):
        """The streamed chunk of one step's update ``u`` (``send``: its text and extras, or None)."""
        raise NotImplementedError

    def _opening_chunks(self) -> list:
        """Chunks sent before the first token."""
        return []

    def _common(self) -> dict:
        return dict(id=self.req.id, created=self.created, model=self.state.model_name)

    # -- shared ----------------------------------------------------------------------------------
    def _apply(self, event) -> list:
        """Take in a step's updates; per update, what to stream: (text, spec_decode extras) or None."""
        sends = []
        for u in event.updates:
            self.outputs[u.index].extend(u.token_ids)
            self.logprobs[u.index].extend(u.logprobs)
            self.reasons[u.index] = u.finish_reason
            sends.append(self.choices[u.index].push(u.step, u.finish_reason is not None))
        return sends

    def _usage(self):
        completion = sum(len(o) for o in self.outputs)
        # each prompt's first choice (the n choices of a prompt follow one another in ``req.seqs``)
        cached = sum(s.stats.cached_prompt_tokens for s in self.req.seqs[:: self.body.n])
        return UsageInfo(prompt_tokens=self.prompt_tokens, completion_tokens=completion,
                         total_tokens=self.prompt_tokens + completion,
                         prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))

    @staticmethod
    def _spec(stats, extras: SpecDecodeInfo | None = None):
        """The request's stats, added to a chunk's or response's other ``spec_decode`` extras."""
        names = dict.fromkeys([*stats.drafted_by, *stats.drafter_windows])
        drafters = {name: dict(drafted=stats.drafted_by.get(name, 0), accepted=stats.accepted_by.get(name, 0),
                               window=stats.drafter_windows[name].to_dict() if name in stats.drafter_windows else None)
                    for name in names}
        return (extras or SpecDecodeInfo()).model_copy(update=dict(
            drafts=stats.drafts, drafted=stats.drafted, accepted=stats.accepted,
            acceptance_rate=round(stats.acceptance_rate, 4), mean_accepted_len=round(stats.mean_accepted_len, 4),
            window=stats.window.to_dict(), drafters=drafters, off_steps=stats.spec_off_steps,
            switch_offs=stats.spec_switch_offs, probes=stats.spec_probes))

    async def _next(self):
        event = await self.req.queue.get()
        if event.done:
            self.finished = True
        return event

    # -- non-streaming ------------------------------------------------------------------------
    async def collect(self, request) -> dict:
        watcher = asyncio.create_task(self._watch_disconnect(request))
        try:
            while True:
                event = await self._next()
                if event.error is not None:
                    raise APIError(event.status, f"generation failed: {event.error}", "server_error",
                                   event.status)
                self._apply(event)
                if event.done:
                    return self._response(event.stats)
        finally:
            watcher.cancel()
            if not self.finished:
                self.state.scheduler.cancel(self.req)

    async def _watch_disconnect(self, request, every: float = 0.25) -> None:
        while not self.finished:
            await asyncio.sleep(every)
            if await request.is_disconnected():
                self.state.scheduler.cancel(self.req)
                return

    def _response(self, stats) -> dict:
        spec = self._spec(stats, SpecDecodeInfo(choices=[c.record for c in self.choices]))
        choices = [self._choice(i, c.text) for i, c in enumerate(self.choices)]
        return self.response_class(choices=choices, usage=self._usage(), spec_decode=spec,
                                   **self._common()).model_dump()

    # -- streaming ----------------------------------------------------------------------------
    async def stream(self):
        """Server-sent events: one chunk per choice and step, then usage (if asked), then [DONE]."""
        try:
            for chunk in self._opening_chunks():
                yield dump_chunk(chunk)
            while True:
                event = await self._next()
                if event.error is not None:
                    yield error_event(f"generation failed: {event.error}", event.status)
                    break
                chunks = [c for u, send in zip(event.updates, self._apply(event), strict=True)
                          if (c := self._update_chunk(u, send)) is not None]
                if self.body.stream_options and self.body.stream_options.continuous_usage_stats:
                    for chunk in chunks:
                        chunk.usage = self._usage()
                if event.done and chunks:
                    chunks[-1].spec_decode = self._spec(event.stats, chunks[-1].spec_decode)
                for chunk in chunks:
                    yield dump_chunk(chunk)
                if event.done:
                    if self.body.include_usage:
                        yield dump_chunk(self.chunk_class(choices=[], usage=self._usage(),
                                                          spec_decode=self._spec(event.stats), **self._common()))
                    break
            yield "data: [DONE]\n\n"
        finally:
            if not self.finished:  # the client went away (or the server is stopping)
                self.state.scheduler.cancel(self.req)


class CompletionJob(Job):
    """/v1/completions: text choices, the prompt echoed on request, the legacy logprobs shape."""

    id_prefix, prompt_param, grammar_param = "cmpl", "prompt", None
    chunk_class, response_class = CompletionChunk, CompletionResponse
    body: CompletionRequest

    def __init__(self, state: ServerState, req: Request, body: CompletionRequest, prompts: list[list[int]]) -> None:
        super().__init__(state, req, body, prompts)
        self.wants_logprobs = body.logprobs is not None
        self.offsets = [0 for _ in req.seqs]  # logprobs' text_offset: characters streamed so far
        self.echoed = [False for _ in req.seqs]

    def _choice(self, i: int, text: str) -> CompletionChoice:
        prefix, ids, entries = self._echo(i)
        logprobs = None
        if self.wants_logprobs:
            logprobs = completion_logprobs(self.token_texts, [*ids, *self.outputs[i]], [*entries, *self.logprobs[i]])
        return CompletionChoice(index=i, text=prefix + text, logprobs=logprobs, finish_reason=self.reasons[i])

    def _update_chunk(self, u, send) -> CompletionChunk | None:
        delta, extras = send if send is not None else ("", None)
        prefix, echo_ids, echo_entries = self._echo(u.index)
        logprobs = None
        if self.wants_logprobs and (u.token_ids or echo_ids):
            logprobs = completion_logprobs(self.token_texts, [*echo_ids, *u.token_ids], [*echo_entries, *u.logprobs],
                                           self.offsets[u.index])
            self.offsets[u.index] += sum(len(t) for t in logprobs.tokens)
        if send is None and not prefix and logprobs is None and u.finish_reason is None:
            return None
        choice = CompletionChoice(index=u.index, text=prefix + delta, logprobs=logprobs, finish_reason=u.finish_reason)
        return CompletionChunk(choices=[choice], spec_decode=extras, **self._common())

    def _echo(self, i: int) -> tuple[str, list[int], list]:
        """Choice i's echoed prompt: (its text, its token ids, their logprobs) once; empty afterwards."""
        if not self.body.echo or self.echoed[i]:
            return "", [], []
        self.echoed[i] = True
        ids = self.prompts[i]
        entries = self.req.seqs[i].prompt_logprobs or [None] * len(ids)
        return decode(self.state.llm.tokenizer, ids), ids, entries


class ChatJob(Job):
    """/v1/chat/completions: assistant messages, chat logprobs; with tools the reply may be a call
    (``tools.ToolReply`` decides what of it streams when: a forced call piece by piece)."""

    id_prefix, prompt_param, grammar_param = "chatcmpl", "messages", "response_format"
    chunk_class, response_class = ChatCompletionChunk, ChatCompletionResponse
    body: ChatCompletionRequest

    def __init__(self, state: ServerState, req: Request, body: ChatCompletionRequest,
                 prompts: list[list[int]]) -> None:
        super().__init__(state, req, body, prompts)
        self.wants_logprobs = body.logprobs
        self.tools = list(body.tools or []) if body.template_tools else []
        self.forced = bool(self.tools and body.forced_tools)  # the reply is a call, generated under its schema
        self.replies = [ToolReply(self.tools, self.forced) for _ in req.seqs] if self.tools else []  # streamed
        self.num_logprobs_sent = [0 for _ in req.seqs]  # streamed tool replies: logprobs entries sent

    @classmethod
    def sampling_params(cls, body: ChatCompletionRequest, max_new_tokens: int) -> SamplingParams:
        """A forced tool call is generated under the call's schema (the request has no other constraint:
        the protocol refuses both)."""
        params = body.to_sampling_params(max_new_tokens)
        return replace(params, structured=forced_call(body.forced_tools)) if body.forced_tools else params

    def _logprobs(self, entries: list):
        return chat_logprobs(self.token_texts, entries) if self.wants_logprobs else None

    def _choice(self, i: int, text: str) -> ChatChoice:
        logprobs = self._logprobs(self.logprobs[i])
        if not self.tools:
            return ChatChoice(index=i, message=AssistantMessage(content=text), logprobs=logprobs,
                              finish_reason=self.reasons[i])
        reply = ToolReply(self.tools, self.forced)
        reply.push(text, final=True)
        message = AssistantMessage(content=None, tool_calls=reply.calls) if reply.calls \
            else AssistantMessage(content=text)
        return ChatChoice(index=i, message=message, logprobs=logprobs,
                          finish_reason=reply.finish_reason(self.reasons[i]))

    def _opening_chunks(self) -> list:
        role = DeltaMessage(role="assistant", content="")
        return [self._chunk(i, role, None, None) for i in range(len(self.outputs))]

    def _update_chunk(self, u, send) -> ChatCompletionChunk | None:
        if self.tools:  # the reply may be a tool call
            return self._tool_chunk(u, send)
        delta, extras = send if send is not None else ("", None)
        logprobs = self._logprobs(u.logprobs) if u.token_ids else None
        if send is None and logprobs is None and u.finish_reason is None:
            return None
        chunk = self._chunk(u.index, DeltaMessage(content=delta), u.finish_reason, logprobs)
        chunk.spec_decode = extras
        return chunk

    def _tool_chunk(self, u, send) -> ChatCompletionChunk | None:
        """A choice with tools: what its ToolReply lets out of this step (None: nothing yet)."""
        reply, i = self.replies[u.index], u.index
        text, extras = send if send is not None else ("", None)
        streaming_content = reply.content_mode
        delta = reply.push(text, u.finish_reason is not None)
        reason = None if u.finish_reason is None else reply.finish_reason(u.finish_reason)
        if delta is None and reason is None:
            return None
        logprobs = None
        if self.wants_logprobs:  # every entry not sent yet: held-back steps' too
            logprobs = chat_logprobs(self.token_texts, self.logprobs[i][self.num_logprobs_sent[i] :])
            self.num_logprobs_sent[i] = len(self.logprobs[i])
        chunk = self._chunk(i, delta or DeltaMessage(), reason, logprobs)
        if reply.content_mode:  # provenance of the content: on its first chunk, of all the text held back
            chunk.spec_decode = extras if streaming_content else self.choices[i].so_far()
        return chunk

    def _chunk(self, index: int, delta: DeltaMessage, finish_reason: str | None, logprobs) -> ChatCompletionChunk:
        choice = ChatStreamChoice(index=index, delta=delta, logprobs=logprobs, finish_reason=finish_reason)
        return ChatCompletionChunk(choices=[choice], **self._common())
