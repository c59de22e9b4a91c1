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

The 5-s clip (CLIP: 16-kHz samples the parent wrote) goes through each engine's own path from
audio to text, greedy, one clip (with_clip):

    translate.clip(n)       the clip's samples -> the engine's features -> encoder -> n tokens
                            -> the transcript's text; returns the tokens
    translate.front_end()   the samples -> the features alone
    engine       front end (each pads the 5 s to Whisper's 30-s window its own way)
    tinyt        SpeechModel.transcribe: runtime/audio.log_mel (numpy; zeros to 30 s, then
                 the STFT of 3,000 frames)
    CTranslate2  the same log_mel, then Whisper.generate, tokenizers' decode (faster-whisper's
                 own FeatureExtractor is not run: faster-whisper imports PyAV and torch)
    Optimum,     transformers' WhisperFeatureExtractor (numpy; zeros to 30 s), generate,
    transformers the tokenizer's decode
    whisper.cpp  whisper_full on the samples: its own log-mel (C++; the audio and 30 s of
                 zeros after it, the first 3,000 frames read), whisper_pcm_to_mel alone timed
    GenAI        its multimodal processor on the clip as a float WAV in memory
                 (og.Audios.open_bytes; onnxruntime-extensions' decoder, STFT, log-mel to 30
                 s), its search, its tokenizer's decode
"""
from __future__ import annotations

import json
from pathlib import Path

from . import whisper_cpp
from .seq2seq_adapters import Translate

FEATURES = "features.npy"  # the parent's windows, beside the worker's spec
CLIP = "clip.npy"  # the parent's 5-s clip: float32 samples at 16 kHz


def with_clip(translate: Translate, clip: str | None, transcript, front_end) -> Translate:
    """`translate` with the clip's calls (module docstring): transcript(samples, n) -> tokens,
    front_end(samples) -> the features, or None where the engine keeps them (whisper.cpp)."""
    import numpy as np

    if clip is None:
        return translate
    from tinyt.runtime.audio import log_mel

    samples = np.load(clip, allow_pickle=False)

    def features_vs_log_mel():  # the largest |difference| from tinyt's log-mel of the clip
        mine = front_end(samples)
        if mine is None:
            return None
        mine = np.asarray(mine, dtype=np.float32).reshape(-1, mine.shape[-1])
        return float(np.abs(mine - log_mel(samples, n_mels=len(mine))).max())
    translate.clip = lambda n: transcript(samples, n)  # type: ignore[attr-defined]
    translate.front_end = lambda: front_end(samples)  # type: ignore[attr-defined]
    translate.features_vs_log_mel = features_vs_log_mel  # type: ignore[attr-defined]
    return translate


def _features(spec_features: str):
    import numpy as np

    return np.load(spec_features, allow_pickle=False)


def _load_tinyt(path: Path, threads: int, *, features: str, clip: str | None = None, **_
                ) -> Translate:
    import numpy as np

    import tinyt.runtime as rt
    from tinyt.runtime.audio import log_mel
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
    return with_clip(translate, clip, lambda samples, n: model.transcribe(
        samples, language="en", max_new_tokens=n).tokens,
        lambda samples: log_mel(samples, n_mels=model.n_mels))


def _prompt(path: Path) -> tuple[list[int], dict]:
    """The prompt's ids and the generation config, from a directory's generation_config.json
    (CTranslate2's conversion keeps none: the parent names ARTIFACTS/hf's)."""
    gen = json.loads((path / "generation_config.json").read_text())
    return [gen["decoder_start_token_id"], gen["lang_to_id"]["<|en|>"],
            gen["task_to_id"]["transcribe"], gen["no_timestamps_token_id"]], gen


def _load_ctranslate2(path: Path, threads: int, *, features: str, hf: str,
                      clip: str | None = None, **_) -> Translate:
    """ctranslate2.models.Whisper.generate with faster-whisper's arguments (faster-whisper's
    transcribe calls it so, after its own feature extraction): suppress_blank (the space and
    the end at the first step), suppress_tokens [-1] (the converted config's list: the
    generation config's suppress_tokens), patience 1, no repetition penalty. It stops after
    max_length // 2 new tokens (OpenAI's sample_len, n_text_ctx // 2), so it is given 2n. The
    clip: tinyt's log_mel, generate, tokenizers' decode (module docstring)."""
    import ctranslate2 as ct2
    from tokenizers import Tokenizer

    from tinyt.runtime.audio import log_mel

    model = ct2.models.Whisper(str(path), device="cpu", intra_threads=threads, inter_threads=1)
    windows, (prompt, _) = _features(features), _prompt(Path(hf))
    tokenizer = Tokenizer.from_file(str(Path(hf) / "tokenizer.json"))

    def generate(feats, n, beams):
        out = model.generate(ct2.StorageView.from_array(feats), [prompt] * len(feats),
                             beam_size=beams, patience=1, length_penalty=1.0,
                             max_length=2 * n, suppress_blank=True, suppress_tokens=[-1])
        return [r.sequences_ids[0][:n] for r in out]  # (the prompt is not in them)

    def transcript(samples, n):
        ids = generate(log_mel(samples, n_mels=model.n_mels)[None], n, 1)[0]
        tokenizer.decode(ids)  # the text, as faster-whisper's tokenizer makes it
        return ids
    return with_clip(lambda sources, n, beams: generate(windows[sources], n, beams), clip,
                     transcript, lambda samples: log_mel(samples, n_mels=model.n_mels))


def _generate(model, torch, windows, hf: str, clip: str | None) -> Translate:
    """transformers' Whisper generate (PyTorch's model or Optimum's): English, transcribe,
    no timestamps, the generation config's suppressions; it returns the tokens after the
    prompt. The clip: transformers' WhisperFeatureExtractor, generate, the tokenizer's
    decode."""
    from transformers import PreTrainedTokenizerFast, WhisperFeatureExtractor

    eos = model.generation_config.eos_token_id

    def generate(feats, n, beams):
        with torch.no_grad():
            out = model.generate(feats, max_new_tokens=n, num_beams=beams, do_sample=False,
                                 length_penalty=1.0, language="en", task="transcribe",
                                 return_timestamps=False)
        return [row[:row.index(eos)] if eos in row else row for row in out.tolist()]

    extractor = WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(Path(hf) / "tokenizer.json"))

    def front_end(samples):
        return extractor(samples, sampling_rate=16_000, return_tensors="np").input_features

    def transcript(samples, n):
        ids = generate(torch.from_numpy(front_end(samples)), n, 1)[0]
        tokenizer.decode(ids, skip_special_tokens=True)
        return ids
    return with_clip(lambda sources, n, beams: generate(torch.from_numpy(windows[sources]),
                                                        n, beams), clip, transcript, front_end)


def _load_optimum(path: Path, threads: int, *, features: str, hf: str,
                  clip: str | None = None, **_) -> Translate:
    import torch
    from onnxruntime import SessionOptions
    from optimum.onnxruntime import ORTModelForSpeechSeq2Seq

    opts = SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    torch.set_num_threads(threads)
    model = ORTModelForSpeechSeq2Seq.from_pretrained(path, session_options=opts,
                                                     provider="CPUExecutionProvider")
    return _generate(model, torch, _features(features), hf, clip)


def _load_transformers(path: Path, threads: int, *, features: str, hf: str,
                       clip: str | None = None, **_) -> Translate:
    import torch
    from transformers import WhisperForConditionalGeneration

    torch.set_num_threads(threads)
    model = WhisperForConditionalGeneration.from_pretrained(
        path, attn_implementation="eager").eval()
    return _generate(model, torch, _features(features), hf, clip)


def _load_genai(path: Path, threads: int, *, features: str, hf: str,
                clip: str | None = None, **_) -> Translate:
    """ONNX Runtime GenAI's Whisper on a directory with its genai_config.json (the model
    builder's, or `tinyt package --format genai`'s), `threads` for both sessions; the
    suppressions through the generator's logits (genai_whisper.genai_generate), exactly n
    tokens (GenAI's min_length), beams by its own beam search. The clip: its multimodal
    processor on a float WAV of the samples (audio_processor_config.json), its tokenizer."""
    import onnxruntime_genai as og

    from tinyt.export.genai_whisper import genai_generate, genai_transcribe

    config = og.Config(str(path))
    opts = {"session_options": {"intra_op_num_threads": threads, "inter_op_num_threads": 1}}
    config.overlay(json.dumps({"model": {"encoder": opts, "decoder": opts}}))
    model = og.Model(config)
    name = json.loads((path / "genai_config.json").read_text())["model"]["encoder"][
        "inputs"]["audio_features"]  # the builder's "audio_features", tinyt's "input_features"
    windows, (prompt, gen) = _features(features), _prompt(Path(hf))
    rules = {"eos": gen["eos_token_id"], "suppress": gen.get("suppress_tokens") or (),
             "begin_suppress": gen.get("begin_suppress_tokens") or ()}

    def translate(sources, n, beams):
        return genai_generate(model, windows[sources], prompt, n, beams=beams,
                              feature_name=name, exact=True, **rules)
    if clip is None or not (path / "audio_processor_config.json").is_file():
        return translate  # no clip: its calls answered empty, its cells "—"
    processor, tokenizer, wav = model.create_multimodal_processor(), og.Tokenizer(model), {}

    def as_wav(samples) -> bytes:  # the samples as they are: a float32 WAV, made once
        if not wav:
            import io

            import soundfile

            buf = io.BytesIO()
            soundfile.write(buf, samples, 16_000, format="WAV", subtype="FLOAT")
            wav["bytes"] = buf.getvalue()
        return wav["bytes"]

    def transcript(samples, n):
        ids = genai_transcribe(model, as_wav(samples), prompt, n, processor=processor,
                               exact=True, **rules)
        tokenizer.decode(ids)
        return ids
    return with_clip(translate, clip, transcript, lambda samples: processor(
        "<|startoftranscript|>", audios=og.Audios.open_bytes(as_wav(samples)))[
            "audio_features"].as_numpy())


def _load_whisper_cpp(path: Path, threads: int, *, clip: str | None = None, **options
                      ) -> Translate:
    """whisper_cpp.load's transcriber, with the clip through whisper_full's own front end (the
    text read back), whisper_pcm_to_mel alone for its features (none handed back)."""
    translate = whisper_cpp.load(path, threads, **options)

    def transcript(samples, n):
        ids = translate.from_samples(samples, n)  # type: ignore[attr-defined]
        translate.text()  # type: ignore[attr-defined]
        return ids

    def front_end(samples):
        translate.pcm_to_mel(samples)  # type: ignore[attr-defined]
    return with_clip(translate, clip, transcript, front_end)


LOADERS = {"whisper-tinyt": _load_tinyt, "whisper-ctranslate2": _load_ctranslate2,
           "whisper-optimum": _load_optimum, "whisper-transformers": _load_transformers,
           "whisper-cpp": _load_whisper_cpp, "whisper-genai": _load_genai}
