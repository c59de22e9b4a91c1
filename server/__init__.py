"""`tinyt serve`: an OpenAI-compatible HTTP server over the continuous-batching engine
(torch-free; the `serve` extra: starlette, uvicorn, prometheus-client, jinja2).

    HTTP (starlette + uvicorn) ── validate ──▶ Engine.submit (runtime/engine.py) ──▶ events
      POST /v1/completions        prompt (str | [str]), max_tokens, temperature, top_p, top_k,
                                  stop, seed, stream (server-sent events ending [DONE])
      POST /v1/chat/completions   messages through the artifact's chat template
      GET  /v1/models, /health, /metrics (Prometheus)

Every failure is an OpenAI-style {"error": {"message", "type", "param", "code"}} with its
status, never a traceback: malformed JSON and wrong types 400, an unknown model 404, a prompt
or max_tokens beyond the context 400 (with the limits), a full queue 429 with Retry-After, a
missing or wrong key 401. Fields tinyt cannot honour (n > 1, logprobs, best_of, ...) are
refused by name rather than ignored. A client that disconnects has its request cancelled
within a step; SIGTERM stops taking requests, finishes what runs and exits 0.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from tinyt.errors import ApiError
from tinyt.runtime.engine import Done, Engine, QueueFull, Token
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
RETRY_AFTER_S = 1
MAX_STOPS = 4


@dataclass
class Job:
    """One choice of a request: its prompt ids and what it is asked to make."""
    ids: list[int]
    params: SamplingParams


def _field(body: dict, name: str, kinds: tuple, default=None, *, check=None, allowed=""):
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


def sampling(body: dict, prompt_len: int, context: int, default_max: int) -> SamplingParams:
    """SamplingParams of an OpenAI request (OpenAI's defaults: temperature 1, top_p 1)."""
    room = context - prompt_len
    max_tokens = _field(body, "max_tokens", (int,), None, check=lambda v: v >= 1,
                        allowed="an integer >= 1")
    max_tokens = _field(body, "max_completion_tokens", (int,), max_tokens,
                        check=lambda v: v >= 1, allowed="an integer >= 1")
    if max_tokens is not None and max_tokens > room:
        raise ApiError(400, f"max_tokens={max_tokens} does not fit: the prompt is {prompt_len} "
                            f"tokens and the model's context {context}, so at most {room} new "
                            "tokens", param="max_tokens")
    stop = _field(body, "stop", (str, list), ())
    stop = (stop,) if isinstance(stop, str) else stop
    if len(stop) > MAX_STOPS or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, f"'stop' must be a non-empty string or a list of at most "
                            f"{MAX_STOPS} of them", param="stop")
    number = (int, float)
    return SamplingParams(
        max_new_tokens=min(max_tokens or default_max, room),
        min_new_tokens=_field(body, "min_tokens", (int,), 0, check=lambda v: v >= 0,
                              allowed="an integer >= 0"),
        temperature=float(_field(body, "temperature", number, 1.0, check=lambda v: 0 <= v <= 2,
                                 allowed="a number in [0, 2]")),
        top_p=_field(body, "top_p", number, None, check=lambda v: 0 < v <= 1,
                     allowed="a number in (0, 1]"),
        top_k=_field(body, "top_k", (int,), None, check=lambda v: v >= 1,
                     allowed="an integer >= 1"),
        repetition_penalty=float(_field(body, "repetition_penalty", number, 1.0,
                                        check=lambda v: 0 < v < 100,
                                        allowed="a number in (0, 100)")),
        seed=_field(body, "seed", (int,), None, check=lambda v: v >= 0,
                    allowed="an integer >= 0"),
        stop=tuple(stop))


def render_chat(template, messages: Any, tokenizer) -> str:
    """The chat template rendered as transformers renders it (sandboxed Jinja, trim_blocks,
    lstrip_blocks, raise_exception, tojson), with the generation prompt added."""
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


def compile_template(source):
    """A Jinja template from tokenizer_config.json's chat_template (a string, or HF's list of
    named templates: 'default')."""
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default") or next(iter(named.values()), None)
    if not isinstance(source, str):
        return None
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v, indent=None: json.dumps(v, indent=indent,
                                                             ensure_ascii=False)
    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda fmt: time.strftime(fmt))
    return env.from_string(source)


class Metrics:
    """Prometheus metrics of one server (a registry of its own)."""

    def __init__(self, engine: Engine):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.requests = Counter("tinyt_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("tinyt_prompt_tokens", "prompt tokens read", registry=r)
        self.generated = Counter("tinyt_generated_tokens", "tokens generated", registry=r)
        buckets = (.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)
        self.ttft = Histogram("tinyt_time_to_first_token_seconds", "submit to first token",
                              buckets=buckets, registry=r)
        self.tbt = Histogram("tinyt_time_between_tokens_seconds", "between a request's tokens",
                             buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1),
                             registry=r)
        Gauge("tinyt_queue_depth", "requests waiting for a row",
              registry=r).set_function(lambda: engine.queue_depth)
        Gauge("tinyt_running_rows", "rows in the running batch",
              registry=r).set_function(lambda: engine.running)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def build_app(lm, engine: Engine, *, model_id: str, api_key: str | None = None):
    """The Starlette application serving `engine` (started and stopped with the app)."""
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.requests import Request as HttpRequest
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    metrics = Metrics(engine)
    template = compile_template(lm.tokenizer.chat_template)
    state = {"ready": False}

    def error(e: ApiError, endpoint: str) -> JSONResponse:
        metrics.requests.labels(endpoint, str(e.status)).inc()
        return JSONResponse({"error": {"message": e.message, "type": e.kind, "param": e.param,
                                       "code": None}}, status_code=e.status, headers=e.headers)

    def authorize(request: HttpRequest) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if given != f"Bearer {api_key}":
            raise ApiError(401, "a valid API key is required: send 'Authorization: Bearer "
                                "KEY'" if not given else "the API key is not valid",
                           kind="authentication_error")

    async def read_body(request: HttpRequest) -> dict:
        raw = await request.body()
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

    def jobs_for(prompts: list[str], body: dict, default_max: int) -> list[Job]:
        out = []
        for text in prompts:
            ids = lm.tokenizer.encode_prompt(text)
            if not ids:
                raise ApiError(400, "the prompt is empty", param="prompt")
            if len(ids) >= lm.context:
                raise ApiError(400, f"the prompt is {len(ids)} tokens; this model reads at "
                                    f"most {lm.context - 1} (its context {lm.context}, less "
                                    "one so that a token can follow)", param="prompt")
            out.append(Job(ids, sampling(body, len(ids), lm.context, default_max)))
        return out

    def submit_all(jobs: list[Job], loop, queue) -> list:
        reqs = []
        try:
            for i, job in enumerate(jobs):
                reqs.append(engine.submit(job.ids, job.params, listener=lambda ev, i=i:
                                          loop.call_soon_threadsafe(queue.put_nowait, (i, ev))))
        except QueueFull as e:
            for r in reqs:
                r.cancel()
            raise ApiError(429, f"the server is busy: {e}; retry after {RETRY_AFTER_S} s",
                           kind="rate_limit_error",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        for job in jobs:
            metrics.prompt_tokens.inc(len(job.ids))
        return reqs

    async def events(jobs: list[Job]):
        """(choice index, event) as the engine makes them; cancels what runs if abandoned."""
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        reqs = submit_all(jobs, loop, queue)
        last, seen = [r.submitted for r in reqs], [0] * len(reqs)
        remaining = len(reqs)
        try:
            while remaining:
                i, ev = await queue.get()
                if isinstance(ev, Token):
                    (metrics.tbt if seen[i] else metrics.ttft).observe(ev.at - last[i])
                    last[i], seen[i] = ev.at, seen[i] + 1
                    metrics.generated.inc()
                else:
                    remaining -= 1
                yield i, ev
        finally:  # a disconnect or a finished response: nothing keeps running for it
            for r in reqs:
                r.cancel()

    def finish(reason: str) -> str:
        return {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}.get(
            reason, reason)

    async def generate(request: HttpRequest, chat: bool):
        endpoint = "chat" if chat else "completions"
        authorize(request)
        body = await read_body(request)
        if chat:
            if template is None:
                raise ApiError(400, f"{model_id} has no chat template (tokenizer_config.json's "
                                    "chat_template); use /v1/completions", param="messages")
            prompts = [render_chat(template, body.get("messages"), lm.tokenizer)]
        else:
            prompt = body.get("prompt")
            prompts = [prompt] if isinstance(prompt, str) else prompt
            if not (isinstance(prompts, list) and prompts
                    and all(isinstance(p, str) for p in prompts)):
                raise ApiError(400, "'prompt' must be a string or a non-empty list of strings",
                               param="prompt")
        jobs = jobs_for(prompts, body, lm.context if chat else 16)
        stream = _field(body, "stream", (bool,), False)
        usage_in_stream = bool((_field(body, "stream_options", (dict,), {}) or {})
                               .get("include_usage"))
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        head = {"id": rid, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": model_id}
        prompt_tokens = sum(len(j.ids) for j in jobs)
        if not stream:
            texts, reasons, made = [""] * len(jobs), [""] * len(jobs), [0] * len(jobs)
            async for i, ev in events(jobs):
                if isinstance(ev, Done):
                    if ev.finish_reason == "error":
                        raise ApiError(500, f"generation failed: {ev.error}", kind="server_error")
                    texts[i], reasons[i] = ev.text, finish(ev.finish_reason)
                else:
                    made[i] += 1
            choices = [({"index": i, "message": {"role": "assistant", "content": t},
                         "finish_reason": r} if chat else
                        {"index": i, "text": t, "logprobs": None, "finish_reason": r})
                       for i, (t, r) in enumerate(zip(texts, reasons))]
            metrics.requests.labels(endpoint, "200").inc()
            return JSONResponse({**head, "choices": choices, "usage": {
                "prompt_tokens": prompt_tokens, "completion_tokens": sum(made),
                "total_tokens": prompt_tokens + sum(made)}})
        chunk_head = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}
        stream_events = events(jobs)
        first = await stream_events.__anext__()  # a full queue is a 429, not a broken stream

        async def sse():
            made = 0
            try:
                if chat:
                    yield _sse({**chunk_head, "choices": [{"index": 0, "delta": {
                        "role": "assistant", "content": ""}, "finish_reason": None}]})
                pending = [first]
                while True:
                    i, ev = pending.pop() if pending else await stream_events.__anext__()
                    if isinstance(ev, Token):
                        made += 1
                        if ev.text:
                            yield _sse({**chunk_head, "choices": [
                                {"index": i, "delta": {"content": ev.text},
                                 "finish_reason": None} if chat else
                                {"index": i, "text": ev.text, "logprobs": None,
                                 "finish_reason": None}]})
                        continue
                    reason = finish(ev.finish_reason)
                    yield _sse({**chunk_head, "choices": [
                        {"index": i, "delta": {}, "finish_reason": reason} if chat else
                        {"index": i, "text": "", "logprobs": None, "finish_reason": reason}]})
            except StopAsyncIteration:
                pass
            finally:
                await stream_events.aclose()
            if usage_in_stream:
                yield _sse({**chunk_head, "choices": [], "usage": {
                    "prompt_tokens": prompt_tokens, "completion_tokens": made,
                    "total_tokens": prompt_tokens + made}})
            yield "data: [DONE]\n\n"
        metrics.requests.labels(endpoint, "200").inc()
        return StreamingResponse(sse(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    def route(chat: bool):
        async def handler(request: HttpRequest):
            try:
                return await generate(request, chat)
            except ApiError as e:
                return error(e, "chat" if chat else "completions")
            except ValueError as e:  # the runtime's own checks of what it was given
                return error(ApiError(400, str(e)), "chat" if chat else "completions")
        return handler

    async def models(request: HttpRequest):
        try:
            authorize(request)
        except ApiError as e:
            return error(e, "models")
        return JSONResponse({"object": "list", "data": [{
            "id": model_id, "object": "model", "created": int(time.time()), "owned_by": "tinyt",
            "max_model_len": lm.context}]})

    async def health(request: HttpRequest):
        ok = state["ready"]
        return JSONResponse({"status": "ok" if ok else "unavailable", "model": model_id},
                            status_code=200 if ok else 503)

    async def prometheus(request: HttpRequest):
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @asynccontextmanager
    async def lifespan(app):
        engine.start()
        state["ready"] = True
        try:
            yield
        finally:
            state["ready"] = False
            await asyncio.to_thread(engine.stop, timeout=30.0)

    async def not_found(request: HttpRequest, exc):
        return error(ApiError(404, f"no route {request.method} {request.url.path}",
                              kind="not_found_error"), "other")

    app = Starlette(routes=[
        Route("/v1/completions", route(False), methods=["POST"]),
        Route("/v1/chat/completions", route(True), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
    ], lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})
    app.state.engine, app.state.metrics = engine, metrics
    return app


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def serve(artifact, *, host: str = "127.0.0.1", port: int = 8000, threads: int | None = None,
          max_batch: int = 8, max_queue: int = 64, prefill_tokens: int = 64,
          prefill_chunk: int | None = None,
          api_key: str | None = None, model_id: str | None = None,
          spinning: bool | None = None, log_level: str = "info") -> None:
    """Load `artifact` (checked), bind, then serve it until SIGTERM / Ctrl-C (which stop
    taking requests, finish what runs and return). Prints the address it listens on.
    spinning: whether ONNX Runtime's workers busy-wait after each run (None: the runtime's
    choice, on with more than one thread; measured at the GPT-2-small shape, 2 threads, off
    cost a single client 38% of its tokens/s and 8 clients 19%)."""
    import signal
    import socket
    import sys

    import uvicorn

    import tinyt.runtime as rt

    if not (isinstance(port, int) and 0 <= port <= 65535):
        raise ValueError(f"port={port!r} must be in 0..65535")
    lm = rt.load(artifact, threads=threads, spinning=spinning)
    if not isinstance(lm, rt.LanguageModel):
        raise ValueError(f"{artifact} is a classifier; tinyt serve serves language models")
    engine = Engine(lm, max_batch=max_batch, max_queue=max_queue, prefill_tokens=prefill_tokens,
                    prefill_chunk=prefill_chunk)
    app = build_app(lm, engine, model_id=model_id or lm.artifact.path.name, api_key=api_key)
    try:  # bound here, so a taken port is one clear line and port 0 reports the one it got
        sock = socket.create_server((host, port))
    except OSError as e:
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    bound = sock.getsockname()[1]
    how = "shared-cache batching" if engine.batched else "a contract graph: rows run one by one"
    print(f"tinyt serve: {model_id or lm.artifact.path.name} on http://{host}:{bound} "
          f"(max batch {max_batch}, {how})", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level,
                                           timeout_graceful_shutdown=30))
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again under the handler
    # it found: with this one that is a no-op, and a deliberate stop exits 0.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    server.run(sockets=[sock])
