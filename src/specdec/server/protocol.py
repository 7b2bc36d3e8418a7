"""OpenAI request and response schemas (the subset the server implements).

Requests ignore unknown fields, as OpenAI clients send extras; fields we cannot
honour (``suffix``, ``best_of != n``, non-text content) are refused with a 400 that
says so rather than silently ignored. A ValueError raised by a validator becomes a
400 with an OpenAI error body (see ``app.py``; the body itself is built in ``errors.py``).
Each request model turns itself into the engine's ``SamplingParams`` (``to_sampling_params``).
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, model_serializer, model_validator

from specdec.config import MAX_LOGPROBS, SamplingParams, StructuredKind, StructuredOutput
from specdec.server import limits

INT64_MIN, UINT64_MAX = -(2**63), 2**64 - 1
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions


# -- requests --------------------------------------------------------------------------------------
class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Request):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM extension: usage so far on every chunk


class SpecDecodeOptions(_Request):
    """specdec's own request fields: how much speculation to show, and which drafter to use."""

    spec_decode_detail: bool = False  # each step's rejected drafted tokens in spec_decode.steps
    # Draft with these of the server's loaded methods only: "ngram", "suffix,ngram", "none" (None = all).
    spec_decode_drafter: str | None = Field(None, max_length=200)


class SamplingRequest(SpecDecodeOptions):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1, le=UINT64_MAX)
    max_completion_tokens: int | None = Field(None, ge=1, le=UINT64_MAX)
    temperature: FiniteFloat = Field(1.0, ge=0.0, le=2.0)
    top_p: FiniteFloat = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, le=2**31)  # 0 or -1 (vLLM) = off
    min_p: FiniteFloat = Field(0.0, ge=0.0, lt=1.0)
    seed: int | None = Field(None, ge=INT64_MIN, le=UINT64_MAX)
    stop: str | list[str] | None = Field(None)
    n: int = Field(1, ge=1, le=1024)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # vLLM extension: generate exactly max_tokens tokens
    presence_penalty: FiniteFloat = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: FiniteFloat = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: FiniteFloat = Field(1.0, gt=0.0, le=10.0)  # vLLM extension
    logit_bias: dict[str, FiniteFloat] | None = None  # token id (as a string) -> bias in [-100, 100]
    min_tokens: int = Field(0, ge=0, le=UINT64_MAX)  # vLLM extension
    bad_words: list[str] | None = None  # vLLM extension
    user: str | None = None
    # Structured output: OpenAI's response_format, vLLM's structured_outputs and its older guided_* fields.
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @model_validator(mode="after")
    def _check_sampling(self) -> SamplingRequest:
        if len(self.logit_bias or {}) > limits.MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias holds at most {limits.MAX_LOGIT_BIAS} entries")
        for key, bias in (self.logit_bias or {}).items():
            key = key.strip()
            # "²".isdigit(), but int("²") fails; a 4301-digit key fails int() itself
            if not (key.isascii() and key.isdigit() and len(key) <= limits.MAX_TOKEN_ID_DIGITS):
                raise ValueError(f"logit_bias keys must be token ids, got {key[:20]!r}")
            if not -100 <= bias <= 100:
                raise ValueError("logit_bias values must be in [-100, 100]")
        if self.bad_words is not None and any(not w for w in self.bad_words):
            raise ValueError("bad_words holds an empty string")
        limits.check_texts("bad_words", self.bad_words or (), limits.MAX_BAD_WORDS, limits.MAX_BAD_WORDS_CHARS)
        limits.check_texts("stop", self.stops, limits.MAX_STOPS, limits.MAX_STOPS * limits.MAX_STOP_CHARS)
        if any(len(s) > limits.MAX_STOP_CHARS for s in self.stops):
            raise ValueError(f"a stop string has at most {limits.MAX_STOP_CHARS} characters")
        self.structured  # noqa: B018 - raises on a bad, ambiguous or oversized structured-output request
        if self.max_tokens is not None and self.max_completion_tokens is not None \
                and self.max_tokens != self.max_completion_tokens:
            raise ValueError("max_tokens and max_completion_tokens disagree; give one")
        return self

    @property
    def structured(self) -> StructuredOutput | None:
        """The one structured-output constraint the request asks for (ValueError if several or malformed)."""
        found = [c for c in (_from_response_format(self.response_format),
                             _from_structured_outputs(self.structured_outputs), self._from_guided()) if c]
        if len(found) > 1:
            raise ValueError("give one of response_format, structured_outputs and guided_*")
        if found and len(found[0].spec or "") > limits.MAX_GRAMMAR_CHARS:
            raise ValueError(f"a structured-output constraint has at most {limits.MAX_GRAMMAR_CHARS} characters")
        return found[0] if found else None

    def _from_guided(self) -> StructuredOutput | None:
        given = {k: v for k, v in (("json", self.guided_json), ("regex", self.guided_regex),
                                   ("choice", self.guided_choice), ("grammar", self.guided_grammar)) if v is not None}
        return _from_structured_outputs(given) if given else None

    @property
    def logit_bias_ids(self) -> dict[int, float]:
        return {int(k): v for k, v in (self.logit_bias or {}).items()}

    @property
    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def default_max_tokens(self, room: int) -> int:
        """max_tokens when the request gives none, with ``room`` tokens left in the context."""
        return room

    def to_sampling_params(self, max_new_tokens: int) -> SamplingParams:
        """The engine's settings for one prompt of this request (ValueError when they are invalid).

        ``max_new_tokens`` is decided by the server, which knows the context length; a forced
        tool call's schema is added by the server too (``tools.forced_call``).
        """
        return SamplingParams(
            max_new_tokens=max_new_tokens, temperature=self.temperature, top_k=max(self.top_k, 0),
            top_p=self.top_p, min_p=self.min_p, seed=None if self.seed is None else self.seed % 2**63,
            stop=self.stops, ignore_eos=self.ignore_eos, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty, repetition_penalty=self.repetition_penalty,
            logit_bias=self.logit_bias_ids, min_tokens=self.min_tokens, bad_words=tuple(self.bad_words or ()),
            structured=self.structured, **self._logprob_settings(max_new_tokens),
        )

    def _logprob_settings(self, max_new_tokens: int) -> dict[str, int | None]:
        """SamplingParams' ``logprobs`` and ``prompt_logprobs``: each endpoint asks for them its own way."""
        raise NotImplementedError


def _from_response_format(fmt: dict[str, Any] | None) -> StructuredOutput | None:
    """OpenAI's response_format: text, json_object, or json_schema {"json_schema": {"schema": ...}}."""
    if not fmt:
        return None
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput(StructuredKind.JSON_OBJECT)
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ValueError("response_format json_schema needs json_schema.schema, a JSON object")
        return StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(schema))
    raise ValueError(f"response_format type {kind!r} is not supported (text, json_object, json_schema)")


def _from_structured_outputs(spec: dict[str, Any] | None) -> StructuredOutput | None:
    """vLLM's structured_outputs: exactly one of json, regex, choice, grammar, json_object."""
    if not spec:
        return None
    keys = [k for k in ("json", "regex", "choice", "grammar", "json_object") if spec.get(k) not in (None, False)]
    if len(keys) != 1:
        raise ValueError("structured_outputs needs exactly one of json, regex, choice, grammar, json_object")
    value = spec[keys[0]]
    if keys[0] == "json_object":
        return StructuredOutput(StructuredKind.JSON_OBJECT)
    if keys[0] == "json":
        if isinstance(value, str):
            try:
                value = limits.loads(value)
            except ValueError as exc:
                raise ValueError(f"the JSON schema is unusable: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError("a JSON schema must be a JSON object")
        return StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(value))
    if keys[0] == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise ValueError("choice must be a non-empty list of non-empty strings")
        limits.check_texts("choice", value, limits.MAX_CHOICES, limits.MAX_GRAMMAR_CHARS)
        return StructuredOutput(StructuredKind.CHOICE, json.dumps(value))
    if not isinstance(value, str) or not value:
        raise ValueError(f"{keys[0]} must be a non-empty string")
    return StructuredOutput(StructuredKind.REGEX if keys[0] == "regex" else StructuredKind.GRAMMAR, value)


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    # 0 with echo: the prompt alone, with its logprobs (how evaluation harnesses score text)
    max_tokens: int | None = Field(None, ge=0, le=UINT64_MAX)
    max_completion_tokens: int | None = Field(None, ge=0, le=UINT64_MAX)
    echo: bool = False  # the prompt before the completion (with its logprobs when logprobs is set)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = None
    suffix: str | None = None

    @model_validator(mode="after")
    def _check_completion(self) -> CompletionRequest:
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of is not supported (only best_of == n)")
        if self.requested_max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens 0 needs echo: true (it returns the prompt and, with logprobs, its logprobs)")
        return self

    def default_max_tokens(self, room: int) -> int:
        return min(DEFAULT_COMPLETION_TOKENS, room)

    def _logprob_settings(self, max_new_tokens: int) -> dict[str, int | None]:
        prompt_logprobs = self.logprobs if self.echo else None
        if max_new_tokens == 0 and prompt_logprobs is None:  # echo alone: the engine scores, nobody reads it
            prompt_logprobs = 0  # (in bounded chunks: engine.PROMPT_LOGPROB_ROWS)
        return dict(logprobs=self.logprobs, prompt_logprobs=prompt_logprobs)


class ContentPart(_Request):
    type: str
    text: str | None = None

    @model_validator(mode="after")
    def _text_only(self) -> ContentPart:
        if self.type != "text" or self.text is None:
            raise ValueError(f"content parts of type {self.type!r} are not supported (text only)")
        return self


class FunctionCall(_Request):
    name: str
    arguments: str = "{}"  # JSON text, as OpenAI sends it


class ToolCall(_Request):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message answers this call

    def as_template_dict(self) -> dict:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text or "" for part in content)
        out: dict[str, Any] = {"role": self.role, "content": content or ""}
        if self.tool_calls:  # arguments as objects: what chat templates expect
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": _json_or_text(c.function.arguments)}} for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


def _json_or_text(text: str) -> Any:
    try:
        return limits.loads(text)
    except ValueError:  # also too deep or a too long number: the template gets the text
        return text


class FunctionDef(_Request):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; None = no arguments


class Tool(_Request):
    type: Literal["function"]
    function: FunctionDef


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage]
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_chat(self) -> ChatCompletionRequest:
        if not self.messages:
            raise ValueError("messages is empty")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        names = [t.function.name for t in self.tools or []]
        if len(names) > limits.MAX_TOOLS:
            raise ValueError(f"tools holds at most {limits.MAX_TOOLS} functions")
        if len(set(names)) != len(names):
            raise ValueError("tools have duplicate function names")
        if isinstance(self.tool_choice, dict):
            function = self.tool_choice.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            if self.tool_choice.get("type") != "function" or not isinstance(name, str) or name not in names:
                raise ValueError("tool_choice must name a function given in tools")
        elif self.tool_choice == "required" and not names:
            raise ValueError('tool_choice "required" needs tools')
        if self.forced_tools and self.structured is not None:
            raise ValueError("a forced tool call and response_format/structured outputs cannot be combined")
        return self

    @property
    def forced_tools(self) -> list[Tool]:
        """The tools the reply must call one of: all for "required", the named one, none otherwise."""
        if not self.tools or self.tool_choice in (None, "none", "auto"):
            return []
        if self.tool_choice == "required":
            return list(self.tools)
        name = self.tool_choice["function"]["name"]
        return [t for t in self.tools if t.function.name == name]

    def _logprob_settings(self, max_new_tokens: int) -> dict[str, int | None]:
        return dict(logprobs=(self.top_logprobs or 0) if self.logprobs else None, prompt_logprobs=None)

    @property
    def template_tools(self) -> list[dict] | None:
        """Tools for the chat template (none with tool_choice "none")."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]


class TokenizeRequest(_Request):
    """POST /tokenize (vLLM's): a prompt (text) or chat messages (rendered by the chat template), exactly one."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True  # a prompt's BOS and the like (the chat template writes its own)
    add_generation_prompt: bool = True  # messages: end with the assistant's turn opening, as a chat request
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        return self


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[int] = Field(min_length=1)


# -- responses -------------------------------------------------------------------------------------
class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens whose K/V an earlier request left in the cache (not prefilled again)


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class StepDetail(BaseModel):
    """One engine step that drafted, for one choice (sent with ``spec_decode_detail``)."""

    start: int  # index of the step's first committed token in the choice's output
    drafter: str | None
    drafted: int
    accepted: int  # the first ``accepted`` drafted tokens were kept; token start + accepted is the target's
    rejected_ids: list[int]  # drafted tokens after the accepted ones, which the target turned down
    rejected: list[str]  # the same, each decoded alone


class TokenProvenance(BaseModel):
    """Tokens of one choice, aligned: the text each shows and who produced it."""

    index: int
    tokens: list[str]  # concatenated: the choice's text
    origins: list[str]  # a drafter's name (its draft was accepted) or "target" (recovered or bonus token)
    steps: list[StepDetail] | None = None


class _SetFieldsOnly(BaseModel):
    """Serialized without the fields that are None (OpenAI omits them; clients that concatenate
    streamed fields choke on nulls)."""

    @model_serializer(mode="wrap")
    def _only_set(self, handler) -> dict:
        return {k: v for k, v in handler(self).items() if v is not None}


class SpecDecodeInfo(_SetFieldsOnly):
    """specdec's extras on a response or chunk; only the fields set are sent.

    The request's speculation stats (all its choices): on a response, a stream's
    last chunk and its usage chunk. Token provenance: ``tokens``/``origins``/``steps``
    on each streamed chunk (its choice's new tokens), ``choices`` on a response.
    """

    drafts: int | None = None  # steps that verified a non-empty draft
    drafted: int | None = None  # drafted tokens sent to the target
    accepted: int | None = None  # drafted tokens kept
    acceptance_rate: float | None = None  # accepted / drafted
    mean_accepted_len: float | None = None  # tokens committed per decoding target pass
    # Monitoring (specdec.monitor): the latest sliding window of the request's sequences (alpha:
    # per-token acceptance, accepted / tested, tau: tokens per drafting pass, speedup over plain as measured), each
    # drafter's (drafted and accepted tokens in all, and its window), and how often speculation
    # was paused (off_steps: decode steps without drafting; switch_offs) and re-probed.
    window: dict | None = None
    drafters: dict[str, dict] | None = None
    off_steps: int | None = None
    switch_offs: int | None = None
    probes: int | None = None
    tokens: list[str] | None = None
    origins: list[str] | None = None
    steps: list[StepDetail] | None = None
    choices: list[TokenProvenance] | None = None


class CompletionLogprobs(BaseModel):
    """The legacy completions shape: parallel lists, one entry per token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None
    refusal: list[ChatTokenLogprob] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    spec_decode: SpecDecodeInfo | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo | None = None
    spec_decode: SpecDecodeInfo | None = None


class DeltaFunctionCall(_SetFieldsOnly):
    name: str | None = None  # on a call's first chunk
    arguments: str | None = None  # the next fragment of the arguments' JSON text


class DeltaToolCall(_SetFieldsOnly):
    """A streamed piece of tool call ``index``: id, type and name first, then argument fragments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None
    spec_decode: SpecDecodeInfo | None = None


class CompletionChunk(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    spec_decode: SpecDecodeInfo | None = None


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str  # special tokens included: the inverse of /tokenize


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "specdec"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def dump_chunk(chunk: BaseModel) -> str:
    """One server-sent event; ``usage`` and ``spec_decode`` appear only when set."""
    data = chunk.model_dump(exclude={k for k in ("usage", "spec_decode") if getattr(chunk, k, None) is None})
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
