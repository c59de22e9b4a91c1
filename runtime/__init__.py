"""tinyt.runtime: run tinyt artifacts on ONNX Runtime, without torch.

    import tinyt.runtime as rt
    lm = rt.load("artifacts/onnx-int8", provider="cpu", threads=2)
    lm.generate("def fibonacci(n):", max_new_tokens=64, temperature=0.8, top_k=50, seed=0)
    for piece in lm.stream("import os\\n", max_new_tokens=32): print(piece, end="")
    clf = rt.load("artifacts/clf-onnx"); clf.classify(["import asyncio ...", "..."])
    mt = rt.load("artifacts/opus-mt-onnx"); mt.generate(["Hello."], num_beams=4)
    asr = rt.load("artifacts/whisper-onnx"); asr.transcribe("talk.wav", timestamps=True).text

Loading checks every file against manifest.json (a changed or truncated file is refused, by
name) and opens a session on exactly the requested provider: one that is missing or fails to
initialise is an error that lists what is available, never a silent fallback to CPU.
"""
from __future__ import annotations

import os

from tinyt.contract import CLASSIFIER, ENCODER, SEQ2SEQ, SHARED_CACHE_KIND, TOKEN_CLASSIFIER
from tinyt.errors import ConfigError
from tinyt.manifest import ManifestError
from tinyt.tokenizer import Tokenizer

from .classify import Classifier, Prediction, TokenClassifier, TokenLabel
from .embed import Encoder
from .encoder_decoder import Seq2SeqModel, load_seq2seq
from .generate import GenerationResult, LanguageModel
from .sampling import SamplingParams
from .session import (
    PROVIDERS,
    ProviderError,
    create_session,
    installation_problems,
    open_artifact,
    resolve_threads,
    return_freed_memory,
)
from .transcribe import Segment, SpeechModel, Transcription, load_speech_model
from .tuning import Plan, check_tune, plan_sessions

__all__ = ["load", "LanguageModel", "Classifier", "Encoder", "TokenClassifier", "TokenLabel",
           "Seq2SeqModel", "SpeechModel", "Transcription", "Segment", "GenerationResult",
           "Prediction", "SamplingParams", "Plan",
           "ProviderError", "PROVIDERS", "installation_problems"]


def load(path: str | os.PathLike, *, provider: str = "cpu", threads: int | None = None,
         spinning: bool | None = None, level: str | None = None,
         io_binding: bool | None = None, tune: bool | str = True,
         max_context: int | None = None
         ) -> LanguageModel | Classifier | Encoder | Seq2SeqModel | SpeechModel:
    """Open an artifact directory: a LanguageModel for decoder graphs, a Classifier for
    classifier graphs, an Encoder (sentence embeddings) for encoder graphs, a Seq2SeqModel
    (translation, summarisation) for an encoder-decoder's three graphs, a SpeechModel
    (transcribe) for a Whisper artifact's. threads defaults
    to the physical cores; spinning to on when there is
    more than one thread (see session_options); level to the artifact's own; io_binding (KV
    cache kept on the provider's device between steps) to on for accelerators, off for CPU.

    A shared-cache artifact on CPU takes `threads` as a budget: with tune=True (default) it
    times, at load and on this CPU, decode steps at 1 thread and at `threads`, and a pair's
    prompt graph against its step graph, and keeps the fastest for each phase (runtime/tuning.py;
    the choice is in LanguageModel.plan). The prompt graph decodes only if its accuracy report
    is at least as good as the step graph's; tune="speed" lifts that rule. tune=False: every
    phase at exactly `threads`.

    max_context: the most tokens (prompt + generated) a sequence may hold, at most the model's
    own (LanguageModel.context = min(max_context, block_size)); an int >= 2, None for the
    model's. Generation allocates KV buffers for what each call can reach either way; this
    bounds what a caller may ask for, and the engine's cache (max_batch rows x context); an
    encoder-decoder's: the decoder's positions. io_binding applies to decoder-only artifacts
    (an encoder-decoder's caches are numpy arrays between steps)."""
    if max_context is not None and not (isinstance(max_context, int)
                                        and not isinstance(max_context, bool)
                                        and max_context >= 2):
        raise ConfigError(f"max_context={max_context!r} is invalid: an integer >= 2 (a prompt "
                          "token and one to follow), or None for the model's context")
    check_tune(tune)
    artifact = open_artifact(path)
    threads = resolve_threads(threads)  # checked and defaulted here, once
    if artifact.kind == SEQ2SEQ:
        speech = artifact.config.n_mels is not None  # Whisper
        if io_binding:
            what = "a speech (Whisper) artifact" if speech else "an encoder-decoder"
            raise ConfigError(f"io_binding=True: {artifact.path} is {what}, whose caches are "
                              "reordered as numpy arrays between steps; leave io_binding out")
        load_pair = load_speech_model if speech else load_seq2seq
        model = load_pair(artifact, _tokenizer(artifact), provider=provider, threads=threads,
                          spinning=spinning, level=level, max_context=max_context)
        return_freed_memory()
        return model
    if artifact.kind == SHARED_CACHE_KIND and provider == "cpu":
        plan, session, prefill = plan_sessions(artifact, threads=threads, spinning=spinning,
                                               level=level, tune=tune)
    else:
        plan, session = None, create_session(artifact, provider=provider, threads=threads,
                                             spinning=spinning, level=level)
        prefill = None if artifact.prefill_file is None else create_session(
            artifact, provider=provider, threads=threads, spinning=spinning, level=level,
            graph=artifact.prefill_file, phase="prompt")
    tokenizer = _tokenizer(artifact)
    # what the loads (the tuner's unkept sessions, the tokenizer's parsed JSON: 14 of its 30 MB
    # at SmolLM2's 49,152 entries) freed
    return_freed_memory()
    if artifact.kind == CLASSIFIER:
        return Classifier(artifact, session, tokenizer)
    if artifact.kind == ENCODER:
        return Encoder(artifact, session, tokenizer)
    if artifact.kind == TOKEN_CLASSIFIER:
        return TokenClassifier(artifact, session, tokenizer)
    return LanguageModel(artifact, session, tokenizer, io_binding=io_binding,
                         prefill_session=None if prefill is session else prefill, plan=plan,
                         max_context=max_context)


def _tokenizer(artifact) -> Tokenizer:
    """The artifact's tokenizer, refused if it has ids the model does not."""
    tokenizer = Tokenizer.from_file(artifact.path / "tokenizer.json")
    if tokenizer.vocab_size > artifact.config.vocab_size:
        raise ManifestError(f"{artifact.path}/tokenizer.json has {tokenizer.vocab_size} tokens but "
                            f"config.json's vocab_size is {artifact.config.vocab_size}: the "
                            "tokenizer does not belong to this model")
    return tokenizer
