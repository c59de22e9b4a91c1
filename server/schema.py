"""The OpenAI request schema `tinyt serve` reads: a body's fields checked one by one, each bad
one an ApiError (400) that names it and says what is allowed, and the good ones turned into
the runtime's SamplingParams (torch-free, no HTTP).

    raw bytes ──parse_body──▶ dict (JSON object, known fields, the served model)
              ──completion_prompts / chat.render_chat──▶ prompts
              ──check_prompt (per prompt's ids)──▶ sampling(body, ...) ──▶ SamplingParams
"""
from __future__ import annotations

import json
from typing import Any

from tinyt.errors import ApiError
from tinyt.runtime.sampling import SamplingParams

# Fields of OpenAI's requests tinyt does not implement: refused by name, with the value that
# would be harmless (absent or equal to it) accepted.
UNSUPPORTED = {"n": 1, "best_of": 1, "logprobs": None, "top_logprobs": None, "echo": False,
               "suffix": None, "logit_bias": None, "presence_penalty": 0,
               "frequency_penalty": 0, "tools": None, "tool_choice": None, "functions": None,
               "function_call": None, "response_format": None, "parallel_tool_calls": None,
               "prediction": None, "audio": None, "modalities": None}
ACCEPTED = {"model", "prompt", "messages", "max_tokens", "max_completion_tokens",
            "temperature", "top_p", "top_k", "stop", "seed", "stream", "stream_options", "user",
            "min_tokens", "repetition_penalty", "store", "metadata", "service_tier"}
MAX_STOPS = 4
COMPLETION_MAX_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions


def field(body: dict, name: str, kinds: tuple, default=None, *, check=None, allowed=""):
    """body[name] if it is one of `kinds` (a bool is not an int) and passes `check`; absent
    or null: `default`; else ApiError(400, param=name) saying what is `allowed`."""
    value = body.get(name)
    if value is None:  # absent or null: the default
        return default
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise ApiError(400, f"'{name}' must be {allowed or ' or '.join(k.__name__ for k in kinds)}"
                            f", got {json.dumps(value)[:60]}", param=name)
    if check is not None and not check(value):
        raise ApiError(400, f"'{name}'={json.dumps(value)[:60]} is invalid: {allowed}",
                       param=name)
    return value


def check_fields(body: Any) -> dict:
    """The body itself if it is a JSON object of fields tinyt reads; fields it does not
    implement, and unknown ones, are refused by name."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    refused = sorted(k for k, harmless in UNSUPPORTED.items()
                     if k in body and body[k] is not None and body[k] != harmless)
    if refused:
        raise ApiError(400, f"tinyt does not implement {', '.join(refused)} (one choice per "
                            "prompt, no log-probabilities, penalties or tools); remove "
                            f"{'it' if len(refused) == 1 else 'them'}", param=refused[0])
    unknown = sorted(set(body) - ACCEPTED - set(UNSUPPORTED))
    if unknown:
        raise ApiError(400, f"unknown field(s) {', '.join(unknown)}; tinyt reads "
                            f"{', '.join(sorted(ACCEPTED))}", param=unknown[0])
    return body


def parse_body(raw: bytes, model_id: str) -> dict:
    """A request body: valid JSON (400), fields tinyt reads (check_fields), and a 'model'
    that is the one this server serves (404 for another)."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    body = check_fields(body)
    model = body.get("model")
    if not isinstance(model, str):
        raise ApiError(400, "'model' is required (a string)", param="model")
    if model != model_id:
        raise ApiError(404, f"model {model!r} does not exist; this server serves "
                            f"{model_id!r}", param="model", kind="not_found_error")
    return body


def completion_prompts(body: dict) -> list[str]:
    """/v1/completions' 'prompt': a string, or a non-empty list of them (one choice each)."""
    prompt = body.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if not (isinstance(prompts, list) and prompts and all(isinstance(p, str) for p in prompts)):
        raise ApiError(400, "'prompt' must be a string or a non-empty list of strings",
                       param="prompt")
    return prompts


def check_prompt(ids: list[int], context: int) -> list[int]:
    """A prompt's token ids if they leave room for one new token in the model's context."""
    if not ids:
        raise ApiError(400, "the prompt is empty", param="prompt")
    if len(ids) >= context:
        raise ApiError(400, f"the prompt is {len(ids)} tokens; this model reads at most "
                            f"{context - 1} (its context {context}, less one so that a token "
                            "can follow)", param="prompt")
    return ids


def stream_options(body: dict) -> tuple[bool, bool]:
    """(stream, whether the stream ends with a usage chunk: stream_options.include_usage)."""
    stream = field(body, "stream", (bool,), False)
    include_usage = bool((field(body, "stream_options", (dict,), {}) or {}).get("include_usage"))
    return stream, include_usage


def sampling(body: dict, prompt_len: int, context: int, default_max: int) -> SamplingParams:
    """SamplingParams of an OpenAI request (OpenAI's defaults: temperature 1, top_p 1); at most
    the tokens the context leaves after a prompt of `prompt_len`, `default_max` when the
    request does not say."""
    room = context - prompt_len
    max_tokens = field(body, "max_tokens", (int,), None, check=lambda v: v >= 1,
                       allowed="an integer >= 1")
    max_tokens = field(body, "max_completion_tokens", (int,), max_tokens,
                       check=lambda v: v >= 1, allowed="an integer >= 1")
    if max_tokens is not None and max_tokens > room:
        raise ApiError(400, f"max_tokens={max_tokens} does not fit: the prompt is {prompt_len} "
                            f"tokens and the model's context {context}, so at most {room} new "
                            "tokens", param="max_tokens")
    stop = field(body, "stop", (str, list), ())
    stop = (stop,) if isinstance(stop, str) else stop
    if len(stop) > MAX_STOPS or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, f"'stop' must be a non-empty string or a list of at most "
                            f"{MAX_STOPS} of them", param="stop")
    number = (int, float)
    return SamplingParams(
        max_new_tokens=min(max_tokens or default_max, room),
        min_new_tokens=field(body, "min_tokens", (int,), 0, check=lambda v: v >= 0,
                             allowed="an integer >= 0"),
        temperature=float(field(body, "temperature", number, 1.0, check=lambda v: 0 <= v <= 2,
                                allowed="a number in [0, 2]")),
        top_p=field(body, "top_p", number, None, check=lambda v: 0 < v <= 1,
                    allowed="a number in (0, 1]"),
        top_k=field(body, "top_k", (int,), None, check=lambda v: v >= 1,
                    allowed="an integer >= 1"),
        repetition_penalty=float(field(body, "repetition_penalty", number, 1.0,
                                       check=lambda v: 0 < v < 100,
                                       allowed="a number in (0, 100)")),
        seed=field(body, "seed", (int,), None, check=lambda v: v >= 0,
                   allowed="an integer >= 0"),
        stop=tuple(stop))
