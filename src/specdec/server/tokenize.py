"""POST /tokenize and POST /detokenize (vLLM's endpoints; llama-server has the same pair): what the served
model's tokenizer makes of a prompt or a conversation, and the text of token ids, without generating.

A client counts a prompt's tokens against ``max_model_len`` before it sends it, or checks how the chat
template renders a conversation. Bad input is a 400 as on the completion routes (``app.py`` adds the routes).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from specdec.server.errors import APIError
from specdec.server.protocol import ChatMessage
from specdec.text import encode_chat, encode_prompt


class TokenizeRequest(BaseModel):
    """A prompt (text) or chat messages (rendered by the chat template), exactly one of them."""

    model_config = ConfigDict(extra="ignore")

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


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    tokens: list[int] = Field(min_length=1)


class DetokenizeResponse(BaseModel):
    prompt: str


def tokenize(tokenizer, body: TokenizeRequest, max_model_len: int) -> TokenizeResponse:
    """The request's token ids (run off the event loop: a long text takes a while)."""
    try:
        if body.messages is not None:
            messages = [m.as_template_dict() for m in body.messages]
            ids = encode_chat(tokenizer, messages, body.add_generation_prompt)
        else:
            ids = encode_prompt(tokenizer, body.prompt, body.add_special_tokens)
    except Exception as exc:  # noqa: BLE001 - empty text, template errors (role order, ...): the caller's input
        param = "messages" if body.messages is not None else "prompt"
        raise APIError(400, f"cannot tokenize the {param}: {exc}", param=param) from None
    strs = tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=max_model_len, tokens=ids, token_strs=strs)


def detokenize(tokenizer, body: DetokenizeRequest, vocab_size: int) -> DetokenizeResponse:
    """The text of the ids, special tokens included (the inverse of /tokenize)."""
    if any(not 0 <= t < vocab_size for t in body.tokens):
        raise APIError(400, f"token ids must be in [0, {vocab_size})", param="tokens")
    return DetokenizeResponse(prompt=tokenizer.decode(body.tokens))
