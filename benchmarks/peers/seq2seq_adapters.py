"""The encoder-decoder peers' worker side (seq2seq_peers.py starts it): a loader per engine, each
importing its engine's package when called and returning one translator on the same contract,

    translate(sources, n, beams) -> the generated ids of each source (the decoder's start and
                                    the final </s> left out), at most n each, greedy (beams 1)
                                    or beam search keeping `beams`, one call for the batch

and the worker that serves it (protocol.py), one process per (engine, threads):

    python -m tinyt.benchmarks.peers.seq2seq_peers ARTIFACTS --worker SPEC

Every engine gets the settings in the call (max new tokens, beams, no sampling, length penalty
1, no early stop), none from its model's generation_config.json. Sources are token ids with
their </s>; CTranslate2 takes them as its vocabulary's strings.
"""
from __future__ import annotations

import importlib.metadata as md
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .protocol import memory, missing_package, reset_peak, serve, timed

Translate = Callable[[list[list[int]], int, int], list[list[int]]]
VERSIONS = ("tinyt", "onnxruntime", "ctranslate2", "optimum", "optimum-onnx", "transformers",
            "torch", "tokenizers", "numpy")


def _load_tinyt(path: Path, threads: int, **_) -> Translate:
    import numpy as np

    import tinyt.runtime as rt
    from tinyt.runtime.encoder_decoder import DecoderSteps

    model = rt.load(path, threads=threads)

    def translate(sources, n, beams):
        return [r.token_ids for r in model.generate_ids(sources, max_new_tokens=n,
                                                        num_beams=beams)]

    def logits(source, prefix):  # the next token's, after the decoder's start and `prefix`
        steps = DecoderSteps(model, *model.encode([source]))
        z = steps.first(model.generation.decoder_start)
        for tok in prefix:
            z = steps(np.zeros(1, dtype=np.int64), np.array([tok], dtype=np.int64))
        return z[0]
    translate.logits = logits  # type: ignore[attr-defined]
    return translate


def _load_ctranslate2(path: Path, threads: int, **_) -> Translate:
    import ctranslate2 as ct2

    model = ct2.Translator(str(path), device="cpu", intra_threads=threads, inter_threads=1)
    vocab = json.loads((path / "shared_vocabulary.json").read_text(encoding="utf-8"))
    ids = {t: i for i, t in enumerate(vocab)}

    def translate(sources, n, beams):
        out = model.translate_batch([[vocab[i] for i in s] for s in sources], beam_size=beams,
                                    max_decoding_length=n, length_penalty=1.0)
        return [[ids[t] for t in r.hypotheses[0]] for r in out]
    return translate


def _generate(model, torch, eos: int) -> Translate:
    """transformers' generate (PyTorch's model or Optimum's) on a batch of equal-length or
    right-padded sources: the tokens after the decoder's start, up to the first </s>."""
    def translate(sources, n, beams):
        width = max(map(len, sources))
        ids = torch.tensor([s + [0] * (width - len(s)) for s in sources])
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sources])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=n, num_beams=beams,
                                 do_sample=False, length_penalty=1.0, early_stopping=False,
                                 num_return_sequences=1)
        rows = []
        for row in out[:, 1:].tolist():
            rows.append(row[:row.index(eos)] if eos in row else row)
        return rows
    return translate


def _load_optimum(path: Path, threads: int, **_) -> Translate:
    import torch
    from onnxruntime import SessionOptions
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    opts = SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    torch.set_num_threads(threads)
    model = ORTModelForSeq2SeqLM.from_pretrained(path, session_options=opts,
                                                 provider="CPUExecutionProvider")
    return _generate(model, torch, model.config.eos_token_id)


def _load_transformers(path: Path, threads: int, **_) -> Translate:
    import torch
    from transformers import AutoModelForSeq2SeqLM

    torch.set_num_threads(threads)
    model = AutoModelForSeq2SeqLM.from_pretrained(path, attn_implementation="eager").eval()
    return _generate(model, torch, model.config.eos_token_id)


LOADERS = {"tinyt": _load_tinyt, "ctranslate2": _load_ctranslate2, "optimum": _load_optimum,
           "transformers": _load_transformers}


def worker(spec: dict, loaders: dict | None = None) -> None:
    """Load one engine (spec: loader, path, threads, packages, options), then answer JSON lines
    on stdin until it closes:
    {"op": "translate", "sources", "n", "beams"} -> {"tokens": [[id, ...], ...]};
    {"op": "logits", "source", "prefix", "ids"} -> those ids' next-token logits after the
    decoder's start and prefix, and the largest |logit| (tinyt's engines: the reference);
    {"op": "time", "calls": [{"sources", "n", "beams"}], "settle", "block"} -> seconds per
    call, and the tokens each call's last run made ("made");
    {"op": "memory"}; a Whisper's {"op": "clip", "n"} -> the clip's tokens and how far its
    front end's features are from runtime/audio.log_mel's (and a "time" call may be {"clip":
    "transcript" | "features", "n"}: whisper_adapters.py). loaders: the table spec["loader"]
    names (default LOADERS; the Whisper peers' is whisper_adapters.LOADERS). The hello says
    ready (with the load's time and memory, the peak reset after it so that later it is the
    calls'), a missing package, or the load's error."""
    def load():
        missing = missing_package(spec["packages"])
        if missing:
            return {"missing": missing}, None
        t = time.perf_counter()
        load = (loaders or LOADERS)[spec["loader"]]
        translate = load(Path(spec["path"]), spec["threads"], **spec["options"])
        hello = {"ready": True, "load_s": time.perf_counter() - t, "loaded": memory(),
                 "peak_reset": reset_peak(), "python": sys.executable,
                 "versions": {d: v for d in VERSIONS if (v := _version(d))}}
        return hello, lambda req: _answer(req, translate)
    serve(load)


def _answer(req: dict, translate: Translate) -> dict:
    if req["op"] == "translate":
        return {"tokens": translate(req["sources"], req["n"], req["beams"])}
    if req["op"] == "clip":  # a Whisper's clip: its tokens, its features against log_mel's
        if not hasattr(translate, "clip"):
            return {"tokens": None, "features_vs_log_mel": None}
        return {"tokens": translate.clip(req["n"]),  # type: ignore[attr-defined]
                "features_vs_log_mel": translate.features_vs_log_mel()}  # type: ignore
    if req["op"] == "time":
        times, made = [], []
        for c in req["calls"]:
            last: list = []
            if "clip" in c and not hasattr(translate, "clip"):  # an engine without the clip
                times.append([])
                made.append(0)
                continue

            def call(c=c, last=last):
                last[:] = _call(translate, c)
            times.append(timed(call, req["settle"], req["block"]))
            made.append(sum(map(len, last)))
        return {"times": times, "made": made}
    if req["op"] == "logits":  # two ids' logits after a prefix, and the largest |logit|
        z = translate.logits(req["source"], req["prefix"])  # type: ignore[attr-defined]
        return {"values": [float(z[i]) for i in req["ids"]],
                "magnitude": float(abs(z).max())}
    if req["op"] == "memory":
        return {"memory": memory()}
    return {"error": f"unknown op {req['op']!r}"}


def _call(translate: Translate, c: dict) -> list[list[int]]:
    """One timed call: sources translated, or (a Whisper's) the clip's audio to its transcript
    (c["clip"] "transcript": [its tokens]) or to its features alone ("features": [])."""
    if "clip" not in c:
        return translate(c["sources"], c["n"], c["beams"])
    if c["clip"] == "transcript":
        return [translate.clip(c["n"])]  # type: ignore[attr-defined]
    translate.front_end()  # type: ignore[attr-defined]
    return []


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None
