"""The Starlette application of `tinyt serve`: one OpenAIServer holds what a server shares (the
model, the engine, the metrics, the chat template, readiness) and each route is one of its
methods, callable on its own with a request.

    POST /v1/completions, /v1/chat/completions ─▶ authorize ─▶ read_body (schema.parse_body)
        ─▶ structure (response_format, tools: structured.py) ─▶ prompts (schema / chat)
        ─▶ grammar (compiled off the event loop) ─▶ jobs (ids + SamplingParams + constraint)
        ─▶ events (Engine.submit) ─▶ complete (one JSON answer) | stream (server-sent events
        ending [DONE]); tool calls parsed into message.tool_calls
    POST /v1/embeddings (an encoder's server: its `engine` is an Embedder) ─▶ authorize
        ─▶ parse_body ─▶ schema.embedding_inputs ─▶ Embedder.rows ─▶ Embedder.submit
        ─▶ embedding_answer
    POST /tokenize, /detokenize, GET /tokenizer_info: the model's tokenizer, as vLLM's server
        offers it (lm-evaluation-harness tokenizes through them)
    GET /v1/models, /health, /metrics;  anything else: an OpenAI-style 404

A server serves one model: a decoder answers completions and chat, an encoder-decoder
completions (the prompt is the source text: seq2seq_jobs.py, runtime/seq2seq_engine.py), an
encoder embeddings; the other routes answer a 400 that names the ones its model serves.

Every ApiError becomes an OpenAI error body with its status (error); a ValueError from the
runtime's own checks of what it was given becomes a 400.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tinyt.errors import ApiError, ConfigError, QueueFull
from tinyt.runtime.constrain import Constrainer, Grammar
from tinyt.runtime.embed import Encoder
from tinyt.runtime.encoder_decoder import Seq2SeqModel
from tinyt.runtime.engine import Done, Engine, Request, Scored, Token
from tinyt.runtime.generate import LanguageModel
from tinyt.runtime.seq2seq_engine import Seq2SeqEngine

from .answers import (
    Event,
    Job,
    Sample,
    choice,
    finish_reason,
    grammar_failed,
    logprobs_of,
    usage,
)
from .chat import compile_template, reads_tools, render_chat, template_source
from .embeddings import Embedder, embedding_answer
from .logprobs import TokenTexts
from .metrics import CONTENT_TYPE, Metrics
from .schema import (
    COMPLETION_MAX_TOKENS,
    DETOKENIZE_FIELDS,
    EMBEDDING_FIELDS,
    TOKENIZE_FIELDS,
    Outputs,
    check_prompt,
    completion_prompts,
    embedding_inputs,
    embedding_options,
    field,
    outputs,
    parse_body,
    sampling,
    stream_options,
)
from .seq2seq_jobs import SEQ2SEQ_FIELDS, seq2seq_jobs
from .streaming import ChunkStream
from .structured import Structure, structure, tool_message

RETRY_AFTER_S = 1
STOP_TIMEOUT_S = 30.0  # what runs at shutdown gets this long to finish


def busy(e: QueueFull) -> ApiError:
    """A full queue as OpenAI's 429, with Retry-After."""
    return ApiError(429, f"the server is busy: {e}; retry after {RETRY_AFTER_S} s",
                    kind="rate_limit_error", headers={"Retry-After": str(RETRY_AFTER_S)})


def authorize(api_key: str | None, request: HttpRequest) -> None:
    """Nothing without an API key; else 'Authorization: Bearer KEY' or a 401."""
    if api_key is None:
        return
    given = request.headers.get("authorization", "")
    if given != f"Bearer {api_key}":
        raise ApiError(401, "a valid API key is required: send 'Authorization: Bearer "
                            "KEY'" if not given else "the API key is not valid",
                       kind="authentication_error")


class OpenAIServer:
    """The handlers of one server over `engine` (started and stopped with the app): a
    LanguageModel and its Engine, a Seq2SeqModel and its Seq2SeqEngine, or an Encoder and its
    Embedder."""

    def __init__(self, lm: LanguageModel | Seq2SeqModel | Encoder,
                 engine: Engine | Seq2SeqEngine | Embedder, *, model_id: str,
                 api_key: str | None = None):
        self.lm, self.engine, self.model_id, self.api_key = lm, engine, model_id, api_key
        self.embedder = engine if isinstance(engine, Embedder) else None
        self.seq2seq = isinstance(lm, Seq2SeqModel)
        self.metrics = Metrics(engine)
        source = None if self.embedder else lm.tokenizer.chat_template
        self.template = compile_template(source)
        self.tool_template = compile_template(source, tools=True)  # HF's 'tool_use' if named
        self.template_reads_tools = reads_tools(template_source(source, tools=True))
        self.texts = None if self.embedder else TokenTexts(lm.tokenizer)
        # the tokens one input or sequence (an encoder-decoder's: its target) may hold:
        # /v1/models' max_model_len
        self.context = self.embedder.max_length if self.embedder else lm.context
        self.ready = False  # the engine runs: /health answers 200

    def app(self) -> Starlette:
        """The Starlette application routing to this server's handlers."""
        app = Starlette(routes=[
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/embeddings", self.embeddings, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
            Route("/tokenizer_info", self.tokenizer_info, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.prometheus, methods=["GET"]),
        ], lifespan=self.lifespan, exception_handlers={404: self.not_found,
                                                       405: self.not_found})
        app.state.engine, app.state.metrics = self.engine, self.metrics
        return app

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.engine.start()
        self.ready = True
        try:
            yield
        finally:
            self.ready = False
            await asyncio.to_thread(self.engine.stop, timeout=STOP_TIMEOUT_S)

    # -- routes ------------------------------------------------------------------------------
    async def completions(self, request: HttpRequest) -> Response:
        """POST /v1/completions."""
        return await self._answer(request, chat=False)

    async def chat(self, request: HttpRequest) -> Response:
        """POST /v1/chat/completions."""
        return await self._answer(request, chat=True)

    async def models(self, request: HttpRequest) -> Response:
        """GET /v1/models: the one model, with its context."""
        try:
            self.authorize(request)
        except ApiError as e:
            return self.error(e, "models")
        return JSONResponse({"object": "list", "data": [{
            "id": self.model_id, "object": "model", "created": int(time.time()),
            "owned_by": "tinyt", "max_model_len": self.context}]})

    async def embeddings(self, request: HttpRequest) -> Response:
        """POST /v1/embeddings: an encoder's sentence embeddings, OpenAI's shape."""
        try:
            answer = await self.embed(request)
        except ApiError as e:
            return self.error(e, "embeddings")
        self.metrics.answered("embeddings", 200)
        return JSONResponse(answer)

    # -- the tokenizer, as vLLM's server offers it (lm-evaluation-harness's remote tokenizer) --
    async def tokenize(self, request: HttpRequest) -> Response:
        """POST /tokenize {"prompt": str, "add_special_tokens": bool = true}: its token ids."""
        try:
            self.authorize(request)
            self.serves(embeddings=False)
            body = parse_body(await request.body(), self.model_id, accepted=TOKENIZE_FIELDS,
                              model_required=False)
            text = field(body, "prompt", (str,), allowed="a string")
            if text is None:
                raise ApiError(400, "'prompt' is required (a string)", param="prompt")
            special = field(body, "add_special_tokens", (bool,), True, allowed="true or false")
            tok = self.lm.tokenizer
            ids = tok.encode_prompt(text) if special else tok.encode(text)
        except ApiError as e:
            return self.error(e, "tokenize")
        self.metrics.answered("tokenize", 200)
        return JSONResponse({"count": len(ids), "max_model_len": self.context, "tokens": ids})

    async def detokenize(self, request: HttpRequest) -> Response:
        """POST /detokenize {"tokens": [int]}: their text."""
        try:
            self.authorize(request)
            self.serves(embeddings=False)
            body = parse_body(await request.body(), self.model_id, accepted=DETOKENIZE_FIELDS,
                              model_required=False)
            ids = body.get("tokens")
            vocab = self.lm.config.vocab_size
            if not (isinstance(ids, list) and all(
                    isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                    for t in ids)):
                raise ApiError(400, f"'tokens' must be a list of token ids in 0..{vocab - 1}",
                               param="tokens")
        except ApiError as e:
            return self.error(e, "tokenize")
        self.metrics.answered("tokenize", 200)
        return JSONResponse({"prompt": self.lm.tokenizer.decode(ids)})

    async def tokenizer_info(self, request: HttpRequest) -> Response:
        """GET /tokenizer_info: the special tokens, the chat template, the context."""
        try:
            self.authorize(request)
            self.serves(embeddings=False)
        except ApiError as e:
            return self.error(e, "tokenize")
        tok = self.lm.tokenizer
        return JSONResponse({"tokenizer_class": "PreTrainedTokenizerFast",
                             "eos_token": tok.eos_token, "bos_token": tok.bos_token,
                             "pad_token": None, "chat_template": tok.chat_template,
                             "model_max_length": self.context})

    async def health(self, request: HttpRequest) -> Response:
        """GET /health: 200 while the engine runs, else 503."""
        ok = self.ready
        return JSONResponse({"status": "ok" if ok else "unavailable", "model": self.model_id},
                            status_code=200 if ok else 503)

    async def prometheus(self, request: HttpRequest) -> Response:
        """GET /metrics."""
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    async def not_found(self, request: HttpRequest, exc: Exception) -> Response:
        return self.error(ApiError(404, f"no route {request.method} {request.url.path}",
                                   kind="not_found_error"), "other")

    # -- the steps of an answer --------------------------------------------------------------
    def error(self, e: ApiError, endpoint: str) -> JSONResponse:
        """The OpenAI error body of `e`, counted under `endpoint`."""
        self.metrics.answered(endpoint, e.status)
        return JSONResponse({"error": {"message": e.message, "type": e.kind, "param": e.param,
                                       "code": None}}, status_code=e.status, headers=e.headers)

    def authorize(self, request: HttpRequest) -> None:
        authorize(self.api_key, request)

    def serves(self, *, embeddings: bool, chat: bool = False) -> None:
        """Nothing if this server's model does what the route asks; else a 400 naming the
        routes it serves."""
        if self.seq2seq and (embeddings or chat):
            route = "/v1/embeddings" if embeddings else "/v1/chat/completions"
            raise ApiError(400, f"model {self.model_id!r} is an encoder-decoder: it translates or "
                                "summarises a source text (POST /v1/completions, the source as "
                                f"'prompt') and does not serve {route}", param="model")
        if embeddings and self.embedder is None:
            raise ApiError(400, f"model {self.model_id!r} is a language model: it generates text "
                                "(POST /v1/completions, /v1/chat/completions) and makes no "
                                "embeddings; serve an encoder artifact for /v1/embeddings",
                           param="model")
        if not embeddings and self.embedder is not None:
            raise ApiError(400, f"model {self.model_id!r} is an encoder: it makes sentence "
                                "embeddings (POST /v1/embeddings) and generates no text; serve "
                                "a language model for completions and chat", param="model")

    async def read_body(self, request: HttpRequest) -> dict:
        return parse_body(await request.body(), self.model_id,
                          **({"accepted": SEQ2SEQ_FIELDS} if self.seq2seq else {}))

    def prompts(self, body: dict, *, chat: bool, tools: list | None = None
                ) -> list[str | list[int]]:
        """The prompts of a request: its 'prompt' (texts or token ids), or its 'messages'
        rendered (with `tools`, OpenAI's list, where the request offers some)."""
        if not chat:
            return completion_prompts(body, self.lm.config.vocab_size)
        template = self.tool_template if tools else self.template
        if template is None:
            raise ApiError(400, f"{self.model_id} has no chat template (tokenizer_config.json's "
                                "chat_template); use /v1/completions", param="messages")
        return [render_chat(template, body.get("messages"), self.lm.tokenizer, tools=tools,
                            template_reads_tools=self.template_reads_tools)]

    def grammar(self, wanted: Structure) -> Grammar:
        """The compiled grammar of a request's structure (a 400 naming the field if it cannot
        be followed); run off the event loop: a first compile may take a fraction of a
        second, and the tokenizer's vocabulary ~1 s at the first structured request."""
        try:
            constrainer = Constrainer.of(self.lm.tokenizer)
        except ConfigError as e:
            raise ApiError(400, str(e), param=wanted.param.split(".")[0]) from None
        return wanted.grammar(constrainer)

    def jobs(self, prompts: list[str | list[int]], body: dict, default_max: int,
             want: Outputs, grammar: Grammar | None = None) -> list[Job]:
        """best_of Jobs per prompt (its ids, checked against the context, and its settings;
        with a seed, sample k draws from seed + k, so the samples differ and each is
        reproducible; each follows `grammar` where given, with a constraint of its own)."""
        out = []
        for i, prompt in enumerate(prompts):
            ids = check_prompt(prompt if isinstance(prompt, list) else
                               self.lm.tokenizer.encode_prompt(prompt), self.lm.context)
            params = sampling(body, len(ids), self.lm.context, default_max, echo=want.echo)
            echo = "" if not want.echo else prompt if isinstance(prompt, str) else \
                self.lm.tokenizer.decode(ids)
            # best_of ranks samples by their tokens' logprobs: computed even when not shown
            logprobs = want.logprobs if want.logprobs is not None else \
                0 if want.best_of > want.n else None
            for k in range(want.best_of):
                seeded = params if k == 0 or params.seed is None else \
                    replace(params, seed=params.seed + k)
                out.append(Job(ids, seeded, i, echo, logprobs,
                               want.logprobs if want.echo else None,
                               None if grammar is None else grammar.constraint()))
        return out

    def submit_all(self, jobs: list[Job], loop: asyncio.AbstractEventLoop,
                   queue: asyncio.Queue) -> list[Request]:
        """Every job submitted, its events put on `queue` from the engine's thread; a full
        queue cancels those already in and is a 429 with Retry-After."""
        reqs: list[Request] = []
        try:
            with self.engine.together():  # one step admits them: a shared prompt runs once
                for i, job in enumerate(jobs):
                    reqs.append(self.engine.submit(
                        job.ids, job.params, logprobs=job.logprobs,
                        prompt_logprobs=job.prompt_logprobs, **job.options,
                        listener=lambda ev, i=i: loop.call_soon_threadsafe(queue.put_nowait,
                                                                           (i, ev)),
                        **({} if job.constraint is None else {"constraint": job.constraint})))
        except QueueFull as e:
            for r in reqs:
                r.cancel()
            raise busy(e) from None
        for job in jobs:
            self.metrics.prompt_tokens.inc(len(job.ids))
        return reqs

    async def events(self, jobs: list[Job]) -> AsyncGenerator[Event, None]:
        """(choice index, event) as the engine makes them; cancels what runs if abandoned."""
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        reqs = self.submit_all(jobs, loop, queue)
        last, seen = [r.submitted for r in reqs], [0] * len(reqs)
        remaining = len(reqs)
        try:
            while remaining:
                i, ev = await queue.get()
                if isinstance(ev, Token):
                    self.metrics.token(ev.at - last[i], first=not seen[i])
                    last[i], seen[i] = ev.at, seen[i] + 1
                elif isinstance(ev, Done):
                    remaining -= 1
                yield i, ev
        finally:  # a disconnect or a finished response: nothing keeps running for it
            for r in reqs:
                r.cancel()

    async def _answer(self, request: HttpRequest, *, chat: bool) -> Response:
        endpoint = "chat" if chat else "completions"
        try:
            return await self.generate(request, chat=chat)
        except ApiError as e:
            return self.error(e, endpoint)
        except ValueError as e:  # the runtime's own checks of what it was given
            return self.error(ApiError(400, str(e)), endpoint)

    async def generate(self, request: HttpRequest, *, chat: bool) -> Response:
        """A completion or chat completion, whole or streamed; ApiError for a bad request."""
        self.authorize(request)
        self.serves(embeddings=False, chat=chat)
        body = await self.read_body(request)
        stream, include_usage = stream_options(body)
        want = outputs(body, chat=chat, stream=stream)
        if self.seq2seq:
            jobs, calls = seq2seq_jobs(self.lm, body, want), False
        else:
            jobs, calls = await self.decoder_jobs(body, chat=chat, want=want)
        head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}",
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": self.model_id}
        # usage counts each prompt once, however many samples share it (as OpenAI's does)
        prompt_tokens = sum(len(j.ids) for j in jobs if j is self._first_of(jobs, j.prompt))
        if not stream:
            return await self.complete(jobs, head, chat=chat, want=want,
                                       prompt_tokens=prompt_tokens, calls=calls)
        return await self.stream(jobs, head, chat=chat, want=want, include_usage=include_usage,
                                 prompt_tokens=prompt_tokens, calls=calls)

    async def decoder_jobs(self, body: dict, *, chat: bool, want: Outputs
                           ) -> tuple[list[Job], bool]:
        """A decoder's Jobs of a request, and whether they follow a tools grammar."""
        wanted, tools = structure(body, chat=chat)
        if wanted is not None and body.get("min_tokens"):  # end-of-text may be all it allows
            raise ApiError(400, f"min_tokens cannot be combined with {wanted.param.split('.')[0]}"
                                ": the grammar decides where the reply ends", param="min_tokens")
        prompts = self.prompts(body, chat=chat, tools=tools)
        grammar = None if wanted is None else await asyncio.to_thread(self.grammar, wanted)
        jobs = self.jobs(prompts, body, self.lm.context if chat else COMPLETION_MAX_TOKENS,
                         want, grammar)
        return jobs, wanted is not None and wanted.kind == "tools"

    @staticmethod
    def _first_of(jobs: list[Job], prompt: int) -> Job:
        return next(j for j in jobs if j.prompt == prompt)

    async def complete(self, jobs: list[Job], head: dict, *, chat: bool, want: Outputs,
                       prompt_tokens: int, calls: bool = False) -> JSONResponse:
        """The whole answer once every sample is done (a failed generation: 500; a grammar
        that failed mid-way: 400); with best_of, each prompt's n samples of the highest total
        logprob. calls: the samples were made under a tools grammar (message.tool_calls)."""
        texts = self.texts
        assert texts is not None  # a language model's server
        samples = [Sample() for _ in jobs]
        async for i, ev in self.events(jobs):
            if isinstance(ev, Token):
                samples[i].tokens.append(ev)
            elif isinstance(ev, Scored):
                samples[i].prompt = ev.prompt
            else:
                if ev.finish_reason == "error":
                    raise ApiError(500, f"generation failed: {ev.error}", kind="server_error")
                samples[i].done = ev
        for job in jobs:
            if job.constraint is not None and job.constraint.error is not None:
                raise grammar_failed(job.constraint.error, calls)
        choices = []
        for p in range(len(jobs) // want.best_of):
            mine = list(range(p * want.best_of, (p + 1) * want.best_of))
            if want.best_of > want.n:  # the n most likely, in the order they were made
                mine = sorted(sorted(mine, key=lambda i: -samples[i].score())[:want.n])
            for k, i in enumerate(mine):
                job, sample = jobs[i], samples[i]
                assert sample.done is not None  # events() ends when every job is done
                lps = None if want.logprobs is None else \
                    logprobs_of(texts, chat, job, sample.prompt, sample.tokens)
                reason, message = finish_reason(sample.done.finish_reason), None
                if calls:
                    message, called = tool_message(sample.done.text)
                    reason = "tool_calls" if called and reason == "stop" else reason
                choices.append(choice(chat, p * want.n + k, job.echo + sample.done.text,
                                      reason, lps, message))
        self.metrics.answered("chat" if chat else "completions", 200)
        made = sum(len(s.tokens) for s in samples)
        return JSONResponse({**head, "choices": choices, "usage": usage(prompt_tokens, made)})

    async def stream(self, jobs: list[Job], head: dict, *, chat: bool, want: Outputs,
                     include_usage: bool, prompt_tokens: int, calls: bool = False
                     ) -> StreamingResponse:
        """Server-sent chunks as tokens come (echo: the prompt first), a usage chunk if asked
        for, then [DONE]. The first event is awaited here, so a full queue is a 429, not a
        broken stream. (best_of > n does not stream: schema.outputs refuses it.) calls: a
        tools grammar: text is sent until a call may begin (ToolStream), the calls as one
        tool_calls delta at the end."""
        chunk_head = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}
        events = self.events(jobs)
        first = await events.__anext__()
        texts = self.texts
        assert texts is not None  # a language model's server
        answer = ChunkStream(jobs, chunk_head, chat=chat, want=want, texts=texts, calls=calls)
        self.metrics.answered("chat" if chat else "completions", 200)
        return StreamingResponse(answer.chunks(events, first, include_usage=include_usage,
                                               prompt_tokens=prompt_tokens),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def embed(self, request: HttpRequest) -> dict:
        """The embeddings answer of a request; ApiError for a bad one (429 when max_queue
        requests wait, 500 when the run fails)."""
        self.authorize(request)
        self.serves(embeddings=True)
        embedder = self.embedder
        assert embedder is not None
        body = parse_body(await request.body(), self.model_id, accepted=EMBEDDING_FIELDS)
        texts, ids = embedding_inputs(body, vocab_size=embedder.vocab_size,
                                      max_length=embedder.max_length)
        fmt = embedding_options(body, embedder.dim)
        rows = await asyncio.to_thread(embedder.rows, texts, ids)  # 2048 texts: off the loop
        try:
            future = embedder.submit(rows)
        except QueueFull as e:
            raise busy(e) from None
        tokens = sum(len(r[0]) for r in rows)
        self.metrics.prompt_tokens.inc(tokens)
        try:
            vectors = await asyncio.wrap_future(future)  # cancelled with the request's task
        except Exception as e:
            raise ApiError(500, f"embedding failed: {e}", kind="server_error") from None
        return embedding_answer(vectors, fmt, self.model_id, tokens)



def build_app(lm: LanguageModel | Seq2SeqModel | Encoder,
              engine: Engine | Seq2SeqEngine | Embedder, *, model_id: str,
              api_key: str | None = None) -> Starlette:
    """The Starlette application serving `engine` (started and stopped with the app)."""
    return OpenAIServer(lm, engine, model_id=model_id, api_key=api_key).app()
