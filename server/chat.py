"""Chat templates: an artifact's tokenizer_config.json chat_template compiled and rendered as
transformers renders it (sandboxed Jinja, trim_blocks, lstrip_blocks, raise_exception,
tojson), so /v1/chat/completions sends the model the prompt it was trained on."""
from __future__ import annotations

import json
import time
from typing import Any

from jinja2 import Template
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tinyt.errors import ApiError


def compile_template(source: Any) -> Template | None:
    """A Jinja template from tokenizer_config.json's chat_template (a string, or HF's list of
    named templates: 'default'); None when there is none."""
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default") or next(iter(named.values()), None)
    if not isinstance(source, str):
        return None

    def raise_exception(message):  # the template's own refusal: render_chat makes it a 400
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v, indent=None: json.dumps(v, indent=indent,
                                                             ensure_ascii=False)
    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda fmt: time.strftime(fmt))
    return env.from_string(source)


def render_chat(template: Template, messages: Any, tokenizer) -> str:
    """The prompt of `messages` (a non-empty list of {"role": str, "content": str}) with the
    generation prompt added; the template's refusal or failure is an ApiError (400)."""
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in messages):
        raise ApiError(400, "'messages' must be a non-empty list of {\"role\": str, "
                            "\"content\": str} objects", param="messages")
    try:
        return template.render(messages=messages, add_generation_prompt=True,
                               bos_token=tokenizer.bos_token or "",
                               eos_token=tokenizer.eos_token)
    except Exception as e:  # the template's own raise_exception, or a template error
        raise ApiError(400, f"the chat template refused the messages: {e}",
                       param="messages") from None
