"""The `tinyt` verbs that run an artifact: serve, generate, translate, classify, embed
(registered on the one app in app/cli.py; transcribe: app/cli_speech.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from tinyt.errors import TinytError


def serve_cmd(
    artifact: Annotated[Path, typer.Argument(help="Causal-LM artifact directory (the "
                                                  "shared-cache pair batches best), an "
                                                  "encoder-decoder's (POST /v1/completions: "
                                                  "the prompt is the source text), or an "
                                                  "encoder's (POST /v1/embeddings), or a "
                                                  "Whisper artifact's (POST /v1/audio/"
                                                  "transcriptions and /translations).")],
    host: Annotated[str, typer.Option(help="Interface to bind (loopback by default).")]
        = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="0: any free port.")] = 8000,
    threads: Annotated[Optional[int], typer.Option(min=1, help="Default: physical cores.")]
        = None,
    max_batch: Annotated[Optional[int], typer.Option(
        min=1, help="Rows in the running batch (default 8); an encoder: inputs per run "
                    "(default 32).")] = None,
    max_queue: Annotated[int, typer.Option(min=1, help="Requests waiting for a row before "
                                                       "429.")] = 64,
    prefill_tokens: Annotated[Optional[int], typer.Option(
        min=1, help="Prompt tokens admitted between two decode steps (at least one "
                    "request's): bounds the running rows' wait (default 64; an "
                    "encoder-decoder's source tokens: 512).")] = None,
    prefill_chunk: Annotated[Optional[int], typer.Option(
        min=1, help="Prompts in pieces of N tokens, one piece between two decode steps "
                    "(shared-cache graphs): the running rows wait for one piece at most.")]
        = None,
    api_key: Annotated[Optional[str], typer.Option(
        help="Require 'Authorization: Bearer KEY' (default: $TINYT_API_KEY, else none).",
        envvar="TINYT_API_KEY")] = None,
    model_id: Annotated[Optional[str], typer.Option(
        help="The model name clients send (default: the artifact directory's name).")] = None,
    max_context: Annotated[Optional[int], typer.Option(
        min=2, help="Tokens per request, prompt + generated (default: the model's context, at "
                    "most 4096). The engine's KV cache is --max-batch rows of it, allocated at "
                    "start; refused there if it does not fit the machine's memory. "
                    "GET /v1/models reports it as max_model_len.")] = None,
    prefix_cache_mb: Annotated[Optional[int], typer.Option(
        min=0, help="MiB of recent prompts' and finished sequences' keys and values kept, so "
                    "a prompt starting with them copies their rows instead of computing them "
                    "(default 256 where that is exact: shared-cache graphs whose prompt graph "
                    "has no per-tensor activation scales; 0: off).")] = None,
    ray: Annotated[bool, typer.Option(
        "--ray", help="Serve on Ray Serve replicas behind Ray's HTTP proxy (the ray extra; "
                      "docs/serving.md): the same routes.")] = False,
    ray_address: Annotated[Optional[str], typer.Option(
        help="--ray: the cluster to join (ray://HOST:10001 or HOST:6379; default: a new local "
             "one).")] = None,
    replicas: Annotated[Optional[int], typer.Option(min=1, help="--ray: replicas (default 1).")]
        = None,
    min_replicas: Annotated[Optional[int], typer.Option(
        min=0, help="--ray: autoscale on ongoing requests from this many...")] = None,
    max_replicas: Annotated[Optional[int], typer.Option(min=1, help="...to this many.")] = None,
    proxy_on: Annotated[str, typer.Option(help="--ray: Ray's HTTP proxy on the 'head' node or "
                                               "on 'every-node'.")] = "head",
) -> None:
    """Serve ARTIFACT over an OpenAI-compatible HTTP API with continuous batching (no torch
    needed; the `serve` extra; --ray: on Ray Serve replicas, the `ray` extra)."""
    try:
        from tinyt.server import serve
    except ImportError as e:
        raise TinytError(f"tinyt serve needs the serve extra ({e.name} is missing): pip install "
                         "'tinyt[cpu,serve]'") from None
    if api_key is not None and not api_key.strip():
        raise TinytError("--api-key is empty; give a key or leave the option out")
    engine = dict(threads=threads, max_batch=max_batch, max_queue=max_queue,
                  prefill_tokens=prefill_tokens, prefill_chunk=prefill_chunk,
                  max_context=max_context, api_key=api_key, model_id=model_id,
                  prefix_cache_mb=prefix_cache_mb)
    ray_options = dict(ray_address=ray_address, replicas=replicas, min_replicas=min_replicas,
                       max_replicas=max_replicas)
    if not ray:
        given = [f"--{k.replace('_', '-')}" for k, v in ray_options.items() if v is not None]
        if given:
            raise TinytError(f"{', '.join(given)} only apply with --ray")
        serve(artifact, host=host, port=port, **engine)
        return
    _serve_on_ray(artifact, host=host, port=port, proxy_on=proxy_on, engine=engine,
                  **ray_options)


def _serve_on_ray(artifact: Path, *, ray_address: Optional[str], engine: dict, **how) -> None:
    """`tinyt serve --ray`: server/ray_serve.py, once the ray extra is found."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise TinytError("tinyt serve --ray needs the ray extra (ray is missing): pip install "
                         "'tinyt[cpu,ray]'")
    from tinyt.server.ray_serve import serve_on_ray

    serve_on_ray(artifact, address=ray_address, **how, **engine)


def generate_cmd(
    artifact: Annotated[Path, typer.Argument(help="Causal-LM artifact directory.")],
    prompt: Annotated[str, typer.Argument(help="Text to continue.")],
    max_new_tokens: Annotated[int, typer.Option(min=0)] = 64,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.8,
    top_k: Annotated[Optional[int], typer.Option(min=1)] = 50,
    top_p: Annotated[Optional[float], typer.Option()] = None,
    repetition_penalty: Annotated[float, typer.Option()] = 1.0,
    stop: Annotated[Optional[list[str]], typer.Option(help="Stop string (repeatable).")] = None,
    seed: Annotated[Optional[int], typer.Option(min=0)] = None,
    provider: Annotated[str, typer.Option(help="cpu, cuda, tensorrt or auto.")] = "cpu",
    threads: Annotated[Optional[int], typer.Option(min=1, help="Default: physical cores.")]
        = None,
    tune: Annotated[bool, typer.Option(
        help="Shared-cache artifacts: time each phase's threads and graph at load and keep "
             "the fastest of those at least as accurate as the defaults (--no-tune: every "
             "phase at exactly --threads).")] = True,
    tune_speed: Annotated[bool, typer.Option(
        "--tune-speed", help="With tuning: decode through a pair's prompt graph when faster "
                             "even if its accuracy report is worse.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v",
                                          help="Say what each phase runs with.")] = False,
    max_context: Annotated[Optional[int], typer.Option(
        min=2, help="Tokens the sequence may hold, prompt + generated (default: the model's "
                    "context); the KV buffers hold what this call reaches either way.")] = None,
    logprobs: Annotated[Optional[int], typer.Option(
        min=0, max=20, help="Print one JSON object instead of the text: the continuation, its "
                            "finish reason and each token with its log-probability and the N "
                            "most likely tokens there.")] = None,
    json_schema: Annotated[Optional[Path], typer.Option(
        help="A JSON Schema file: the continuation is compact JSON valid under it "
             "(constrained decoding; needs llguidance, the serve or structured extra).")]
        = None,
) -> None:
    """Stream a continuation of PROMPT with ONNX Runtime (no torch needed)."""
    import tinyt.runtime as rt

    if tune_speed and not tune:
        raise TinytError("--tune-speed times the graphs; it cannot go with --no-tune")
    lm = rt.load(artifact, provider=provider, threads=threads,
                 tune="speed" if tune_speed else tune, max_context=max_context)
    _refuse_speech(lm, artifact)
    if isinstance(lm, rt.Seq2SeqModel):
        raise TinytError(f"{artifact} is an encoder-decoder (seq2seq); use 'tinyt translate "
                         f"{artifact} TEXT'")
    if not isinstance(lm, rt.LanguageModel):
        encoder = isinstance(lm, rt.Encoder)
        raise TinytError(f"{artifact} is {'an encoder' if encoder else 'a classifier'}; use "
                         f"'tinyt {'embed' if encoder else 'classify'}'")
    if provider == "auto" or verbose:
        typer.echo(f"provider: {lm.provider}", err=True)
    if verbose and lm.plan is not None:
        typer.echo(f"plan: {lm.plan.describe()}; measured ms: {lm.plan.measured_ms}", err=True)
    schema = None
    if json_schema is not None:
        try:
            schema = json.loads(json_schema.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise TinytError(f"--json-schema {json_schema}: not a readable JSON file ({e})") \
                from None
    settings = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                    top_p=top_p, repetition_penalty=repetition_penalty, stop=stop or (),
                    seed=seed, **({} if schema is None else {"json_schema": schema}))
    if logprobs is not None:
        (r,) = lm.generate_details([prompt], logprobs=logprobs, **settings)
        text = lm.tokenizer.decode

        def one(token: int, value: float) -> dict:
            return {"id": token, "text": text([token]), "logprob": value}
        typer.echo(json.dumps({"text": r.text, "finish_reason": r.finish_reason, "tokens": [
            {**one(lp.token, lp.logprob), "top": [one(t, v) for t, v in lp.top]}
            for lp in r.logprobs or []]}, ensure_ascii=False))
        return
    pieces = lm.stream(prompt, **settings)
    typer.echo(prompt, nl=False)
    for piece in pieces:
        typer.echo(piece, nl=False)
    typer.echo()


def _texts(texts, file, verb: str) -> list[str]:
    """The TEXT arguments, then --file's lines; a clear error where there are none."""
    items = list(texts or [])
    if file is not None:
        try:
            items += file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise TinytError(f"--file {file}: cannot read it as UTF-8 text ({e})") from None
    if not items:
        raise TinytError(f"nothing to {verb}: give TEXT arguments or --file")
    return items


def translate_cmd(
    artifact: Annotated[Path, typer.Argument(help="Encoder-decoder (seq2seq) artifact "
                                                  "directory.")],
    texts: Annotated[Optional[list[str]], typer.Argument(help="Texts to translate.")] = None,
    file: Annotated[Optional[Path], typer.Option(
        "--file", help="Translate each line of this UTF-8 file (after any TEXTs).")] = None,
    tgt_lang: Annotated[Optional[str], typer.Option(
        help="Target language of a multilingual model, as its tokenizer spells it (NLLB: "
             "deu_Latn; M2M100: de or __de__).")] = None,
    beams: Annotated[int, typer.Option(min=1, help="Beam search width (1: greedy).")] = 1,
    max_new_tokens: Annotated[Optional[int], typer.Option(
        min=0, help="Tokens per output (default: the model's generation_config max_length, "
                    "at most its block_size).")] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Texts per run.")] = 16,
    provider: Annotated[str, typer.Option(help="cpu, cuda, tensorrt or auto.")] = "cpu",
    threads: Annotated[Optional[int], typer.Option(min=1, help="Default: physical cores.")]
        = None,
) -> None:
    """Print each TEXT's translation (or summary) on a line of its own (a newline inside one
    is written as \\n), with ONNX Runtime (no torch needed)."""
    import tinyt.runtime as rt

    items = _texts(texts, file, "translate")
    model = rt.load(artifact, provider=provider, threads=threads)
    _refuse_speech(model, artifact)
    if not isinstance(model, rt.Seq2SeqModel):
        raise TinytError(f"{artifact} is not an encoder-decoder; use 'tinyt " + (
            "generate" if isinstance(model, rt.LanguageModel) else "embed"
            if isinstance(model, rt.Encoder) else "classify") + "'")
    for i in range(0, len(items), batch_size):
        for text in model.generate(items[i:i + batch_size], num_beams=beams,
                                   max_new_tokens=max_new_tokens, tgt_lang=tgt_lang):
            typer.echo(text.replace("\n", "\\n"))


def classify_cmd(
    artifact: Annotated[Path, typer.Argument(help="Classifier artifact directory.")],
    texts: Annotated[list[str], typer.Argument(help="Texts to classify.")],
    provider: Annotated[str, typer.Option(help="cpu, cuda, tensorrt or auto.")] = "cpu",
) -> None:
    """Label each TEXT with the classifier, with its probability."""
    import tinyt.runtime as rt

    clf = rt.load(artifact, provider=provider)
    _refuse_speech(clf, artifact)
    if isinstance(clf, rt.TokenClassifier):  # a label per token: one line each
        for text, tokens in zip(texts, clf.tag(texts)):
            typer.echo(f"{text!r}")
            for t in tokens:
                typer.echo(f"  {t.token}\t{t.label}\t{t.probability:.3f}\t{t.start}:{t.end}")
        return
    if not isinstance(clf, rt.Classifier):
        encoder = isinstance(clf, rt.Encoder)
        verb = "embed" if encoder else "translate" if isinstance(clf, rt.Seq2SeqModel) \
            else "generate"
        raise TinytError(f"{artifact} is not a classifier; use 'tinyt {verb}'")
    preds = clf.classify(texts)
    for text, p in zip(texts, preds):
        short = text if len(text) <= 40 else text[:37] + "..."
        typer.echo(f"{p.label}\t{p.probabilities[p.label]:.3f}\t{short!r}")


def embed_cmd(
    artifact: Annotated[Path, typer.Argument(help="Encoder artifact directory.")],
    texts: Annotated[Optional[list[str]], typer.Argument(help="Texts to embed.")] = None,
    file: Annotated[Optional[Path], typer.Option(
        "--file", help="Embed each line of this UTF-8 file (after any TEXTs).")] = None,
    normalize: Annotated[Optional[bool], typer.Option(
        "--normalize/--no-normalize", help="Scale to unit length (default: the model's own "
                                           "choice).")] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Texts per run.")] = 32,
    provider: Annotated[str, typer.Option(help="cpu, cuda, tensorrt or auto.")] = "cpu",
    threads: Annotated[Optional[int], typer.Option(min=1, help="Intra-op threads (default: "
                                                              "the physical cores).")] = None,
) -> None:
    """Print each text's sentence embedding as a JSON line: {"text", "embedding"}."""
    import json

    import tinyt.runtime as rt

    items = _texts(texts, file, "embed")
    enc = rt.load(artifact, provider=provider, threads=threads)
    _refuse_speech(enc, artifact)
    if not isinstance(enc, rt.Encoder):
        verb = "classify" if isinstance(enc, rt.Classifier) else "translate" \
            if isinstance(enc, rt.Seq2SeqModel) else "generate"
        raise TinytError(f"{artifact} is not an encoder; use 'tinyt {verb}'")
    vectors = enc.embed(items, normalize=normalize, batch_size=batch_size)
    for text, v in zip(items, vectors):
        typer.echo(json.dumps({"text": text, "embedding": [float(x) for x in v]},
                              ensure_ascii=False))


def _refuse_speech(model, artifact: Path) -> None:
    """A Whisper artifact given to a text verb: the verb that takes it, by name."""
    import tinyt.runtime as rt

    if isinstance(model, rt.SpeechModel):
        raise TinytError(f"{artifact} is a speech (Whisper) artifact; use 'tinyt transcribe "
                         f"{artifact} FILE'")
