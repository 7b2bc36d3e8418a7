"""OpenAI-compatible HTTP server: routes, server-sent events. ``specdec serve`` is in ``server/cli.py``.

    POST /v1/completions, POST /v1/chat/completions (``stream: true`` = SSE ending with ``data: [DONE]``)
    GET  /v1/models, GET /health, GET /metrics (Prometheus)
    POST /tokenize, POST /detokenize (vLLM's: a prompt's or a conversation's token ids, the text of ids)
    GET  / (playground), GET /dashboard, GET /metrics/live (the dashboard's data): see ``web.py``

Every token streamed or returned comes with its provenance (``spec_decode.tokens``
and ``origins``: which drafter proposed it, or the target), see ``specdec.provenance``.

Every request becomes one or more engine sequences handed to the Scheduler,
which batches them continuously on its own thread. Errors always come back as
``{"error": {"message", "type", "param", "code"}}`` (``errors.py``) with a 4xx
status for bad input, 429 when the queue is full, and 500 when the engine failed
on this request; the server itself stays up. What a response or a chunk looks
like is each endpoint's job class (``jobs.py``).

FastAPI is imported inside ``create_app`` and ``serve`` so ``specdec generate``
does not pay for it (about half a second). (No ``from __future__ import annotations``
here: FastAPI reads the route annotations, which name classes imported inside
``create_app``.)
"""

import asyncio
import uuid
from contextlib import asynccontextmanager

from specdec.budget import DraftBudget
from specdec.config import SamplingParams, SpecType, parse_spec_types
from specdec.grammar import GrammarError
from specdec.llm import LLM
from specdec.log import get_logger
from specdec.server import limits
from specdec.server.edge import DEFAULT_MAX_BODY_BYTES, EdgePolicy, GuardMiddleware
from specdec.server.errors import APIError, add_error_handlers, error_body
from specdec.server.jobs import ChatJob, CompletionJob, Job, ServerState
from specdec.server.metrics import ServerMetrics
from specdec.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    SamplingRequest,
    TokenizeRequest,
    TokenizeResponse,
)
from specdec.server.scheduler import QueueFullError, Scheduler, SchedulerDownError
from specdec.server.web import add_web_routes
from specdec.text import as_prompt_list

logger = get_logger(__name__)

def create_app(
    llm: LLM,
    *,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_queue: int = 64,
    budget: DraftBudget | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    edge: EdgePolicy | None = None,
    prefill_seconds: float | None = None,
):
    """A FastAPI app serving ``llm`` (a specdec.llm.LLM; its ``max_num_seqs`` is the batch limit).

    ``edge``: the hosts and origins it answers and whether /metrics and /health need the key
    (``edge.py``; default: a server bound to 127.0.0.1, as ``specdec serve``). ``prefill_seconds``: ``Scheduler``'s.

    The scheduler thread starts and stops with the app's lifespan; at its end ``llm.close()`` saves
    what drafters learned (--spec-ngram-cache-file).
    """
    from fastapi import FastAPI  # lazy, as Starlette: only `specdec serve` needs them (module docstring)

    name = served_model_name or llm.model_name
    metrics = ServerMetrics(name)
    num_seqs = llm.runner.num_slots
    scheduler = Scheduler(
        llm.engine, num_seqs, budget or DraftBudget(llm.spec.draft_n_max),
        max_queue=max_queue, metrics=metrics, prefill_seconds=prefill_seconds,
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
    add_error_handlers(app, logger)
    add_api_routes(app, state)
    add_web_routes(app, state, api_key_required=bool(api_key))
    return app


def add_api_routes(app, state: ServerState) -> None:
    """/health, /metrics, /v1/models, /v1/completions, /v1/chat/completions, /tokenize, /detokenize; a body
    that fails validation is a 400 with the first offending field."""
    from fastapi import Request as HTTPRequest
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response

    llm, scheduler = state.llm, state.scheduler

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_req, exc: RequestValidationError):
        message, param = describe_validation_errors(exc.errors())
        return JSONResponse(error_body(message, "invalid_request_error", "invalid_value", param), status_code=400)

    @app.get("/health")
    async def health():
        if scheduler.down is not None:  # the engine thread is gone: a load balancer must stop sending here
            return JSONResponse(error_body(scheduler.down, "server_error", 503), status_code=503)
        return {"status": "ok", "model": state.model_name, **scheduler.snapshot()}

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(state.metrics.render(), media_type=state.metrics.content_type)

    @app.get("/v1/models")
    async def models():
        return ModelList(data=[ModelCard(id=state.model_name, max_model_len=state.max_model_len)]).model_dump()

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: HTTPRequest):
        check_model(state, body.model)
        prompts = await asyncio.to_thread(encode_prompts, llm, body.prompt)
        return await serve(state, request, body, prompts, CompletionJob)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        check_model(state, body.model)
        answer = await asyncio.to_thread(tokenize_request, state, body)  # a long text takes a while
        return answer.model_dump(exclude_none=True)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        check_model(state, body.model)
        text = await asyncio.to_thread(token_text, llm, body.tokens)
        return DetokenizeResponse(prompt=text).model_dump()

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: HTTPRequest):
        check_model(state, body.model)
        messages = [m.as_template_dict() for m in body.messages]
        ids = await asyncio.to_thread(encode_chat, llm, messages, body.template_tools)
        return await serve(state, request, body, [ids], ChatJob)


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


def encode_prompts(llm, prompt, add_special_tokens: bool = True) -> list[list[int]]:
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
                ids = llm.encode(p, add_special_tokens)
            except Exception as exc:  # noqa: BLE001 - e.g. text the tokenizer cannot encode
                raise APIError(400, f"cannot tokenize the prompt: {exc}", param="prompt") from None
        else:
            ids = list(p)
            check_token_ids(llm, ids, "prompt")
        if not ids:
            raise APIError(400, "the prompt is empty", code="empty_prompt", param="prompt")
        out.append(ids)
    return out


def check_token_ids(llm, ids: list[int], param: str) -> None:
    vocab = llm.runner.vocab_size
    if any(not 0 <= t < vocab for t in ids):
        raise APIError(400, f"token ids must be in [0, {vocab})", param=param)


def encode_chat(llm, messages: list[dict], tools: list[dict] | None = None,
                add_generation_prompt: bool = True) -> list[int]:
    try:
        ids = llm.chat_prompt(messages, add_generation_prompt, tools=tools)
    except Exception as exc:  # noqa: BLE001 - template errors (role order, ...) are the caller's input
        raise APIError(400, f"cannot apply the chat template: {exc}", param="messages") from None
    if not ids:
        raise APIError(400, "the chat prompt is empty", code="empty_prompt", param="messages")
    return ids


def tokenize_request(state: ServerState, body: TokenizeRequest) -> TokenizeResponse:
    """/tokenize: the ids a completion (``prompt``) or chat (``messages``) request with this input runs."""
    llm = state.llm
    if body.messages is not None:
        ids = encode_chat(llm, [m.as_template_dict() for m in body.messages], None, body.add_generation_prompt)
    else:
        ids = encode_prompts(llm, body.prompt, body.add_special_tokens)[0]
    strs = llm.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=state.max_model_len, tokens=ids, token_strs=strs)


def token_text(llm, ids: list[int]) -> str:
    """/detokenize: the text of ``ids``, special tokens included."""
    check_token_ids(llm, ids, "tokens")
    return llm.tokenizer.decode(ids)


def sampling_params(state: ServerState, body: SamplingRequest, prompt_len: int, job: type[Job]) -> SamplingParams:
    """The request's sampling settings for one prompt; 400 when they cannot fit the context."""
    room = state.max_model_len - prompt_len
    if room < 1:
        raise APIError(400, f"the prompt has {prompt_len} tokens but the context holds {state.max_model_len}; "
                       "shorten it", code="context_length_exceeded", param=job.prompt_param)
    asked = body.requested_max_tokens
    if asked is None:
        max_tokens = body.default_max_tokens(room)
    elif prompt_len + asked > state.max_model_len:
        raise APIError(400, f"this model's maximum context length is {state.max_model_len} tokens; you asked for "
                       f"{prompt_len + asked} ({prompt_len} in the prompt, {asked} for the completion)",
                       code="context_length_exceeded", param="max_tokens")
    else:
        max_tokens = asked
    vocab = state.llm.runner.vocab_size
    if any(not 0 <= t < vocab for t in body.logit_bias_ids):
        raise APIError(400, f"logit_bias token ids must be in [0, {vocab})", param="logit_bias")
    try:
        return job.sampling_params(body, max_tokens)
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


def new_sequence(state: ServerState, ids: list[int], params: SamplingParams, job: type[Job],
                 spec_types: tuple[SpecType, ...] | None = None):
    """An engine sequence; a schema, regex or grammar that does not compile is the caller's 400."""
    try:
        return state.llm.new_sequence(ids, params, spec_types)
    except GrammarError as exc:
        raise APIError(400, str(exc), code="invalid_grammar", param=job.grammar_param) from None
    except ValueError as exc:
        raise APIError(400, str(exc)) from None


def new_sequences(state: ServerState, body: SamplingRequest, prompts: list[list[int]], job: type[Job]) -> list:
    """The request's engine sequences, n per prompt (400s on what cannot be served). Runs off the
    event loop: bad-word tokenizing and grammar compiling take time that grows with the request."""
    num_seqs = len(prompts) * body.n
    if num_seqs > state.max_num_seqs:
        raise APIError(400, f"this request needs {num_seqs} sequences (prompts x n) but the server runs at most "
                       f"{state.max_num_seqs} at once (--max-batch-size)", param="n")
    spec_types = drafter_types(state, body.spec_decode_drafter)
    seqs, entries = [], 0
    for ids in prompts:
        params = sampling_params(state, body, len(ids), job)
        entries += body.n * logprob_entries(params, len(ids))
        if entries > limits.MAX_LOGPROB_ENTRIES:
            raise APIError(400, f"this request asks for up to {entries} logprob entries (tokens x (logprobs + 1) x "
                           f"n), more than the {limits.MAX_LOGPROB_ENTRIES} a response may hold; ask for fewer "
                           "tokens, choices or top logprobs", param="logprobs")
        for j in range(body.n):
            seqs.append(new_sequence(state, ids, params.for_choice(j), job, spec_types))
    return seqs


def logprob_entries(params: SamplingParams, prompt_len: int) -> int:
    """The most logprob values one sequence can return: per scored token, its own and the top k."""
    entries = 0
    if params.prompt_logprobs is not None:
        entries += prompt_len * (params.prompt_logprobs + 1)
    if params.logprobs is not None:
        entries += params.max_new_tokens * (params.logprobs + 1)
    return entries


async def serve(state: ServerState, request, body: SamplingRequest, prompts: list[list[int]], job: type[Job]):
    """Submit the request's sequences and answer with ``job``'s endpoint shapes."""
    from fastapi.responses import JSONResponse, StreamingResponse  # lazy: see the module docstring

    seqs = await asyncio.to_thread(new_sequences, state, body, prompts, job)
    request_id = f"{job.id_prefix}-{uuid.uuid4().hex}"
    try:
        req = state.scheduler.submit(request_id, seqs, asyncio.get_running_loop())
    except QueueFullError as exc:
        raise APIError(429, str(exc), "rate_limit_error", "rate_limit_exceeded") from None
    except SchedulerDownError as exc:
        raise APIError(503, str(exc), "server_error", 503) from None
    answer = job(state, req, body, prompts)
    if body.stream:
        return StreamingResponse(answer.stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return JSONResponse(await answer.collect(request))
