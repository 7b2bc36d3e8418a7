"""Tool calls: a forced call is structured output under a JSON schema; any reply is parsed for a call.

With ``tool_choice`` "required" or a named function the reply *must* be a call,
so the engine generates it under a grammar (``grammar.py``, the same lossless
masks as response_format): the JSON object ``{"name": ..., "arguments": {...}}``
whose arguments follow that function's parameter schema. With "auto" the model
decides: its reply is parsed afterwards, and becomes a call when it is that
object, alone or wrapped in ``<tool_call>`` tags (the Hermes/Qwen format).
``ToolReply`` says what of a reply to stream as it is generated.
"""

from __future__ import annotations

import json
import re
import uuid

from specdec.config import StructuredKind, StructuredOutput
from specdec.server import limits
from specdec.server.protocol import DeltaFunctionCall, DeltaMessage, DeltaToolCall, FunctionCall, Tool, ToolCall

_WRAPPED = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
# A forced call's text up to its arguments, once they start (the schema puts "name" first; llguidance keeps it)
_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\S)')
_CALL_STARTS = ("{", "[", "<tool_call>")  # what a reply that parse_tool_calls accepts starts with


def call_schema(tools: list[Tool]) -> dict:
    """The JSON schema of one call to any of ``tools``."""
    no_arguments = {"type": "object", "properties": {}, "additionalProperties": False}
    variants = [{
        "type": "object",
        "properties": {"name": {"const": t.function.name}, "arguments": t.function.parameters or no_arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    } for t in tools]
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def forced_call(tools: list[Tool]) -> StructuredOutput:
    return StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(call_schema(tools)))


def parse_tool_calls(text: str, tools: list[Tool]) -> list[ToolCall]:
    """The calls ``text`` makes to ``tools``; [] when it is not (only) tool calls."""
    names = {t.function.name for t in tools}
    wrapped = _WRAPPED.findall(text)
    bodies = wrapped if wrapped and not _WRAPPED.sub("", text).strip() else [text.strip()]
    calls = []
    for body in bodies:
        try:
            obj = limits.loads(body)
        except ValueError:  # not JSON, or too deep / too long a number: not a call
            return []
        for item in obj if isinstance(obj, list) else [obj]:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or item["name"] not in names:
                return []
            args = item.get("arguments", item.get("parameters", {}))
            if not isinstance(args, dict):
                return []
            function = FunctionCall(name=item["name"], arguments=json.dumps(args))
            calls.append(ToolCall(id=new_call_id(), function=function))
    return calls


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolReply:
    """One chat choice's reply when the request has tools: what to stream of it as it grows, and what it was.

    Forced (``tool_choice`` "required" or a named function): the reply is generated under the call
    schema, name first, so it is a call from its first token. Its id, type and name go out as soon
    as the name is complete, then the arguments' JSON text in fragments as it is generated (OpenAI's
    streaming shape); the finish reason is "tool_calls" once the call is complete. Streamed or not,
    ``arguments`` is the text the model generated.

    Auto: a reply is a call only when all of it is one (``parse_tool_calls``), which it can be only
    if it starts, after whitespace, with "{", "[" or "<tool_call>". The text is held back while its
    start allows that and streams as content from the moment it rules it out; a reply that may still
    be a call is answered whole at its end, because whether it is one depends on its last characters
    (a closing tag, text after the object), so no prefix of it can be streamed as a call soundly.

    Example (forced): pieces '{"name": "get_', 'weather", "arguments": {"ci', 'ty": "Oslo"}}' stream as
    nothing; (id, "function", name "get_weather", arguments '{"ci'); (arguments 'ty": "Oslo"}').
    """

    def __init__(self, tools: list[Tool], forced: bool) -> None:
        self.tools, self.forced = tools, forced
        self.text = ""
        self.content_mode = False  # auto: the start ruled a call out, so the text streams as content
        self.call_id = new_call_id()
        self.name: str | None = None  # forced: the called function, once its name is complete
        self.arguments: _ValueScanner | None = None  # forced: where the arguments' text starts and ends
        self.num_sent = 0  # forced: characters of the arguments streamed
        self.calls: list[ToolCall] = []  # at the end: the calls the reply makes ([] = it is content)
        self.complete = False  # at the end: the calls are whole (not cut by max_tokens)

    def push(self, delta: str, final: bool) -> DeltaMessage | None:
        """The reply's next text (``final``: its last) -> what to stream now; None for nothing yet."""
        self.text += delta
        if self.forced:
            return self._push_forced(final)
        if self.content_mode:
            return DeltaMessage(content=delta) if delta else None
        head = self.text.lstrip()
        if not final and any(head.startswith(s) or s.startswith(head) for s in _CALL_STARTS):
            return None
        if not final or not self._parse_whole():
            self.content_mode = True
            return DeltaMessage(content=self.text) if self.text else None
        return self._whole_calls()

    def finish_reason(self, engine_reason: str | None) -> str | None:
        return "tool_calls" if self.calls and self.complete else engine_reason

    def _push_forced(self, final: bool) -> DeltaMessage | None:
        head = self.name is None and _CALL_HEAD.match(self.text)
        if head:
            self.name = json.loads(head.group(1))
            self.arguments = _ValueScanner(head.end())
        if self.name is None or self.arguments is None:
            if not final:
                return None
            if self._parse_whole():  # not in the expected order: whole at the end
                return self._whole_calls()
            return DeltaMessage(content=self.text) if self.text else None
        args = self.arguments.scan(self.text)
        fragment, self.num_sent = args[self.num_sent :], len(args)
        if final:
            self.calls = [ToolCall(id=self.call_id, function=FunctionCall(name=self.name, arguments=args))]
            self.complete = self.arguments.end is not None and _is_json(self.text)
        if not head and not fragment:
            return None
        function = DeltaFunctionCall(name=self.name if head else None, arguments=fragment)
        call = DeltaToolCall(index=0, id=self.call_id if head else None, type="function" if head else None,
                             function=function)
        return DeltaMessage(tool_calls=[call])

    def _parse_whole(self) -> bool:
        self.calls = parse_tool_calls(self.text, self.tools)
        self.complete = bool(self.calls)
        return self.complete

    def _whole_calls(self) -> DeltaMessage:
        return DeltaMessage(tool_calls=[
            DeltaToolCall(index=i, id=c.id, type="function",
                          function=DeltaFunctionCall(name=c.function.name, arguments=c.function.arguments))
            for i, c in enumerate(self.calls)])


class _ValueScanner:
    """Where a JSON value that starts at ``start`` of a growing text ends: brackets counted outside strings.

    The value ends after the bracket that closes its first one, or, for a scalar, before the
    bracket that closes the object around it.
    """

    def __init__(self, start: int) -> None:
        self.start = self.pos = start
        self.depth = 0
        self.in_string = self.escaped = False
        self.end: int | None = None

    def scan(self, text: str) -> str:
        """The value's text so far (all of it once ``end`` is set)."""
        while self.end is None and self.pos < len(text):
            c = text[self.pos]
            if self.in_string:
                self.escaped, self.in_string = (False, True) if self.escaped else (c == "\\", c != '"')
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                if self.depth == 0:
                    self.end = self.pos
                    break
                self.depth -= 1
                if self.depth == 0:
                    self.end = self.pos + 1
            self.pos += 1
        return text[self.start : self.end]


def _is_json(text: str) -> bool:
    try:
        limits.loads(text)
    except ValueError:
        return False
    return True
