"""Chat templates: an artifact's tokenizer_config.json chat_template compiled and rendered as
transformers renders it (sandboxed Jinja, trim_blocks, lstrip_blocks, raise_exception,
tojson), so /v1/chat/completions sends the model the prompt it was trained on.

Tools (OpenAI's `tools`) go to the template as transformers passes them (`tools=[{"type":
"function", "function": {...}}]`, HF's named 'tool_use' template where there is one), with
earlier assistant tool calls' arguments as objects, as templates read them. A template that
does not read `tools` gets them as Qwen's and Hermes' templates write them: a system message
listing the functions and the <tool_call> format (the one Constrainer.tool_calls makes the
model follow), earlier calls as <tool_call> text and tool results as <tool_response> user
messages."""
from __future__ import annotations

import json
import time
from typing import Any

from jinja2 import Template, meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tinyt.errors import ApiError


def template_source(source: Any, *, tools: bool = False) -> str | None:
    """The Jinja text of tokenizer_config.json's chat_template: a string, or from HF's list of
    named templates 'default' ('tool_use' first when the request has tools, as transformers
    picks); None when there is none."""
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = (tools and named.get("tool_use")) or named.get("default") or \
            next(iter(named.values()), None)
    return source if isinstance(source, str) else None


def reads_tools(source: Any) -> bool:
    """Whether the template (its Jinja text) reads the `tools` variable."""
    if not isinstance(source, str):
        return False
    try:
        return "tools" in meta.find_undeclared_variables(
            ImmutableSandboxedEnvironment().parse(source))
    except Exception:  # a template Jinja cannot parse fails where it is compiled
        return False


def compile_template(source: Any, *, tools: bool = False) -> Template | None:
    """A Jinja template from tokenizer_config.json's chat_template (template_source);
    None when there is none."""
    source = template_source(source, tools=tools)
    if source is None:
        return None

    def raise_exception(message):  # the template's own refusal: render_chat makes it a 400
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v, indent=None: json.dumps(v, indent=indent,
                                                             ensure_ascii=False)
    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda fmt: time.strftime(fmt))
    return env.from_string(source)


def render_chat(template: Template, messages: Any, tokenizer, *, tools: list | None = None,
                template_reads_tools: bool = True) -> str:
    """The prompt of `messages` (a non-empty list of {"role": str, "content": str}; an
    assistant's may carry tool_calls and no content) with the generation prompt added, and
    `tools` (OpenAI's function list) where given; the template's refusal or failure is an
    ApiError (400)."""
    messages = check_messages(messages)
    extra = {}
    if tools and template_reads_tools:
        extra["tools"] = tools
    elif tools:
        messages = tools_as_text(messages, tools)
    try:
        return template.render(messages=messages, add_generation_prompt=True,
                               bos_token=tokenizer.bos_token or "",
                               eos_token=tokenizer.eos_token, **extra)
    except Exception as e:  # the template's own raise_exception, or a template error
        raise ApiError(400, f"the chat template refused the messages: {e}",
                       param="messages") from None


def check_messages(messages: Any) -> list[dict]:
    """The messages with earlier tool calls' arguments as objects (OpenAI sends them as JSON
    text; templates read them as mappings); ApiError (400) naming what is wrong."""
    def ok(m: Any) -> bool:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)):
            return False
        if isinstance(m.get("content"), str):
            return True
        return m.get("content") is None and m["role"] == "assistant" and \
            isinstance(m.get("tool_calls"), list) and bool(m["tool_calls"])
    if not isinstance(messages, list) or not messages or not all(ok(m) for m in messages):
        raise ApiError(400, "'messages' must be a non-empty list of {\"role\": str, "
                            "\"content\": str} objects (an assistant's content may be null "
                            "where it has tool_calls)", param="messages")
    out = []
    for i, m in enumerate(messages):
        if isinstance(m.get("tool_calls"), list):
            m = {**m, "tool_calls": [_call(c, i, k) for k, c in enumerate(m["tool_calls"])]}
        out.append(m)
    return out


def _call(call: Any, i: int, k: int) -> dict:
    where = f"messages[{i}].tool_calls[{k}]"
    fn = call.get("function") if isinstance(call, dict) else None
    if not (isinstance(fn, dict) and isinstance(fn.get("name"), str)
            and isinstance(fn.get("arguments"), (str, dict))):
        raise ApiError(400, f"{where} must be {{\"id\": str, \"type\": \"function\", "
                            "\"function\": {\"name\": str, \"arguments\": str}}",
                       param="messages")
    arguments = fn["arguments"]
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise ApiError(400, f"{where}.function.arguments is not valid JSON",
                           param="messages") from None
    return {**call, "function": {**fn, "arguments": arguments}}


# The system message of a template that does not read `tools`: Qwen2.5's and Hermes' words.
TOOLS_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    "{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>")


def tools_as_text(messages: list[dict], tools: list) -> list[dict]:
    """Messages for a template that does not read `tools`: the tools in a system message
    (the first one's, where there is one), calls and results as text."""
    listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    system = TOOLS_SYSTEM.format(tools=listing)
    out: list[dict] = []
    for m in messages:
        if m.get("tool_calls"):
            calls = "\n".join("<tool_call>\n" + json.dumps(
                {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                ensure_ascii=False) + "\n</tool_call>" for c in m["tool_calls"])
            m = {"role": "assistant", "content": ((m.get("content") or "") + "\n" + calls)
                 .strip()}
        elif m["role"] == "tool":
            m = {"role": "user", "content": f"<tool_response>\n{m['content']}\n"
                                            "</tool_response>"}
        out.append(m)
    if out[0]["role"] == "system":
        return [{**out[0], "content": out[0]["content"] + "\n\n" + system}, *out[1:]]
    return [{"role": "system", "content": system}, *out]
