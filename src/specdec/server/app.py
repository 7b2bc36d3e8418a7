"""OpenAI-compatible HTTP server: routes, server-sent events, ``specdec serve``.

    POST /v1/completions, POST /v1/chat/completions (``stream: true`` = SSE ending with ``data: [DONE]``)
    GET  /v1/models, GET /health, GET /metrics (Prometheus)

Every request becomes one or more engine sequences handed to the Scheduler,
which batches them continuously on its own thread. Errors always come back as
``{"error": {"message", "type", "param", "code"}}`` with a 4xx status for bad
input, 429 when the queue is full, and 500 when the engine failed on this
request; the server itself stays up.

FastAPI is imported inside ``create_app`` so ``specdec generate`` does not pay
for it. (No ``from __future__ import annotations`` here: FastAPI reads the
route annotations, which name classes imported inside ``create_app``.)
"""

import argparse
import asyncio
import hmac
import json
import logging
import os
import sys
import time
import uuid
from dataclasses import dataclass

from specdec.config import SamplingParams, SpecConfig, SpecType
from specdec.scheduler import DraftBudget, QueueFullError, Request, Scheduler

logger = logging.getLogger("specdec.server")

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions


class APIError(Exception):
    """An error answered with an OpenAI error body."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 code: str | int | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param

    def body(self) -> dict:
        return error_body(self.message, self.type, self.code, self.param)


def error_body(message: str, type_: str, code: str | int | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# -- the application -----------------------------------------------------------------------------
@dataclass
class ServerState:
    llm: object  # specdec.llm.LLM
    scheduler: Scheduler
    metrics: object  # specdec.server.metrics.ServerMetrics
    model_name: str
    max_model_len: int
    max_num_seqs: int


def create_app(
    llm,
    *,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_queue: int = 64,
    budget: DraftBudget | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
):
    """A FastAPI app serving ``llm`` (a specdec.llm.LLM; its ``max_num_seqs`` is the batch limit).

    The scheduler thread starts and stops with the app's lifespan.
    """
    from contextlib import asynccontextmanager

    from fastapi import FastAPI
    from fastapi import Request as HTTPRequest
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from specdec.server.metrics import ServerMetrics
    from specdec.server.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList

    name = served_model_name or llm.model_name
    metrics = ServerMetrics(name)
    num_seqs = llm.runner.num_slots
    scheduler = Scheduler(
        llm.engine, num_seqs, budget or DraftBudget(llm.spec.draft_n_max, llm.spec.draft_n_max),
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

    app = FastAPI(title="specdec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.specdec = state
    app.add_middleware(GuardMiddleware, api_key=api_key, max_body_bytes=max_body_bytes)

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
        ids = await asyncio.to_thread(encode_chat, llm, messages)
        return await serve(state, request, body, [ids], chat=True)

    return app


class GuardMiddleware:
    """Plain ASGI middleware: the API key on every /v1 route, and a request size limit.

    Written against ASGI directly (not BaseHTTPMiddleware) so streamed responses
    and client disconnects pass through untouched.
    """

    def __init__(self, app, api_key: str | None, max_body_bytes: int) -> None:
        self.app, self.api_key, self.max_body_bytes = app, api_key, max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            if self.api_key and scope["path"].startswith("/v1"):
                given = headers.get("authorization", "")
                token = given[7:] if given[:7].lower() == "bearer " else ""
                if not hmac.compare_digest(token.encode(), self.api_key.encode()):
                    body = error_body("invalid or missing API key (send 'Authorization: Bearer KEY')",
                                      "authentication_error", "invalid_api_key")
                    await _send_json(send, 401, body, {"www-authenticate": "Bearer"})
                    return
            length = headers.get("content-length", "")
            if length.isdigit() and int(length) > self.max_body_bytes:
                body = error_body(f"request body too large ({length} bytes > {self.max_body_bytes})",
                                  "invalid_request_error", "request_too_large")
                await _send_json(send, 413, body)
                return
        await self.app(scope, receive, send)


async def _send_json(send, status: int, body: dict, extra_headers: dict | None = None) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in (extra_headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


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
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
        prompt = [prompt]
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


def encode_chat(llm, messages: list[dict]) -> list[int]:
    try:
        ids = llm.chat_prompt(messages)
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
    try:
        return SamplingParams(
            max_new_tokens=max_tokens, temperature=body.temperature, top_k=max(body.top_k, 0), top_p=body.top_p,
            min_p=body.min_p, seed=seed, stop=body.stops, ignore_eos=body.ignore_eos,
        )
    except ValueError as exc:
        raise APIError(400, str(exc)) from None


async def serve(state: ServerState, request, body, prompts: list[list[int]], chat: bool):
    from fastapi.responses import JSONResponse, StreamingResponse

    num_seqs = len(prompts) * body.n
    if num_seqs > state.max_num_seqs:
        raise APIError(400, f"this request needs {num_seqs} sequences (prompts x n) but the server runs at most "
                       f"{state.max_num_seqs} at once (--max-batch-size)", param="n")
    seqs = []
    for ids in prompts:
        params = sampling_params(state, body, len(ids), chat)
        for j in range(body.n):
            seqs.append(state.llm.new_sequence(ids, params.for_choice(j)))
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
    """One submitted request on the event-loop side: turns scheduler events into API responses."""

    def __init__(self, state: ServerState, req: Request, body, prompts: list[list[int]], chat: bool) -> None:
        from specdec.text import TextStream

        self.state, self.req, self.body, self.chat = state, req, body, chat
        self.prompt_tokens = sum(len(p) for p in prompts)
        self.outputs: list[list[int]] = [[] for _ in req.seqs]
        self.reasons: list[str | None] = [None for _ in req.seqs]
        self.texts = [TextStream(state.llm.tokenizer, body.stops) for _ in req.seqs]
        self.finished = False
        self.created = int(time.time())

    def _apply(self, event) -> None:
        for u in event.updates:
            self.outputs[u.index].extend(u.token_ids)
            self.reasons[u.index] = u.finish_reason

    def _usage(self):
        from specdec.server.protocol import UsageInfo

        completion = sum(len(o) for o in self.outputs)
        return UsageInfo(prompt_tokens=self.prompt_tokens, completion_tokens=completion,
                         total_tokens=self.prompt_tokens + completion)

    @staticmethod
    def _spec(stats):
        from specdec.server.protocol import SpecDecodeInfo

        return SpecDecodeInfo(drafts=stats.drafts, drafted=stats.drafted, accepted=stats.accepted,
                              acceptance_rate=round(stats.acceptance_rate, 4),
                              mean_accepted_len=round(stats.mean_accepted_len, 4))

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
        from specdec.server.protocol import (
            AssistantMessage,
            ChatChoice,
            ChatCompletionResponse,
            CompletionChoice,
            CompletionResponse,
        )

        texts = [ts.final(ids) for ts, ids in zip(self.texts, self.outputs, strict=True)]
        common = dict(id=self.req.id, created=self.created, model=self.state.model_name, usage=self._usage(),
                      spec_decode=self._spec(stats))
        if self.chat:
            choices = [ChatChoice(index=i, message=AssistantMessage(content=t), finish_reason=r)
                       for i, (t, r) in enumerate(zip(texts, self.reasons, strict=True))]
            return ChatCompletionResponse(choices=choices, **common).model_dump()
        choices = [CompletionChoice(index=i, text=t, finish_reason=r)
                   for i, (t, r) in enumerate(zip(texts, self.reasons, strict=True))]
        return CompletionResponse(choices=choices, **common).model_dump()

    # -- streaming ----------------------------------------------------------------------------
    async def stream(self):
        """Server-sent events: one chunk per choice and step, then usage (if asked), then [DONE]."""
        from specdec.server.protocol import dump_chunk

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
                    chunks[-1].spec_decode = self._spec(event.stats)
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
        self._apply(event)
        for u in event.updates:
            ids, ts = self.outputs[u.index], self.texts[u.index]
            delta = ts.push(ids)
            if u.finish_reason is not None:
                delta += ts.flush(ids)
            if delta or u.finish_reason is not None:
                chunks.append(self._chunk(u.index, delta, u.finish_reason))
        return chunks

    def _chunk(self, index: int, text: str, finish_reason: str | None, role: bool = False):
        from specdec.server.protocol import (
            ChatCompletionChunk,
            ChatStreamChoice,
            CompletionChoice,
            CompletionChunk,
            DeltaMessage,
        )

        common = dict(id=self.req.id, created=self.created, model=self.state.model_name)
        if self.chat:
            delta = DeltaMessage(role="assistant", content="") if role else DeltaMessage(content=text)
            choice = ChatStreamChoice(index=index, delta=delta, finish_reason=finish_reason)
            return ChatCompletionChunk(choices=[choice], **common)
        return CompletionChunk(choices=[CompletionChoice(index=index, text=text, finish_reason=finish_reason)],
                               **common)

    def _usage_chunk(self, stats):
        from specdec.server.protocol import ChatCompletionChunk, CompletionChunk

        cls = ChatCompletionChunk if self.chat else CompletionChunk
        return cls(id=self.req.id, created=self.created, model=self.state.model_name, choices=[],
                   usage=self._usage(), spec_decode=self._spec(stats))


# -- command line ----------------------------------------------------------------------------------
def add_serve_args(p: argparse.ArgumentParser) -> None:
    from specdec.cli import add_model_args, add_spec_args, positive_int

    add_model_args(p)
    add_spec_args(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--api-key", default=os.environ.get("SPECDEC_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on every /v1 route (default: $SPECDEC_API_KEY)")
    g.add_argument("--served-model-name", default=None, help="model id reported and accepted by the API")
    g.add_argument("--max-batch-size", type=positive_int, default=8,
                   help="most sequences decoded together (one KV cache slot each)")
    g.add_argument("--max-queue", type=int, default=64,
                   help="most sequences waiting for a slot; beyond it requests get 429")
    g.add_argument("--max-request-bytes", type=positive_int, default=DEFAULT_MAX_BODY_BYTES,
                   help="largest request body (413 beyond)")
    g.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    g.add_argument("--matmul", default="auto", choices=["auto", "torch", "numpy"],
                   help="CPU matmul backend: numpy = specdec's kernels and NumPy's BLAS, or torch; "
                        "auto = timed at load, which a busy machine can mislead")
    s = p.add_argument_group("speculation under load")
    s.add_argument("--speculative-config", default=None,
                   help='vLLM-style JSON instead of --spec-type, e.g. \'{"method": "ngram", '
                        '"num_speculative_tokens": 5, "prompt_lookup_max": 4}\'')
    s.add_argument("--spec-batch-draft-tokens", type=int, default=None,
                   help="most drafted tokens per step over the whole batch: K(b) = min(K, this // b) "
                        "(default: --spec-draft-n-max, so full K at batch 1 and none beyond K sequences)")
    s.add_argument("--spec-disable-batch-size", type=int, default=None,
                   help="no drafting when more sequences than this run (vLLM's disable_by_batch_size)")


def spec_from_vllm_config(text: str) -> tuple[SpecConfig, int | None]:
    """vLLM's --speculative-config JSON -> (SpecConfig, disable_by_batch_size). Raises ValueError.

    {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4} -> ngram, K=5, n-gram size 4;
    {"method": "suffix", ...}; {"method": "draft_model", "model": "path"} (or just {"model": "path"}).
    """
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--speculative-config is not valid JSON: {exc.msg}") from None
    if not isinstance(cfg, dict):
        raise ValueError("--speculative-config must be a JSON object")
    method = cfg.get("method")
    model = cfg.get("model")
    if method is None:
        method = "ngram" if model in ("ngram", "[ngram]") else ("draft_model" if model else None)
    aliases = {"ngram": SpecType.NGRAM, "suffix": SpecType.SUFFIX, "draft_model": SpecType.DRAFT_MODEL}
    aliases.update({t.value: t for t in SpecType if t is not SpecType.NONE})
    if method not in aliases:
        raise ValueError(f"--speculative-config method {method!r} is not supported; "
                         f"choose from: {', '.join(sorted(aliases))}")
    kind = aliases[method]
    changes: dict = {"types": (kind,)}
    if "num_speculative_tokens" in cfg:
        changes["draft_n_max"] = _int_field(cfg, "num_speculative_tokens")
    if "prompt_lookup_max" in cfg:
        changes["ngram_size_n"] = _int_field(cfg, "prompt_lookup_max")
    if kind is SpecType.DRAFT_MODEL:
        if not isinstance(model, str) or not model:
            raise ValueError('--speculative-config with method "draft_model" needs "model"')
        changes["draft_model"] = model
    known = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
             "disable_by_batch_size"}
    ignored = sorted(set(cfg) - known)
    if "prompt_lookup_min" in cfg:
        ignored.append("prompt_lookup_min (the n-gram drafter falls back to 2-grams)")
    if ignored:
        print(f"specdec: warning: --speculative-config ignores: {', '.join(ignored)}", file=sys.stderr)
    changes["extra"] = {k: cfg[k] for k in ignored if k in cfg}
    disable = _int_field(cfg, "disable_by_batch_size") if "disable_by_batch_size" in cfg else None
    return SpecConfig(**changes), disable


def _int_field(cfg: dict, key: str) -> int:
    value = cfg[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"--speculative-config {key} must be a positive integer, got {value!r}")
    return value


def serve_config(args: argparse.Namespace) -> tuple[SpecConfig, DraftBudget]:
    """The speculation settings and batch draft budget from the serve flags (UsageError when bad)."""
    from specdec.cli import UsageError, spec_from_args

    disable = args.spec_disable_batch_size
    if args.speculative_config is not None:
        if args.spec_type != "none":
            raise UsageError("give either --speculative-config or --spec-type, not both")
        try:
            spec, vllm_disable = spec_from_vllm_config(args.speculative_config)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        disable = disable if disable is not None else vllm_disable
    else:
        spec = spec_from_args(args)
    step_tokens = args.spec_batch_draft_tokens
    if step_tokens is None:
        step_tokens = spec.draft_n_max
    try:
        budget = DraftBudget(spec.draft_n_max, step_tokens, disable)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return spec, budget


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from specdec.cli import UsageError
    from specdec.llm import LLM

    spec, budget = serve_config(args)
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be in 1..65535, got {args.port}")
    if args.max_queue < 0:
        raise UsageError("--max-queue must be >= 0")
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print(f"specdec: warning: serving on {args.host} without --api-key: anyone who can reach it can use it",
              file=sys.stderr)
    llm = LLM(args.model, dtype=args.dtype, spec=spec, max_model_len=args.max_model_len, device=args.device,
              max_num_seqs=args.max_batch_size, matmul=args.matmul)
    llm.warmup()
    app = create_app(llm, served_model_name=args.served_model_name, api_key=args.api_key,
                     max_queue=args.max_queue, budget=budget, max_body_bytes=args.max_request_bytes)
    print(f"specdec: serving {args.served_model_name or llm.model_name} on http://{args.host}:{args.port}/v1 "
          f"(batch {args.max_batch_size}, spec {','.join(t.value for t in spec.types)}, "
          f"matmul {llm.runner.matmul_backend})",
          file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
