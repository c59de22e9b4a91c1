"""Structured output in `tinyt serve`: OpenAI's response_format (json_object, json_schema)
and, in chat, tools / tool_choice / parallel_tool_calls, checked into a Structure; the
grammar each sample follows (runtime/constrain.py); the model's tool calls as OpenAI's
`message.tool_calls`, whole or streamed (torch-free, no HTTP).

    body ──structure(body, chat)──▶ Structure | None ──Structure.grammar(constrainer)──▶
         Grammar (compiled once per request, a ConfigError is a 400 naming the field)
         ──.constraint() per sample──▶ Engine.submit(constraint=...)
    text ──tool_answer──▶ (content, tool_calls)   streamed: ToolStream holds back the calls
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from tinyt.errors import ApiError, ConfigError
from tinyt.runtime.constrain import TOOL_BEGIN, Constrainer, Grammar, Tool, parse_tool_calls

FORMATS = ("text", "json_object", "json_schema")
CHOICES = ("none", "auto", "required")
NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's function and schema names
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class Structure:
    """What a request's output must follow."""
    kind: str  # json_object | json_schema | tools
    param: str  # the field a failure is blamed on
    schema: dict | None = None  # json_schema's
    tools: tuple[Tool, ...] = ()  # the functions offered (kind 'tools')
    choice: str = "auto"  # auto | required | a function's name
    parallel: bool = True

    def grammar(self, constrainer: Constrainer) -> Grammar:
        """The compiled grammar; ApiError (400, param) when it cannot be followed."""
        try:
            if self.kind == "json_object":
                return constrainer.json_object(what=self.param)
            if self.kind == "json_schema":
                return constrainer.json_schema(self.schema, what=self.param)
            return constrainer.tool_calls(list(self.tools), choice=self.choice,
                                          parallel=self.parallel, what=self.param)
        except ConfigError as e:
            raise ApiError(400, str(e), param=self.param.split(".")[0].split("[")[0]) from None


def structure(body: dict, *, chat: bool) -> tuple[Structure | None, list | None]:
    """The request's Structure (None: free text) and the tools to show the chat template
    (OpenAI's list, also with tool_choice 'none'; None without tools)."""
    fmt = response_format(body)
    tools = body.get("tools")
    if not chat:
        for name in ("tools", "tool_choice", "parallel_tool_calls"):
            if body.get(name) is not None:
                raise ApiError(400, f"'{name}' is a chat completions field; /v1/completions "
                                    "takes response_format", param=name)
        return fmt, None
    if tools is None:
        for name in ("tool_choice", "parallel_tool_calls"):
            if body.get(name) is not None:
                raise ApiError(400, f"'{name}' needs 'tools'", param=name)
        return fmt, None
    offered = check_tools(tools)
    choice = tool_choice(body.get("tool_choice"), offered)
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ApiError(400, "'parallel_tool_calls' must be true or false",
                       param="parallel_tool_calls")
    if choice == "none":
        return fmt, tools
    if fmt is not None:
        raise ApiError(400, "response_format with tools: tinyt constrains a reply to one of "
                            "them; send tool_choice 'none' to have response_format apply, or "
                            "leave response_format out", param="response_format")
    return Structure("tools", "tools", tools=tuple(offered), choice=choice,
                     parallel=parallel), tools


def response_format(body: dict) -> Structure | None:
    """OpenAI's response_format: {"type": "text"} (None), {"type": "json_object"}, or
    {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    shape = ("{\"type\": \"text\" | \"json_object\" | \"json_schema\"} (json_schema with "
             "\"json_schema\": {\"name\": str, \"schema\": object, \"strict\": bool})")
    if not isinstance(fmt, dict) or fmt.get("type") not in FORMATS:
        raise ApiError(400, f"'response_format' must be {shape}", param="response_format")
    kind = fmt["type"]
    allowed = {"type", "json_schema"} if kind == "json_schema" else {"type"}
    if set(fmt) - allowed:
        raise ApiError(400, f"response_format of type {kind!r} takes only {sorted(allowed)}, "
                            f"not {sorted(set(fmt) - allowed)}", param="response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        return Structure("json_object", "response_format")
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict) or \
            set(spec) - {"name", "schema", "strict", "description"}:
        raise ApiError(400, f"'response_format' must be {shape}", param="response_format")
    name = spec.get("name")
    if name is not None and not (isinstance(name, str) and NAME.fullmatch(name)):
        raise ApiError(400, "response_format.json_schema.name must be 1-64 letters, digits, "
                            "'_' or '-'", param="response_format")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise ApiError(400, "response_format.json_schema.strict must be true or false",
                       param="response_format")
    # strict or not, the schema is followed token by token (docs/serving.md)
    return Structure("json_schema", "response_format.json_schema.schema",
                     schema=spec["schema"])


def check_tools(tools) -> list[Tool]:
    """OpenAI's tools: [{"type": "function", "function": {"name", "description",
    "parameters", "strict"}}], names distinct."""
    shape = ("a non-empty list of {\"type\": \"function\", \"function\": {\"name\": str, "
             "\"description\": str, \"parameters\": object}}")
    if not isinstance(tools, list) or not tools:
        raise ApiError(400, f"'tools' must be {shape}", param="tools")
    out: list[Tool] = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(tool, dict) and tool.get("type") == "function"
                and isinstance(fn, dict) and set(tool) <= {"type", "function"}
                and set(fn) <= {"name", "description", "parameters", "strict"}):
            raise ApiError(400, f"tools[{i}] is not {{\"type\": \"function\", \"function\": "
                                "{\"name\", \"description\", \"parameters\", \"strict\"}}",
                           param="tools")
        name = fn.get("name")
        if not (isinstance(name, str) and NAME.fullmatch(name)):
            raise ApiError(400, f"tools[{i}].function.name must be 1-64 letters, digits, '_' "
                                "or '-'", param="tools")
        if any(t.name == name for t in out):
            raise ApiError(400, f"tools[{i}].function.name {name!r} is given twice",
                           param="tools")
        params = fn.get("parameters", NO_PARAMETERS)
        if not isinstance(params, dict):
            raise ApiError(400, f"tools[{i}].function.parameters must be a JSON schema object",
                           param="tools")
        out.append(Tool(name, params))
    return out


def tool_choice(value, tools: list[Tool]) -> str:
    """'none' | 'auto' (the default) | 'required' | a function's name (OpenAI's
    {"type": "function", "function": {"name": ...}})."""
    if value is None:
        return "auto"
    if isinstance(value, str) and value in CHOICES:
        return value
    fn = value.get("function") if isinstance(value, dict) else None
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(fn, dict) \
            and isinstance(fn.get("name"), str):
        if not any(t.name == fn["name"] for t in tools):
            raise ApiError(400, f"tool_choice names {fn['name']!r}, which is not among the "
                                f"tools: {[t.name for t in tools]}", param="tool_choice")
        return fn["name"]
    raise ApiError(400, "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": "
                        "\"function\", \"function\": {\"name\": str}}", param="tool_choice")


# -- the answer ----------------------------------------------------------------------------
def tool_calls_json(calls: list[tuple[str, dict]], *, index: bool = False) -> list[dict]:
    """OpenAI's tool_calls (arguments as JSON text; streamed: with each call's index)."""
    out = []
    for i, (name, arguments) in enumerate(calls):
        call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": name,
                             "arguments": json.dumps(arguments, ensure_ascii=False)}}
        out.append({"index": i, **call} if index else call)
    return out


def tool_message(text: str) -> tuple[dict, bool]:
    """The chat message of text made under a tools grammar, and whether it calls tools."""
    content, calls = parse_tool_calls(text)
    if not calls:
        return {"role": "assistant", "content": text}, False
    return {"role": "assistant", "content": content.strip() or None,
            "tool_calls": tool_calls_json(calls)}, True


class ToolStream:
    """A streamed reply under a tools grammar: its text shown as it comes until a call may
    begin (a possible start of TOOL_BEGIN is held back), the rest when it ends."""

    def __init__(self):
        self.text = ""  # all the text so far
        self.shown = 0  # characters of it sent as content
        self.calling = False  # a call began: nothing more is shown until the end

    def add(self, piece: str) -> str:
        """The content to send now for a new piece of text."""
        self.text += piece
        if self.calling:
            return ""
        at = self.text.find(TOOL_BEGIN[:-1], self.shown)  # "<tool_call>"
        if at >= 0:
            self.calling = True
            end = at
        else:
            end = len(self.text) - _held(self.text, TOOL_BEGIN[:-1])
        out, self.shown = self.text[self.shown:end], max(self.shown, end)
        return out

    def finish(self, text: str) -> tuple[str, list[dict]]:
        """At the end (`text`: the whole reply): the content not sent yet and the calls."""
        content, calls = parse_tool_calls(text)
        if not calls:
            return text[self.shown:], []
        return content[self.shown:].rstrip(), tool_calls_json(calls, index=True)


def _held(text: str, marker: str) -> int:
    """How many characters at text's end could begin `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
