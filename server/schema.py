"""The OpenAI request schema `tinyt serve` reads: a body's fields checked one by one, each bad
one an ApiError (400) that names it and says what is allowed, and the good ones turned into
the runtime's SamplingParams (torch-free, no HTTP).

    raw bytes ──parse_body──▶ dict (JSON object, known fields, the served model)
              ──completion_prompts / chat.render_chat──▶ prompts
              ──check_prompt (per prompt's ids)──▶ sampling(body, ...) ──▶ SamplingParams
    /v1/embeddings: parse_body(..., accepted=EMBEDDING_FIELDS) ──embedding_inputs──▶ texts or
              token-id lists (checked against the vocabulary and max length),
              embedding_options (encoding_format, dimensions, user)
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tinyt.errors import ApiError
from tinyt.runtime.sampling import SamplingParams
from tinyt.runtime.score import MAX_TOP

# Fields of OpenAI's requests tinyt does not implement: refused by name, with the value that
# would be harmless (absent or equal to it) accepted.
# (response_format, tools, tool_choice and parallel_tool_calls: structured.py; the legacy
# functions / function_call, which OpenAI replaced with tools, are refused.)
UNSUPPORTED = {"suffix": None, "logit_bias": None, "presence_penalty": 0,
               "frequency_penalty": 0, "functions": None, "function_call": None,
               "prediction": None, "audio": None, "modalities": None}
ACCEPTED = {"model", "prompt", "messages", "max_tokens", "max_completion_tokens",
            "temperature", "top_p", "top_k", "stop", "seed", "stream", "stream_options", "user",
            "min_tokens", "repetition_penalty", "store", "metadata", "service_tier",
            "n", "best_of", "logprobs", "top_logprobs", "echo", "response_format", "tools",
            "tool_choice", "parallel_tool_calls", "ignore_eos"}
MAX_CHOICES = 16  # n and best_of at most: each is a row of the running batch
COMPLETION_LOGPROBS = 5  # /v1/completions' logprobs at most (OpenAI's legacy limit is 5; so
# is tinyt's by default, as vLLM's max_logprobs bounds its own)
MAX_STOPS = 4
COMPLETION_MAX_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
EMBEDDING_FIELDS = {"model", "input", "encoding_format", "dimensions", "user"}
TOKENIZE_FIELDS = {"model", "prompt", "add_special_tokens"}  # vLLM's /tokenize, as text
DETOKENIZE_FIELDS = {"model", "tokens"}
MAX_EMBEDDING_INPUTS = 2048  # inputs per /v1/embeddings request, OpenAI's limit too
ENCODING_FORMATS = ("float", "base64")
INPUT_KINDS = ("a non-empty string, a list of them, a list of token ids, or a list of lists of "
               "token ids")


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


def check_fields(body: Any, accepted: set[str] = ACCEPTED,
                 unsupported: dict[str, Any] | None = None) -> dict:
    """The body itself if it is a JSON object of fields tinyt reads (`accepted`); fields it
    does not implement (`unsupported`, default UNSUPPORTED when `accepted` holds ACCEPTED), and
    unknown ones, are refused by name."""
    if unsupported is None:
        unsupported = UNSUPPORTED if accepted >= ACCEPTED else {}  # completions' (and more)
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    refused = sorted(k for k, harmless in unsupported.items()
                     if k in body and body[k] is not None and body[k] != harmless)
    if refused:
        raise ApiError(400, f"tinyt does not implement {', '.join(refused)} (no suffix, logit "
                            "bias, presence or frequency penalties, predicted outputs, audio, "
                            "or the legacy functions: send tools); "
                            f"remove {'it' if len(refused) == 1 else 'them'}", param=refused[0])
    unknown = sorted(set(body) - accepted - set(unsupported))
    if unknown:
        raise ApiError(400, f"unknown field(s) {', '.join(unknown)}; tinyt reads "
                            f"{', '.join(sorted(accepted))}", param=unknown[0])
    return body


def parse_body(raw: bytes, model_id: str, *, accepted: set[str] = ACCEPTED,
               model_required: bool = True) -> dict:
    """A request body: valid JSON (400), fields tinyt reads (check_fields: `accepted`, the
    completions' by default), and a 'model' that is the one this server serves (404 for
    another; it may be left out where not model_required)."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    except RecursionError:  # e.g. a response_format schema of 100,000 nested lists
        raise ApiError(400, "the request body nests too deeply to be read (Python's JSON "
                            "parser stops near 1,000 levels)") from None
    body = check_fields(body, accepted)
    model = body.get("model")
    if model is None and not model_required:
        return body
    if not isinstance(model, str):
        raise ApiError(400, "'model' is required (a string)", param="model")
    if model != model_id:
        raise ApiError(404, f"model {model!r} does not exist; this server serves "
                            f"{model_id!r}", param="model", kind="not_found_error")
    return body


PROMPT_KINDS = ("a string, a non-empty list of strings, a list of token ids, or a non-empty "
                "list of lists of token ids")


def completion_prompts(body: dict, vocab_size: int) -> list[str | list[int]]:
    """/v1/completions' 'prompt': a string, a list of them, a list of token ids or a list of
    such lists (OpenAI's four forms); one prompt each (texts, or ids in 0..vocab_size-1, run
    as given)."""
    prompt = body.get("prompt")
    ids_one = isinstance(prompt, list) and bool(prompt) and all(_is_id(t) for t in prompt)
    prompts = [prompt] if isinstance(prompt, str) or ids_one else prompt
    if not (isinstance(prompts, list) and prompts and all(
            isinstance(p, str) or (isinstance(p, list) and p and all(_is_id(t) for t in p))
            for p in prompts)):
        raise ApiError(400, f"'prompt' must be {PROMPT_KINDS}", param="prompt")
    for i, p in enumerate(prompts):
        bad = [t for t in p if not 0 <= t < vocab_size] if isinstance(p, list) else []
        if bad:
            raise ApiError(400, f"prompt {i} has token id {bad[0]}, outside this model's "
                                f"vocabulary (0..{vocab_size - 1})", param="prompt")
    return prompts


@dataclass(frozen=True)
class Outputs:
    """What a request asks to get back beside the text."""
    n: int = 1  # choices per prompt
    best_of: int = 1  # samples made per prompt, the n most likely returned
    logprobs: int | None = None  # alternatives beside each token's logprob (None: none)
    echo: bool = False  # the prompt before the completion (completions)


def outputs(body: dict, *, chat: bool, stream: bool) -> Outputs:
    """n, best_of, logprobs (completions: an int 0..COMPLETION_LOGPROBS; chat: a bool with
    top_logprobs 0..MAX_TOP), echo (completions)."""
    n = field(body, "n", (int,), 1, check=lambda v: 1 <= v <= MAX_CHOICES,
              allowed=f"an integer in 1..{MAX_CHOICES}")
    if chat:
        for name in ("best_of", "echo"):
            if body.get(name) is not None:
                raise ApiError(400, f"'{name}' is a /v1/completions field; chat completions "
                                    "do not take it", param=name)
        wanted = field(body, "logprobs", (bool,), False, allowed="true or false")
        top = field(body, "top_logprobs", (int,), None, check=lambda v: 0 <= v <= MAX_TOP,
                    allowed=f"an integer in 0..{MAX_TOP}")
        if top is not None and not wanted:
            raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        return Outputs(n=n, best_of=n, logprobs=(top or 0) if wanted else None)
    if body.get("top_logprobs") is not None:
        raise ApiError(400, "'top_logprobs' is a chat completions field; /v1/completions "
                            "takes 'logprobs': the number of alternatives", param="top_logprobs")
    best_of = field(body, "best_of", (int,), n, check=lambda v: n <= v <= MAX_CHOICES,
                    allowed=f"an integer in n ({n})..{MAX_CHOICES}")
    if best_of > n and stream:
        raise ApiError(400, f"best_of={best_of} > n={n} cannot stream (the best are known at "
                            "the end); drop 'stream' or best_of", param="best_of")
    logprobs = field(body, "logprobs", (int,), None,
                     check=lambda v: 0 <= v <= COMPLETION_LOGPROBS,
                     allowed=f"an integer in 0..{COMPLETION_LOGPROBS}")
    return Outputs(n=n, best_of=best_of, logprobs=logprobs,
                   echo=field(body, "echo", (bool,), False, allowed="true or false"))


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


def sampling(body: dict, prompt_len: int, context: int, default_max: int, *,
             echo: bool = False) -> SamplingParams:
    """SamplingParams of an OpenAI request (OpenAI's defaults: temperature 1, top_p 1); at most
    the tokens the context leaves after a prompt of `prompt_len`, `default_max` when the
    request does not say. max_tokens 0 only with echo (the prompt scored, nothing made)."""
    room = context - prompt_len
    least = 0 if echo else 1
    allowed = "an integer >= 0 (0 with echo: the prompt alone)" if echo else \
        "an integer >= 1 (0 only with echo)"
    max_tokens = field(body, "max_tokens", (int,), None, check=lambda v: v >= least,
                       allowed=allowed)
    max_tokens = field(body, "max_completion_tokens", (int,), max_tokens,
                       check=lambda v: v >= least, allowed=allowed)
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
    most = min(default_max if max_tokens is None else max_tokens, room)
    least_new = field(body, "min_tokens", (int,), 0, check=lambda v: v >= 0,
                      allowed="an integer >= 0")
    if field(body, "ignore_eos", (bool,), False, allowed="true or false"):
        least_new = most  # vLLM's: end-of-text is never chosen (a benchmark's exact length)
    return SamplingParams(
        max_new_tokens=most,
        min_new_tokens=least_new,
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


def _is_id(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def embedding_inputs(body: dict, *, vocab_size: int,
                     max_length: int) -> tuple[list[str], list[list[int]]]:
    """/v1/embeddings' 'input' as (texts, []) or ([], token-id lists), one per input, at most
    MAX_EMBEDDING_INPUTS. Texts must be non-empty (the encoder cuts them at max_length);
    token ids run as given, so each must be in 0..vocab_size-1 and a list at most max_length
    long (special tokens included: nothing is added)."""
    value = body.get("input")
    # one text, or one input of token ids ([101, 7592, 102]): a list of one input
    flat = isinstance(value, list) and bool(value) and not isinstance(value[0], (str, list))
    inputs = [value] if isinstance(value, str) or flat else value
    if not isinstance(inputs, list):
        raise ApiError(400, f"'input' must be {INPUT_KINDS}, got {json.dumps(value)[:60]}",
                       param="input")
    if not inputs:
        raise ApiError(400, "'input' is an empty list; send at least one input", param="input")
    if len(inputs) > MAX_EMBEDDING_INPUTS:
        raise ApiError(400, f"'input' has {len(inputs)} inputs; at most {MAX_EMBEDDING_INPUTS} "
                            "per request", param="input")

    def where(i: int, j: int | None = None) -> str:  # the path in what the client sent
        path = ([] if flat else [i]) + ([] if j is None else [j])
        return "input" + "".join(f"[{k}]" for k in path)

    kind = str if isinstance(inputs[0], str) else list
    for i, item in enumerate(inputs):
        if not isinstance(item, kind):
            raise ApiError(400, f"'input' must be {INPUT_KINDS}, not a mix; {where(i)} is "
                                f"{json.dumps(item)[:60]}", param="input")
        if not item:
            what = "string" if kind is str else "list of token ids"
            raise ApiError(400, f"{where(i)} is an empty {what}; every input needs at least "
                                "one character or token", param="input")
    if kind is str:
        return inputs, []
    for i, ids in enumerate(inputs):
        for j, t in enumerate(ids):
            if not (isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size):
                raise ApiError(400, f"{where(i, j)} is {json.dumps(t)[:60]}, not a token id of "
                                    f"this model: an integer in 0..{vocab_size - 1}",
                               param="input")
        if len(ids) > max_length:
            raise ApiError(400, f"{where(i)} is {len(ids)} token ids; this model reads at most "
                                f"{max_length} per input (ids run as given, special tokens "
                                "included; texts are cut there instead)", param="input")
    return [], inputs


def embedding_options(body: dict, dim: int) -> str:
    """The answer's 'encoding_format': 'float' (the default) or 'base64' (each embedding's
    little-endian float32 bytes); 'dimensions' must be absent or the model's `dim` (tinyt does
    not shorten embeddings), 'user' a string (read and ignored)."""
    dimensions = field(body, "dimensions", (int,), dim, allowed="an integer")
    if dimensions != dim:
        raise ApiError(400, f"'dimensions'={dimensions}: this model's embeddings have {dim} "
                            f"dimensions and tinyt does not shorten them; send {dim} or leave "
                            "it out", param="dimensions")
    field(body, "user", (str,), allowed="a string")
    return field(body, "encoding_format", (str,), "float", check=lambda v: v in ENCODING_FORMATS,
                 allowed="'float' or 'base64'")
