"""`tinyt serve`: an OpenAI-compatible HTTP server over the continuous-batching engine
(torch-free; the `serve` extra: starlette, uvicorn, prometheus-client, jinja2).

    HTTP (starlette + uvicorn) ── validate ──▶ Engine.submit (runtime/engine.py) ──▶ events
      POST /v1/completions        prompt (str | [str]), max_tokens, temperature, top_p, top_k,
                                  stop, seed, stream (server-sent events ending [DONE]),
                                  response_format (json_object | json_schema)
      POST /v1/chat/completions   messages through the artifact's chat template; tools,
                                  tool_choice, parallel_tool_calls (message.tool_calls)
    HTTP ── validate (seq2seq_jobs.py) ──▶ Seq2SeqEngine.submit (runtime/seq2seq_engine.py)
      POST /v1/completions        an encoder-decoder's: prompt = the source text(s), tgt_lang
    HTTP ── validate ──▶ Embedder.submit (embeddings.py, an encoder artifact) ──▶ embeddings
      POST /v1/embeddings         input (str | [str] | [int] | [[int]]), encoding_format
                                  (float | base64); requests waiting together share runs
      GET  /v1/models, /health, /metrics (Prometheus)
    HTTP ── multipart (transcriptions.py) ──▶ SpeechModel.transcribe (a Whisper artifact)
      POST /v1/audio/transcriptions, /v1/audio/translations  response_format json, text, srt,
                                  vtt, verbose_json; language, prompt, temperature

    schema.py   the request's fields, checked -> SamplingParams (ApiError names the bad one)
    chat.py     chat templates, compiled and rendered as transformers does (tools too)
    structured.py  response_format and tools -> the grammar each sample follows
                (runtime/constrain.py, llguidance); tool calls parsed, whole or streamed
    embeddings.py  Embedder: the encoder's thread, running the waiting requests together
    metrics.py  the Prometheus registry of one server
    seq2seq_jobs.py  an encoder-decoder's completions request -> its Jobs (tgt_lang)
    transcriptions.py  AudioServer: a Whisper artifact's audio routes
    handlers.py OpenAIServer: the routes' handlers over one model and engine; build_app
    answers.py  a request's Jobs, and OpenAI's choices, chunks, usage, logprobs objects
    streaming.py  ChunkStream: a streamed answer's server-sent chunks as tokens come
    ray_serve.py  `tinyt serve --ray`: these handlers on Ray Serve replicas (load_engine each)

Every failure is an OpenAI-style {"error": {"message", "type", "param", "code"}} with its
status, never a traceback: malformed JSON and wrong types 400, an unknown model 404, a prompt
or max_tokens beyond the context 400 (with the limits), a full queue 429 with Retry-After, a
missing or wrong key 401, a schema that cannot be followed (too large, too deep, a huge
enum, only infinite instances, unsatisfiable, beyond llguidance's limits) 400 naming it.
Fields tinyt cannot honour (suffix, logit_bias, penalties, the legacy functions, ...) are
refused by name rather than ignored. A client that disconnects has its request cancelled
within a step; SIGTERM stops taking requests, finishes what runs and exits 0.
"""
from __future__ import annotations

from tinyt.errors import ConfigError
from tinyt.runtime.engine import Engine
from tinyt.runtime.seq2seq_engine import SOURCE_TOKENS, Seq2SeqEngine

from .embeddings import EMBED_BATCH, Embedder
from .handlers import STOP_TIMEOUT_S, OpenAIServer, build_app
from .transcriptions import AudioServer

__all__ = ["serve", "load_engine", "server_for", "build_app", "OpenAIServer", "Embedder",
           "DEFAULT_CONTEXT"]

# The context a server holds per row unless told (--max-context): the engine allocates its
# cache up front, max_batch rows x the context, so a model's own 131,072 tokens would cost 8
# rows of a Llama-3.2-1B 64 GiB before the first request. 4096 tokens is what a chat
# exchange with a small model uses; a larger --max-context is refused at start where the cache
# does not fit the machine's memory.
DEFAULT_CONTEXT = 4096
DECODER_BATCH = 8  # rows in the running batch unless told (--max-batch)
PREFILL_TOKENS = 64  # a decoder's prompt tokens between two steps unless told (--prefill-tokens)


def serve(artifact, *, host: str = "127.0.0.1", port: int = 8000, threads: int | None = None,
          max_batch: int | None = None, max_queue: int = 64, prefill_tokens: int | None = None,
          prefill_chunk: int | None = None, max_context: int | None = None,
          api_key: str | None = None, model_id: str | None = None,
          spinning: bool | None = None, log_level: str = "info",
          prefix_cache_mb: int | None = None) -> None:
    """Load `artifact` (checked), bind, then serve it until SIGTERM / Ctrl-C (which stop
    taking requests, finish what runs and return). Prints the address it listens on.
    A language model answers completions and chat; an encoder-decoder, completions (the
    prompt is the source text); an encoder, /v1/embeddings.
    max_batch: rows in the running batch (a decoder or encoder-decoder, default
    DECODER_BATCH) or inputs per encoder run (an encoder, default EMBED_BATCH).
    prefill_tokens: prompt tokens admitted between two steps (default PREFILL_TOKENS; an
    encoder-decoder's: source tokens, default SOURCE_TOKENS).
    max_context: tokens per row (prompt + generated), at most the model's; default
    min(block_size, DEFAULT_CONTEXT). GET /v1/models reports it as max_model_len (an
    encoder's: its max_length, the tokens one input may hold).
    spinning: whether ONNX Runtime's workers busy-wait after each run (None: the runtime's
    choice, on with more than one thread; measured at the GPT-2-small shape, 2 threads, off
    cost a single client 38% of its tokens/s and 8 clients 19%)."""
    if not (isinstance(port, int) and 0 <= port <= 65535):
        raise ConfigError(f"port={port!r} must be in 0..65535")
    lm, engine, how = load_engine(artifact, threads=threads, spinning=spinning,
                                  max_batch=max_batch, max_queue=max_queue,
                                  prefill_tokens=prefill_tokens, prefill_chunk=prefill_chunk,
                                  max_context=max_context, prefix_cache_mb=prefix_cache_mb)
    name = model_id or lm.artifact.path.name
    routes = server_for(lm, engine, model_id=name, api_key=api_key, max_queue=max_queue)
    _listen(routes.app(), host, port, name, how, log_level)


def server_for(lm, engine, *, model_id: str, api_key: str | None, max_queue: int = 64
               ) -> OpenAIServer | AudioServer:
    """The routes that serve `lm` (load_engine's): a speech model's audio routes (it has no
    engine), else OpenAI's completions, chat and embeddings over `engine`."""
    if engine is None:
        return AudioServer(lm, model_id=model_id, api_key=api_key, max_queue=max_queue)
    return OpenAIServer(lm, engine, model_id=model_id, api_key=api_key)


def load_engine(artifact, *, threads: int | None = None, spinning: bool | None = None,
                max_batch: int | None = None, max_queue: int = 64,
                prefill_tokens: int | None = None, prefill_chunk: int | None = None,
                max_context: int | None = None, prefix_cache_mb: int | None = None):
    """`artifact` loaded (checked) with the engine that serves it, not yet started, and the
    line that says what it serves: what `serve` runs, and what each replica of
    `tinyt serve --ray` (ray_serve.py) runs. The options are `serve`'s."""
    import tinyt.runtime as rt

    lm = rt.load(artifact, threads=threads, spinning=spinning,
                 max_context=DEFAULT_CONTEXT if max_context is None else max_context)
    if isinstance(lm, rt.SpeechModel):  # transcribed one at a time: no batching engine
        return lm, None, ("speech: POST /v1/audio/transcriptions and /v1/audio/translations, "
                          "one at a time")
    if isinstance(lm, rt.Classifier):
        raise ConfigError(f"{artifact} is a classifier; tinyt serve serves language models, "
                          "encoder-decoders and encoders")
    engine: Engine | Seq2SeqEngine | Embedder
    if isinstance(lm, rt.Seq2SeqModel):
        engine, how = _seq2seq_engine(lm, artifact, max_batch=max_batch, max_queue=max_queue,
                                      prefill_tokens=prefill_tokens, prefill_chunk=prefill_chunk,
                                      prefix_cache_mb=prefix_cache_mb)
    elif isinstance(lm, rt.Encoder):
        given = [flag for flag, value in (("--max-context", max_context),
                                          ("--prefill-chunk", prefill_chunk),
                                          ("--prefix-cache-mb", prefix_cache_mb))
                 if value is not None]
        if given:
            raise ConfigError(f"{artifact} is an encoder: {' and '.join(given)} only apply to a "
                              "language model's context and prompts; an encoder reads at most "
                              f"{lm.max_length} tokens per input (its tokenizer's cut)")
        engine = Embedder(lm, max_batch=EMBED_BATCH if max_batch is None else max_batch,
                          max_queue=max_queue)
        how = (f"an encoder: POST /v1/embeddings, {lm.dim} dimensions, inputs of at most "
               f"{lm.max_length} tokens, {engine.max_batch} inputs per run")
    else:
        engine = Engine(lm, max_batch=DECODER_BATCH if max_batch is None else max_batch,
                        max_queue=max_queue,
                        prefill_tokens=PREFILL_TOKENS if prefill_tokens is None else prefill_tokens,
                        prefill_chunk=prefill_chunk,
                        prefix_cache_bytes=None if prefix_cache_mb is None
                        else prefix_cache_mb << 20)
        how = (f"max batch {engine.max_batch}, context {lm.context} of the model's "
               f"{lm.config.block_size}, " + ("shared-cache batching" if engine.batched else
                                              "a contract graph: rows run one by one")
               + (f", {engine.prefix_cache_bytes >> 20} MiB of kept prefixes"
                  if engine.prefix_cache_bytes else ", no prefix reuse"))
    return lm, engine, how


def _listen(app, host: str, port: int, name: str, how: str, log_level: str) -> None:
    """Bind, say where, and serve `app` until SIGTERM / Ctrl-C."""
    import signal
    import socket
    import sys

    import uvicorn

    try:  # bound here, so a taken port is one clear line and port 0 reports the one it got
        sock = socket.create_server((host, port))
    except OSError as e:
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    bound = sock.getsockname()[1]
    print(f"tinyt serve: {name} on http://{host}:{bound} ({how})", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level,
                                           timeout_graceful_shutdown=int(STOP_TIMEOUT_S)))
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again under the handler
    # it found: with this one that is a no-op, and a deliberate stop exits 0.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    server.run(sockets=[sock])


def _seq2seq_engine(model, artifact, *, max_batch: int | None, max_queue: int,
                    prefill_tokens: int | None, prefill_chunk: int | None,
                    prefix_cache_mb: int | None) -> tuple[Seq2SeqEngine, str]:
    """An encoder-decoder's engine, and the line that says what it serves."""
    given = [flag for flag, value in (("--prefill-chunk", prefill_chunk),
                                      ("--prefix-cache-mb", prefix_cache_mb)) if value is not None]
    if given:
        raise ConfigError(f"{artifact} is an encoder-decoder: {' and '.join(given)} only apply to "
                          "a decoder-only model's prompts; a source is read whole, once, by "
                          "the encoder")
    engine = Seq2SeqEngine(model, max_batch=DECODER_BATCH if max_batch is None else max_batch,
                           max_queue=max_queue,
                           prefill_tokens=SOURCE_TOKENS if prefill_tokens is None
                           else prefill_tokens)
    how = (f"an encoder-decoder: POST /v1/completions, the prompt its source text; max batch "
           f"{engine.max_batch}, sources of at most {model.config.block_size} tokens, "
           f"{model.context} target tokens; rows admitted together share each decoder run")
    return engine, how
