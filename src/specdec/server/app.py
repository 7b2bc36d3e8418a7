"""OpenAI-compatible HTTP server: routes, server-sent events. ``specdec serve`` is in ``server/cli.py``.

    POST /v1/completions, POST /v1/chat/completions (``stream: true`` = SSE ending with ``data: [DONE]``)
    GET  /v1/models, GET /health, GET /metrics (Prometheus)
    GET  / (playground), GET /dashboard, GET /metrics/live (the dashboard's data): see ``web.py``

Every token streamed or returned comes with its provenance (``spec_decode.tokens``
and ``origins``: which drafter proposed it, or the target), see ``provenance.py``.

Every request becomes one or more engine sequences handed to the Scheduler,
which batches them continuously on its own thread. Errors always come back as
``{"error": {"message", "type", "param", "code"}}`` with a 4xx status for bad
input, 429 when the queue is full, and 500 when the engine failed on this
request; the server itself stays up.

FastAPI is imported inside ``create_app`` and ``serve`` so ``specdec generate``
does not pay for it (about half a second). (No ``from __future__ import annotations``
here: FastAPI reads the route annotations, which name classes imported inside
``create_app``.)
"""

import asyncio
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass

from specdec.budget import DraftBudget
from specdec.config import SamplingParams, SpecType, parse_spec_types
from specdec.grammar import GrammarError
from specdec.llm import LLM
from specdec.scheduler import QueueFullError, Request, Scheduler
from specdec.server.edge import DEFAULT_MAX_BODY_BYTES, EdgePolicy, GuardMiddleware, error_body
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
    ModelCard,
    ModelList,
    SpecDecodeInfo,
    UsageInfo,
    dump_chunk,
)
from specdec.server.provenance import ChoiceProvenance
from specdec.server.tools import ToolReply, forced_call
from specdec.server.web import add_web_routes
from specdec.text import as_prompt_list, decode

logger = logging.getLogger("specdec.server")

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions


class APIError(Exception):
    """An error answered with an OpenAI error body."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 code: str | int | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param

    def body(self) -> dict:
        return error_body(self.message, self.type, self.code, self.param)


# -- the application -----------------------------------------------------------------------------
@dataclass
class ServerState:
    llm: LLM
    scheduler: Scheduler
    metrics: ServerMetrics
    model_name: str
    max_model_len: int
    max_num_seqs: int


def create_app(
    llm: LLM,
    *,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_queue: int = 64,
    budget: DraftBudget | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    edge: EdgePolicy | None = None,
):
    """A FastAPI app serving ``llm`` (a specdec.llm.LLM; its ``max_num_seqs`` is the batch limit).

    ``edge``: the hosts and origins it answers and whether /metrics and /health need the key
    (``edge.py``; default: a server bound to 127.0.0.1, as ``specdec serve``).

    The scheduler thread starts and stops with the app's lifespan; at its end ``llm.close()`` saves
    what drafters learned (--spec-ngram-cache-file).
    """
    # FastAPI and Starlette stay lazy: only `specdec serve` needs them (see the module docstring).
    from fastapi import FastAPI
    from fastapi import Request as HTTPRequest
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException as StarletteHTTPException

    name = served_model_name or llm.model_name
    metrics = ServerMetrics(name)
    num_seqs = llm.runner.num_slots
    scheduler = Scheduler(
        llm.engine, num_seqs, budget or DraftBudget(llm.spec.draft_n_max),
        max_queue=max_queue, metrics=metrics,
    )
    state = ServerState(llm, scheduler, metrics, name, llm.runner.max_seq_len, num_seqs)

    @asynccontextmanager
    async def lifespan(_app):
        scheduler.start()
        try:
            yield
        finally:
            await asyncio.to_thread(scheduler.stop)
            try:
                llm.close()  # after the last request: saves --spec-ngram-cache-file
            except ValueError as exc:
                logger.error("specdec: error: %s", exc)

    app = FastAPI(title="specdec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.specdec = state
    app.add_middleware(GuardMiddleware, api_key=api_key, max_body_bytes=max_body_bytes,
                       edge=edge or EdgePolicy.for_bind("127.0.0.1"))

    @app.exception_handler(APIError)
    async def _api_error(_req, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_req, exc: RequestValidationError):
        message, param = describe_validation_errors(exc.errors())
        return JSONResponse(error_body(message, "invalid_request_error", "invalid_value", param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_req, exc: StarletteHTTPException):
        type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), type_, exc.status_code), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal_error(_req, exc: Exception):
        logger.exception("unhandled error")
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}", "server_error", 500),
                            status_code=500)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": name, **scheduler.snapshot()}

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/v1/models")
    async def models():
        return ModelList(data=[ModelCard(id=name, max_model_len=state.max_model_len)]).model_dump()

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: HTTPRequest):
        check_model(state, body.model)
        prompts = await asyncio.to_thread(encode_prompts, llm, body.prompt)
        return await serve(state, request, body, prompts, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: HTTPRequest):
        check_model(state, body.model)
        messages = [m.as_template_dict() for m in body.messages]
        ids = await asyncio.to_thread(encode_chat, llm, messages, body.template_tools)
        return await serve(state, request, body, [ids], chat=True)

    add_web_routes(app, state, api_key_required=bool(api_key))
    return app


def describe_validation_errors(errors) -> tuple[str, str | None]:
    """pydantic errors -> one readable line, and the first offending field."""
    parts, param = [], None
    for err in list(errors)[:5]:
        if err.get("type") == "json_invalid":
            parts.append("the body is not valid JSON")
            continue
        field = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        param = param or field or None
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        parts.append(f"{field}: {msg}" if field else msg)
    return ("; ".join(parts) or "invalid request")[:1000], param


# -- request handling --------------------------------------------------------------------------
def check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model != state.model_name:
        raise APIError(404, f"the model {model!r} does not exist; this server serves {state.model_name!r}",
                       "not_found_error", "model_not_found", "model")


def encode_prompts(llm, prompt) -> list[list[int]]:
    """str | list[str] | list[int] | list[list[int]] -> token ids per prompt (400 when unusable)."""
    prompt = as_prompt_list(prompt)
    if not prompt:
        raise APIError(400, "the prompt is empty", code="empty_prompt", param="prompt")
    out = []
    for p in prompt:
        if isinstance(p, str):
            if not p:
                raise APIError(400, "the prompt is empty", code="empty_prompt", param="prompt")
            try:
                ids = llm.encode(p)
            except Exception as exc:  # noqa: BLE001 - e.g. text the tokenizer cannot encode
                raise APIError(400, f"cannot tokenize the prompt: {exc}", param="prompt") from None
        else:
            ids = list(p)
            vocab = llm.runner.vocab_size
            if any(not 0 <= t < vocab for t in ids):
                raise APIError(400, f"token ids must be in [0, {vocab})", param="prompt")
        if not ids:
            raise APIError(400, "the prompt is empty", code="empty_prompt", param="prompt")
        out.append(ids)
    return out


def encode_chat(llm, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    try:
        ids = llm.chat_prompt(messages, tools=tools)
    except Exception as exc:  # noqa: BLE001 - template errors (role order, ...) are the caller's input
        raise APIError(400, f"cannot apply the chat template: {exc}", param="messages") from None
    if not ids:
        raise APIError(400, "the chat prompt is empty", code="empty_prompt", param="messages")
    return ids


def sampling_params(state: ServerState, body, prompt_len: int, chat: bool) -> SamplingParams:
    """The request's sampling settings for one prompt; 400 when they cannot fit the context."""
    room = state.max_model_len - prompt_len
    if room < 1:
        raise APIError(400, f"the prompt has {prompt_len} tokens but the context holds {state.max_model_len}; "
                       "shorten it", code="context_length_exceeded", param="messages" if chat else "prompt")
    asked = body.requested_max_tokens
    if asked is None:
        max_tokens = room if chat else min(DEFAULT_COMPLETION_TOKENS, room)
    elif prompt_len + asked > state.max_model_len:
        raise APIError(400, f"this model's maximum context length is {state.max_model_len} tokens; you asked for "
                       f"{prompt_len + asked} ({prompt_len} in the prompt, {asked} for the completion)",
                       code="context_length_exceeded", param="max_tokens")
    else:
        max_tokens = asked
    seed = None if body.seed is None else body.seed % 2**63
    bias = body.logit_bias_ids
    if any(not 0 <= t < state.llm.runner.vocab_size for t in bias):
        raise APIError(400, f"logit_bias token ids must be in [0, {state.llm.runner.vocab_size})", param="logit_bias")
    if chat:
        logprobs, prompt_logprobs = ((body.top_logprobs or 0) if body.logprobs else None), None
        structured = forced_call(body.forced_tools) if body.forced_tools else body.structured
    else:
        logprobs, structured = body.logprobs, body.structured
        prompt_logprobs = body.logprobs if body.echo else None
        if max_tokens == 0 and prompt_logprobs is None:  # echo alone: the engine scores, nobody reads it
            prompt_logprobs = 0
    try:
        return SamplingParams(
            max_new_tokens=max_tokens, temperature=body.temperature, top_k=max(body.top_k, 0), top_p=body.top_p,
            min_p=body.min_p, seed=seed, stop=body.stops, ignore_eos=body.ignore_eos, logprobs=logprobs,
            prompt_logprobs=prompt_logprobs, presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty, repetition_penalty=body.repetition_penalty, logit_bias=bias,
            min_tokens=body.min_tokens, bad_words=tuple(body.bad_words or ()), structured=structured,
        )
    except ValueError as exc:
        raise APIError(400, str(exc)) from None


def drafter_types(state: ServerState, text: str | None) -> tuple[SpecType, ...] | None:
    """A request's ``spec_decode_drafter`` -> the loaded methods to draft with (400 when not loaded)."""
    if text is None:
        return None
    try:
        types = parse_spec_types(text)
        state.llm.drafts.loaded(types)
    except ValueError as exc:
        raise APIError(400, str(exc), param="spec_decode_drafter") from None
    return types


def new_sequence(state: ServerState, ids: list[int], params: SamplingParams, chat: bool,
                 spec_types: tuple[SpecType, ...] | None = None):
    """An engine sequence; a schema, regex or grammar that does not compile is the caller's 400."""
    try:
        return state.llm.new_sequence(ids, params, spec_types)
    except GrammarError as exc:
        raise APIError(400, str(exc), code="invalid_grammar", param="response_format" if chat else None) from None
    except ValueError as exc:
        raise APIError(400, str(exc)) from None


async def serve(state: ServerState, request, body, prompts: list[list[int]], chat: bool):
    from fastapi.responses import JSONResponse, StreamingResponse  # lazy: see the module docstring

    num_seqs = len(prompts) * body.n
    if num_seqs > state.max_num_seqs:
        raise APIError(400, f"this request needs {num_seqs} sequences (prompts x n) but the server runs at most "
                       f"{state.max_num_seqs} at once (--max-batch-size)", param="n")
    seqs = []
    spec_types = drafter_types(state, body.spec_decode_drafter)
    for ids in prompts:
        params = sampling_params(state, body, len(ids), chat)
        for j in range(body.n):
            seqs.append(new_sequence(state, ids, params.for_choice(j), chat, spec_types))
    prefix = "chatcmpl" if chat else "cmpl"
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    try:
        req = state.scheduler.submit(request_id, seqs, asyncio.get_running_loop())
    except QueueFullError as exc:
        raise APIError(429, str(exc), "rate_limit_error", "rate_limit_exceeded") from None
    job = Job(state, req, body, prompts, chat)
    if body.stream:
        return StreamingResponse(job.stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    payload = await job.collect(request)
    return JSONResponse(payload)


class Job:
    """One submitted request on the event-loop side: turns scheduler events into API responses.

    Choice i answers prompt i // n. With tools in a chat request the reply may be a call:
    ``tools.ToolReply`` decides what of it streams when (a forced call piece by piece).
    """

    def __init__(self, state: ServerState, req: Request, body, prompts: list[list[int]], chat: bool) -> None:
        self.state, self.req, self.body, self.chat = state, req, body, chat
        self.prompt_tokens = sum(len(p) for p in prompts)
        self.prompts = [p for p in prompts for _ in range(body.n)]
        self.outputs: list[list[int]] = [[] for _ in req.seqs]
        self.logprobs: list[list] = [[] for _ in req.seqs]
        self.reasons: list[str | None] = [None for _ in req.seqs]
        self.choices = [ChoiceProvenance(i, state.llm.tokenizer, body.stops, body.spec_decode_detail)
                        for i in range(len(req.seqs))]
        self.token_texts = TokenTexts(state.llm.tokenizer)
        self.offsets = [0 for _ in req.seqs]  # completions logprobs: characters streamed so far
        self.echo = not chat and body.echo
        self.echoed = [False for _ in req.seqs]
        self.tools = list(body.tools or []) if chat and body.template_tools else []
        self.forced = bool(self.tools and body.forced_tools)  # the reply is a call, generated under its schema
        self.replies = [ToolReply(self.tools, self.forced) for _ in req.seqs] if self.tools else []  # streamed
        self.num_logprobs_sent = [0 for _ in req.seqs]  # streamed tool replies: logprobs entries sent
        self.wants_logprobs = (body.logprobs if chat else body.logprobs is not None) or False
        self.finished = False
        self.created = int(time.time())

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
        return UsageInfo(prompt_tokens=self.prompt_tokens, completion_tokens=completion,
                         total_tokens=self.prompt_tokens + completion)

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
        texts = [c.text for c in self.choices]
        spec = self._spec(stats, SpecDecodeInfo(choices=[c.record for c in self.choices]))
        common = dict(id=self.req.id, created=self.created, model=self.state.model_name, usage=self._usage(),
                      spec_decode=spec)
        if self.chat:
            choices = [self._chat_choice(i, t) for i, t in enumerate(texts)]
            return ChatCompletionResponse(choices=choices, **common).model_dump()
        choices = []
        for i, text in enumerate(texts):
            prefix, ids, entries = self._echo(i)
            logprobs = None
            if self.wants_logprobs:
                logprobs = completion_logprobs(self.token_texts, [*ids, *self.outputs[i]],
                                               [*entries, *self.logprobs[i]])
            choices.append(CompletionChoice(index=i, text=prefix + text, logprobs=logprobs,
                                            finish_reason=self.reasons[i]))
        return CompletionResponse(choices=choices, **common).model_dump()

    def _chat_choice(self, i: int, text: str) -> ChatChoice:
        logprobs = chat_logprobs(self.token_texts, self.logprobs[i]) if self.wants_logprobs else None
        if not self.tools:
            return ChatChoice(index=i, message=AssistantMessage(content=text), logprobs=logprobs,
                              finish_reason=self.reasons[i])
        reply = ToolReply(self.tools, self.forced)
        reply.push(text, final=True)
        message = AssistantMessage(content=None, tool_calls=reply.calls) if reply.calls \
            else AssistantMessage(content=text)
        return ChatChoice(index=i, message=message, logprobs=logprobs,
                          finish_reason=reply.finish_reason(self.reasons[i]))

    def _echo(self, i: int) -> tuple[str, list[int], list]:
        """Choice i's echoed prompt: (its text, its token ids, their logprobs) once; empty afterwards."""
        if not self.echo or self.echoed[i]:
            return "", [], []
        self.echoed[i] = True
        ids = self.prompts[i]
        entries = self.req.seqs[i].prompt_logprobs or [None] * len(ids)
        return decode(self.state.llm.tokenizer, ids), ids, entries

    # -- streaming ----------------------------------------------------------------------------
    async def stream(self):
        """Server-sent events: one chunk per choice and step, then usage (if asked), then [DONE]."""
        try:
            if self.chat:
                for i in range(len(self.outputs)):
                    yield dump_chunk(self._chunk(i, "", None, role=True))
            while True:
                event = await self._next()
                if event.error is not None:
                    body = error_body(f"generation failed: {event.error}", "server_error", event.status)
                    yield f"data: {json.dumps(body)}\n\n"
                    break
                chunks = self._event_chunks(event)
                if self.body.stream_options and self.body.stream_options.continuous_usage_stats:
                    for chunk in chunks:
                        chunk.usage = self._usage()
                if event.done and chunks:
                    chunks[-1].spec_decode = self._spec(event.stats, chunks[-1].spec_decode)
                for chunk in chunks:
                    yield dump_chunk(chunk)
                if event.done:
                    if self.body.include_usage:
                        yield dump_chunk(self._usage_chunk(event.stats))
                    break
            yield "data: [DONE]\n\n"
        finally:
            if not self.finished:  # the client went away (or the server is stopping)
                self.state.scheduler.cancel(self.req)

    def _event_chunks(self, event) -> list:
        chunks = []
        for u, send in zip(event.updates, self._apply(event), strict=True):
            if self.tools:  # the reply may be a tool call
                chunk = self._tool_chunk(u, send)
                if chunk is not None:
                    chunks.append(chunk)
                continue
            delta, extras = send if send is not None else ("", None)
            prefix, echo_ids, echo_entries = self._echo(u.index)
            logprobs = None
            if self.wants_logprobs and (u.token_ids or echo_ids):
                logprobs = self._chunk_logprobs(u.index, [*echo_ids, *u.token_ids], [*echo_entries, *u.logprobs])
            if send is not None or prefix or logprobs is not None or u.finish_reason is not None:
                chunk = self._chunk(u.index, prefix + delta, u.finish_reason, logprobs=logprobs)
                chunk.spec_decode = extras
                chunks.append(chunk)
        return chunks

    def _chunk_logprobs(self, index: int, ids: list[int], entries: list):
        if self.chat:
            return chat_logprobs(self.token_texts, entries)
        out = completion_logprobs(self.token_texts, ids, entries, self.offsets[index])
        self.offsets[index] += sum(len(t) for t in out.tokens)
        return out

    def _tool_chunk(self, u, send):
        """A chat choice with tools: what its ToolReply lets out of this step (None: nothing yet)."""
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
        choice = ChatStreamChoice(index=i, delta=delta or DeltaMessage(), logprobs=logprobs, finish_reason=reason)
        chunk = ChatCompletionChunk(choices=[choice], id=self.req.id, created=self.created,
                                    model=self.state.model_name)
        if reply.content_mode:  # provenance of the content: on its first chunk, of all the text held back
            chunk.spec_decode = extras if streaming_content else self.choices[i].so_far()
        return chunk

    def _chunk(self, index: int, text: str, finish_reason: str | None, role: bool = False, logprobs=None):
        common = dict(id=self.req.id, created=self.created, model=self.state.model_name)
        if self.chat:
            delta = DeltaMessage(role="assistant", content="") if role else DeltaMessage(content=text)
            choice = ChatStreamChoice(index=index, delta=delta, logprobs=logprobs, finish_reason=finish_reason)
            return ChatCompletionChunk(choices=[choice], **common)
        choice = CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=finish_reason)
        return CompletionChunk(choices=[choice], **common)

    def _usage_chunk(self, stats):
        cls = ChatCompletionChunk if self.chat else CompletionChunk
        return cls(id=self.req.id, created=self.created, model=self.state.model_name, choices=[],
                   usage=self._usage(), spec_decode=self._spec(stats))
