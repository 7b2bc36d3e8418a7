"""OpenAI request and response schemas (the subset the server implements).

Requests ignore unknown fields, as OpenAI clients send extras; fields we cannot
honour (logprobs, penalties, tools, ...) are refused with a 400 that says so
rather than silently ignored. A ValueError raised by a validator becomes a 400
with an OpenAI error body (see ``app.py``).
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, model_serializer, model_validator

INT64_MIN, UINT64_MAX = -(2**63), 2**64 - 1


# -- errors ----------------------------------------------------------------------------------------
class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


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
    presence_penalty: FiniteFloat = 0.0
    frequency_penalty: FiniteFloat = 0.0
    repetition_penalty: FiniteFloat = 1.0
    logit_bias: dict[str, Any] | None = None
    user: str | None = None

    @model_validator(mode="after")
    def _check_unsupported(self) -> SamplingRequest:
        if self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0:
            raise ValueError("presence, frequency and repetition penalties are not supported")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported")
        if isinstance(self.stop, list) and len(self.stop) > 16:
            raise ValueError("stop holds at most 16 strings")
        if self.max_tokens is not None and self.max_completion_tokens is not None \
                and self.max_tokens != self.max_completion_tokens:
            raise ValueError("max_tokens and max_completion_tokens disagree; give one")
        return self

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


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @model_validator(mode="after")
    def _check_completion(self) -> CompletionRequest:
        if self.logprobs is not None:
            raise ValueError("logprobs is not supported")
        if self.echo:
            raise ValueError("echo is not supported")
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of is not supported (only best_of == n)")
        return self


class ContentPart(_Request):
    type: str
    text: str | None = None

    @model_validator(mode="after")
    def _text_only(self) -> ContentPart:
        if self.type != "text" or self.text is None:
            raise ValueError(f"content parts of type {self.type!r} are not supported (text only)")
        return self


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def as_template_dict(self) -> dict:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text or "" for part in content)
        return {"role": self.role, "content": content or ""}


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage]
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_chat(self) -> ChatCompletionRequest:
        if not self.messages:
            raise ValueError("messages is empty")
        if self.logprobs or self.top_logprobs:
            raise ValueError("logprobs is not supported")
        if self.tools:
            raise ValueError("tools are not supported")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise ValueError("response_format other than text is not supported")
        return self


# -- responses -------------------------------------------------------------------------------------
class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


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


class SpecDecodeInfo(BaseModel):
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
    tokens: list[str] | None = None
    origins: list[str] | None = None
    steps: list[StepDetail] | None = None
    choices: list[TokenProvenance] | None = None

    @model_serializer(mode="wrap")
    def _only_set(self, handler) -> dict:
        return {k: v for k, v in handler(self).items() if v is not None}


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: str | None = None


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
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo | None = None
    spec_decode: SpecDecodeInfo | None = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: None = None
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
