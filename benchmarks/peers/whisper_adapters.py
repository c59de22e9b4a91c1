"""The Whisper peers' worker side (whisper_peers.py starts it): a loader per engine, each importing
its engine's package when called and returning one transcriber on the contract of
seq2seq_adapters.py's translators,

    translate(windows, n, beams) -> the generated ids of each window (the prompt and the final
                                    <|endoftext|> left out), at most n each, greedy (beams 1) or
                                    beam search keeping `beams`, the windows one batch

where a window is the index of a 30-s window of log-mel features [80, 3000] in the features
file the parent wrote (FEATURES: numpy's .npy, read without pickle), so that every engine reads
the same features and no call carries 1 MB of them. The prompt is <|startoftranscript|> <|en|>
<|transcribe|> <|notimestamps|> for all; each engine applies Whisper's suppress_tokens and, at
the first step, begin_suppress_tokens (the space and the end), its own way. Served by
seq2seq_adapters.worker (protocol.py), one process per (engine, threads).
"""
from __future__ import annotations

import json
from pathlib import Path

from . import whisper_cpp
from .seq2seq_adapters import Translate

FEATURES = "features.npy"  # the parent's windows, beside the worker's spec


def _features(spec_features: str):
    import numpy as np

    return np.load(spec_features, allow_pickle=False)


def _load_tinyt(path: Path, threads: int, *, features: str, **_) -> Translate:
    import numpy as np

    import tinyt.runtime as rt
    from tinyt.runtime.encoder_decoder import DecoderSteps

    model, windows = rt.load(path, threads=threads), _features(features)

    def translate(sources, n, beams):
        return model.decode_features(windows[sources], language="en", max_new_tokens=n,
                                     num_beams=beams)

    def logits(source, prefix):  # the next token's after the prompt and `prefix`, unruled
        prompt = model._prefix("en", "transcribe", False)
        steps = DecoderSteps(model.decoder, model.encode(windows[source]), None)
        z = steps.first(prompt)
        for tok in prefix:
            z = steps(np.zeros(1, dtype=np.int64), np.array([tok], dtype=np.int64))
        return z[0]
    translate.logits = logits  # type: ignore[attr-defined]
    return translate


def _prompt(path: Path) -> tuple[list[int], dict]:
    """The prompt's ids and the generation config, from a directory's generation_config.json
    (CTranslate2's conversion keeps none: the parent names ARTIFACTS/hf's)."""
    gen = json.loads((path / "generation_config.json").read_text())
    return [gen["decoder_start_token_id"], gen["lang_to_id"]["<|en|>"],
            gen["task_to_id"]["transcribe"], gen["no_timestamps_token_id"]], gen


def _load_ctranslate2(path: Path, threads: int, *, features: str, hf: str, **_) -> Translate:
    """ctranslate2.models.Whisper.generate with faster-whisper's arguments (faster-whisper's
    transcribe calls it so, after its own feature extraction): suppress_blank (the space and
    the end at the first step), suppress_tokens [-1] (the converted config's list: the
    generation config's suppress_tokens), patience 1, no repetition penalty. It stops after
    max_length // 2 new tokens (OpenAI's sample_len, n_text_ctx // 2), so it is given 2n."""
    import ctranslate2 as ct2

    model = ct2.models.Whisper(str(path), device="cpu", intra_threads=threads, inter_threads=1)
    windows, (prompt, _) = _features(features), _prompt(Path(hf))

    def translate(sources, n, beams):
        out = model.generate(ct2.StorageView.from_array(windows[sources]),
                             [prompt] * len(sources), beam_size=beams, patience=1,
                             length_penalty=1.0, max_length=2 * n, suppress_blank=True,
                             suppress_tokens=[-1])
        return [r.sequences_ids[0][:n] for r in out]  # (the prompt is not in them)
    return translate


def _generate(model, torch, windows) -> Translate:
    """transformers' Whisper generate (PyTorch's model or Optimum's): English, transcribe,
    no timestamps, the generation config's suppressions; it returns the tokens after the
    prompt."""
    def translate(sources, n, beams):
        with torch.no_grad():
            out = model.generate(torch.from_numpy(windows[sources]), max_new_tokens=n,
                                 num_beams=beams, do_sample=False, length_penalty=1.0,
                                 language="en", task="transcribe", return_timestamps=False)
        eos = model.generation_config.eos_token_id
        return [row[:row.index(eos)] if eos in row else row for row in out.tolist()]
    return translate


def _load_optimum(path: Path, threads: int, *, features: str, **_) -> Translate:
    import torch
    from onnxruntime import SessionOptions
    from optimum.onnxruntime import ORTModelForSpeechSeq2Seq

    opts = SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    torch.set_num_threads(threads)
    model = ORTModelForSpeechSeq2Seq.from_pretrained(path, session_options=opts,
                                                     provider="CPUExecutionProvider")
    return _generate(model, torch, _features(features))


def _load_transformers(path: Path, threads: int, *, features: str, **_) -> Translate:
    import torch
    from transformers import WhisperForConditionalGeneration

    torch.set_num_threads(threads)
    model = WhisperForConditionalGeneration.from_pretrained(
        path, attn_implementation="eager").eval()
    return _generate(model, torch, _features(features))


def _load_genai(path: Path, threads: int, *, features: str, hf: str, **_) -> Translate:
    """ONNX Runtime GenAI's Whisper on a directory with its genai_config.json (the model
    builder's, or `tinyt package --format genai`'s), `threads` for both sessions; the
    suppressions through the generator's logits (genai_whisper.genai_generate), exactly n
    tokens (GenAI's min_length), beams by its own beam search."""
    import onnxruntime_genai as og

    from tinyt.export.genai_whisper import genai_generate

    config = og.Config(str(path))
    opts = {"session_options": {"intra_op_num_threads": threads, "inter_op_num_threads": 1}}
    config.overlay(json.dumps({"model": {"encoder": opts, "decoder": opts}}))
    model = og.Model(config)
    name = json.loads((path / "genai_config.json").read_text())["model"]["encoder"][
        "inputs"]["audio_features"]  # the builder's "audio_features", tinyt's "input_features"
    windows, (prompt, gen) = _features(features), _prompt(Path(hf))

    def translate(sources, n, beams):
        return genai_generate(model, windows[sources], prompt, n, eos=gen["eos_token_id"],
                              beams=beams, suppress=gen.get("suppress_tokens") or (),
                              begin_suppress=gen.get("begin_suppress_tokens") or (),
                              feature_name=name, exact=True)
    return translate


LOADERS = {"whisper-tinyt": _load_tinyt, "whisper-ctranslate2": _load_ctranslate2,
           "whisper-optimum": _load_optimum, "whisper-transformers": _load_transformers,
           "whisper-cpp": whisper_cpp.load, "whisper-genai": _load_genai}
