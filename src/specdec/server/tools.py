"""Tool calls: a forced call is structured output under a JSON schema; any reply is parsed for a call.

With ``tool_choice`` "required" or a named function the reply *must* be a call,
so the engine generates it under a grammar (``grammar.py``, the same lossless
masks as response_format): the JSON object ``{"name": ..., "arguments": {...}}``
whose arguments follow that function's parameter schema. With "auto" the model
decides: its reply is parsed afterwards, and becomes a call when it is that
object, alone or wrapped in ``<tool_call>`` tags (the Hermes/Qwen format).
"""

from __future__ import annotations

import json
import re
import uuid

from specdec.config import StructuredKind, StructuredOutput
from specdec.server.protocol import FunctionCall, Tool, ToolCall

_WRAPPED = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


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
            obj = json.loads(body)
        except json.JSONDecodeError:
            return []
        for item in obj if isinstance(obj, list) else [obj]:
            if not isinstance(item, dict) or item.get("name") not in names:
                return []
            args = item.get("arguments", item.get("parameters", {}))
            if not isinstance(args, dict):
                return []
            calls.append(ToolCall(id=f"call_{uuid.uuid4().hex[:24]}",
                                  function=FunctionCall(name=item["name"], arguments=json.dumps(args))))
    return calls
