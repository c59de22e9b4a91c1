"""`tinyt package WHISPER OUT --format genai`: a tinyt Whisper artifact in the layout ONNX Runtime
GenAI's Whisper (`genai_config.json` `model.type` "whisper", onnxruntime-genai 0.18) loads, with
tinyt's graphs, weights and tokens.

GenAI's Whisper runs two graphs: an encoder that also returns every decoder layer's
cross-attention keys / values, and one decoder that takes the self cache (empty on the first
step) and the cross cache. Its config names each input and output, so tinyt's graphs keep their
Optimum names; only the encoder is new:

    input_features [B, n_mels, 3000]
         │
    encoder_model.onnx ──▶ last_hidden_state [B, 1500, d] ─────────────────────▶ (output)
                                   │
      <|startoftranscript|> [B, 1] │ (a constant, Expand to the batch)
                   │               ▼
                   └────▶ decoder_model.onnx, pruned to its cross projections
                                   └──▶ present.{i}.encoder.key / .value [B, h, 1500, hd]
    decoder.onnx = decoder_with_past_model.onnx as it is (past length 0 on the first step)

    OUT/encoder.onnx, decoder.onnx, genai_config.json, audio_processor_config.json,
        config.json, generation_config.json, tokenizer.json, tokenizer_config.json,
        manifest.json
    checked before it is written: onnxruntime_genai loads OUT and gives tinyt.runtime's greedy
    tokens on a synthetic voice, fed its log-mel features and fed it as a WAV file through
    GenAI's own front end (Whisper's suppressions applied by the caller through the
    generator's logits: GenAI 0.18's config has no suppress_tokens); a quantized artifact's
    may part at a tie of the runtime's logits (check_greedy says why).

audio_processor_config.json is what GenAI's model builder writes for Whisper: GenAI's
multimodal processor (onnxruntime-extensions' AudioDecoder, STFTNorm, LogMelSpectrum) turns a
file into the features `runtime/audio.log_mel` makes, within 2.5e-5 on a 16-kHz float WAV (as
transformers' WhisperFeatureExtractor); a file at another rate is resampled by its own
filter, not soxr's, so its features part by more (docs/speech.md: the figures).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, compose, helper

from tinyt.contract import SEQ2SEQ, SEQ2SEQ_FILES
from tinyt.errors import PackageError
from tinyt.fsutil import atomic_dir, write_json
from tinyt.graphio import load_graph, save_graph
from tinyt.manifest import Artifact, write_manifest

from .stage import Built, built, copy_artifact_files, source_versions

FILES = {"encoder": "encoder.onnx", "decoder": "decoder.onnx"}
PROCESSOR = "audio_processor_config.json"  # GenAI's front end: audio files in
CHECK_NEW_TOKENS = 16
_CROSS = "cross/"  # the pruned decoder's names inside the merged encoder


def cross_encoder(encoder: onnx.ModelProto, decoder: onnx.ModelProto, start_id: int
                  ) -> onnx.ModelProto:
    """The encoder that also returns the cross-attention caches (module sketch): `encoder`
    then `decoder` (decoder_model.onnx) fed <|startoftranscript|>, kept to the cross outputs."""
    dg = decoder.graph
    ids = next(i for i in dg.input if i.name == "input_ids")
    dg.input.remove(ids)
    make = [helper.make_node("Shape", ["encoder_hidden_states"], ["/genai/batch"], start=0,
                             end=1, name="/genai/Shape"),
            helper.make_node("Concat", ["/genai/batch", "/genai/one"], ["/genai/ids_shape"],
                             axis=0, name="/genai/Concat"),
            helper.make_node("Expand", ["/genai/start", "/genai/ids_shape"], ["input_ids"],
                             name="/genai/Expand")]
    dg.initializer.extend([helper.make_tensor("/genai/one", TensorProto.INT64, [1], [1]),
                           helper.make_tensor("/genai/start", TensorProto.INT64, [1, 1],
                                              [start_id])])
    for node in reversed(make):
        dg.node.insert(0, node)
    cross = [o.name for o in dg.output if ".encoder." in o.name]
    merged = compose.merge_models(
        encoder, decoder, io_map=[("last_hidden_state", "encoder_hidden_states")],
        prefix2=_CROSS, outputs=["last_hidden_state"] + [_CROSS + n for n in cross])
    renamed = {_CROSS + n: n for n in cross}  # back to Optimum's names
    for node in merged.graph.node:
        node.input[:] = [renamed.get(x, x) for x in node.input]
        node.output[:] = [renamed.get(x, x) for x in node.output]
    for out in merged.graph.output:
        out.name = renamed.get(out.name, out.name)
    merged.graph.name = "tinyt_whisper_encoder_cross"
    onnx.checker.check_model(merged)
    return merged


def _part(filename: str, hf: dict, layers: int, inputs: dict, outputs: dict) -> dict:
    heads, width = hf["decoder_attention_heads"], hf["d_model"]
    return {"filename": filename, "session_options": {"log_id": "tinyt", "provider_options": []},
            "head_size": width // heads, "hidden_size": width, "num_attention_heads": heads,
            "num_key_value_heads": heads, "num_hidden_layers": layers, "inputs": inputs,
            "outputs": outputs}


def genai_whisper_config(hf: dict, gen: dict) -> dict:
    """genai_config.json over the package's graphs: hf the artifact's config.json, gen its
    generation_config.json."""
    enc = _part(FILES["encoder"], hf, hf["encoder_layers"], {"audio_features": "input_features"},
                {"encoder_hidden_states": "last_hidden_state",
                 "cross_present_key_names": "present.%d.encoder.key",
                 "cross_present_value_names": "present.%d.encoder.value"})
    dec = _part(FILES["decoder"], hf, hf["decoder_layers"],
                {"input_ids": "input_ids",
                 "past_key_names": "past_key_values.%d.decoder.key",
                 "past_value_names": "past_key_values.%d.decoder.value",
                 "cross_past_key_names": "past_key_values.%d.encoder.key",
                 "cross_past_value_names": "past_key_values.%d.encoder.value"},
                {"logits": "logits", "present_key_names": "present.%d.decoder.key",
                 "present_value_names": "present.%d.decoder.value"})
    eos = gen["eos_token_id"]
    return {"model": {"type": "whisper", "bos_token_id": gen["decoder_start_token_id"],
                      "eos_token_id": eos, "pad_token_id": gen.get("pad_token_id", eos),
                      "vocab_size": hf["vocab_size"],
                      "context_length": hf["max_target_positions"],
                      "encoder": enc, "decoder": dec},
            "search": {"do_sample": False, "num_beams": 1,
                       "max_length": hf["max_target_positions"], "min_length": 0,
                       "past_present_share_buffer": False, "repetition_penalty": 1.0,
                       "temperature": 1.0, "top_k": 1, "top_p": 1.0,
                       "num_return_sequences": 1, "length_penalty": 1.0,
                       "early_stopping": True, "no_repeat_ngram_size": 0,
                       "diversity_penalty": 0.0}}


def audio_processor_config(n_mels: int) -> dict:
    """GenAI's front end for Whisper, as its model builder writes it (builders/whisper.py):
    the file decoded to 16-kHz mono, frames of a 400-sample Hann window every 160 samples,
    n_mels Slaney mel bins over 30 s (padded), Whisper's log and normalisation."""
    return {"feature_extraction": {"sequence": [
        {"operation": {"name": "audio_decoder", "type": "AudioDecoder"}},
        {"operation": {"name": "STFT", "type": "STFTNorm",
                       "attrs": {"n_fft": 400, "frame_length": 400, "hop_length": 160}}},
        {"operation": {"name": "log_mel_spectrogram", "type": "LogMelSpectrum",
                       "attrs": {"chunk_size": 30, "hop_length": 160, "n_fft": 400,
                                 "n_mel": n_mels}}}]}}


def genai_generate(model, features: np.ndarray, prompt: list[int], max_new_tokens: int, *,
                   eos: int, beams: int = 1, suppress=(), begin_suppress=(),
                   feature_name: str = "input_features", exact: bool = False
                   ) -> list[list[int]]:
    """Each window's tokens from an onnxruntime_genai Whisper `model` on log-mel `features`
    [B, n_mels, 3000], one batch, after `prompt`: greedy, or beam search keeping `beams`;
    `suppress` (every step) and `begin_suppress` (the first) set to -inf in the generator's
    logits, as transformers' rules (GenAI's config has no such lists). The tokens after the
    prompt, from the end token on left out (decode_features' form); `exact`: exactly
    `max_new_tokens` (GenAI's min_length keeps the end token out)."""
    import onnxruntime_genai as og

    feeds = og.NamedTensors()
    feeds[feature_name] = np.ascontiguousarray(features, dtype=np.float32)
    feeds["input_ids"] = np.asarray([prompt] * len(features), dtype=np.int32)
    return _search(model, feeds, len(features), prompt, max_new_tokens, eos=eos, beams=beams,
                   suppress=suppress, begin_suppress=begin_suppress, exact=exact)


def genai_transcribe(model, audio: str | Path | bytes, prompt: list[int], max_new_tokens: int,
                     *, eos: int, processor=None, **search) -> list[int]:
    """The tokens of one audio file (a path, or its bytes) through GenAI's own front end (the
    package's audio_processor_config.json: model.create_multimodal_processor, og.Audios), then
    genai_generate's search after `prompt` (search: its beams, suppress, begin_suppress,
    exact). processor: one made before, to reuse."""
    import onnxruntime_genai as og

    processor = processor or model.create_multimodal_processor()
    audios = og.Audios.open_bytes(audio) if isinstance(audio, bytes) else og.Audios.open(
        str(audio))
    # the processor wants a prompt to tokenize; its ids are replaced by `prompt`'s own
    feeds = processor("<|startoftranscript|>", audios=audios)
    feeds["input_ids"] = np.asarray([prompt], dtype=np.int32)
    return _search(model, feeds, 1, prompt, max_new_tokens, eos=eos, **search)[0]


def _search(model, feeds, rows: int, prompt: list[int], max_new_tokens: int, *, eos: int,
            beams: int = 1, suppress=(), begin_suppress=(), exact: bool = False
            ) -> list[list[int]]:
    """GenAI's search on `feeds` (the features and the prompt's ids of `rows` windows), the
    suppressions through its logits (genai_generate)."""
    import onnxruntime_genai as og

    total = len(prompt) + max_new_tokens
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=total, batch_size=rows, num_beams=beams,
                              do_sample=False, **({"min_length": total} if exact else {}))
    gen = og.Generator(model, params)
    gen.set_inputs(feeds)
    suppress, begin = list(suppress), list(suppress) + list(begin_suppress)
    while not gen.is_done():
        mask = begin if gen.token_count() == len(prompt) else suppress
        if mask:
            logits = gen.get_logits()  # [rows x beams, 1, vocab]
            logits[..., mask] = -np.inf
            gen.set_logits(logits)
        gen.generate_next_token()
    out = []
    for r in range(rows):
        tokens = [int(t) for t in gen.get_sequence(r)][len(prompt):]
        out.append(tokens[:tokens.index(eos)] if eos in tokens else tokens)
    return out


def load_genai(directory: Path):
    """onnxruntime_genai.Model of a package directory (a clear error without the package)."""
    try:
        import onnxruntime_genai as og
    except ImportError:
        raise PackageError("--format genai checks the package by loading it in ONNX Runtime "
                           "GenAI, which is not installed: pip install 'tinyt[peers]' (or "
                           "onnxruntime-genai>=0.18)") from None
    return og.Model(str(directory))


def package_genai_whisper(src_dir: Path, out_dir: Path, src: Artifact) -> Built:
    """Write the GenAI package (module docstring); returns out_dir. The caller
    (export/seq2seq_package.py) has refused what does not apply."""
    from tinyt.runtime import load

    hf = json.loads((src_dir / "config.json").read_text(encoding="utf-8"))
    gen = json.loads((src_dir / "generation_config.json").read_text(encoding="utf-8"))
    with atomic_dir(out_dir) as out:
        copy_artifact_files(src_dir, out)
        encoder = cross_encoder(load_graph(src_dir / SEQ2SEQ_FILES["encoder"]),
                                load_graph(src_dir / SEQ2SEQ_FILES["decoder"]),
                                int(gen["decoder_start_token_id"]))
        save_graph(encoder, out / FILES["encoder"], external=False)
        del encoder
        shutil.copyfile(src_dir / SEQ2SEQ_FILES["decoder_with_past"], out / FILES["decoder"])
        write_json(out / "genai_config.json", genai_whisper_config(hf, gen))
        write_json(out / PROCESSOR, audio_processor_config(int(hf["num_mel_bins"])))
        asr = load(src_dir, threads=1, tune=False)
        greedy = check_greedy(out, asr)
        import onnxruntime_genai as og

        extra = {**src.manifest.records("quantization", "accuracy", "opset"),
                 "graph": SEQ2SEQ, "package_format": "genai",
                 "int8": src.manifest.record("int8") or {},
                 "versions": source_versions(src, onnxruntime_genai=og.__version__),
                 "genai": {"type": "whisper", "files": dict(FILES),
                           "from": {"encoder": [SEQ2SEQ_FILES["encoder"],
                                                SEQ2SEQ_FILES["decoder"]],
                                    "decoder": [SEQ2SEQ_FILES["decoder_with_past"]]}},
                 "equivalence": {"greedy": greedy}}
        written = write_manifest(out, stage="package", source=src.record(),
                                 options={"format": "genai"}, extra=extra)
    return built(out_dir, written)


def check_greedy(out: Path, asr) -> dict:
    """GenAI's greedy tokens on the package against tinyt.runtime's on the same audio (a
    synthetic voice, English forced), fed its log-mel features and fed it as a WAV through
    GenAI's own front end: equal for fp32 graphs; a quantized artifact's may part only at a
    tie of the runtime's logits at int8 precision (speech_page.speech_ties: GenAI runs the
    prompt through the stepping graph, whose weights the quantize stage quantized by another
    recipe than the first decoder graph's). PackageError otherwise."""
    from tinyt.runtime.audio import log_mel

    model = load_genai(out)
    wav, samples = voice_wav()
    features = log_mel(samples, n_mels=asr.n_mels)
    want = asr.decode_features(features[None], language="en",
                               max_new_tokens=CHECK_NEW_TOKENS)[0]
    prompt, rules = asr._prefix("en", "transcribe", False), {
        "eos": asr.eos, "suppress": asr.suppress, "begin_suppress": asr.begin_suppress}
    got = {"features": genai_generate(model, features[None], prompt, CHECK_NEW_TOKENS,
                                      **rules)[0],
           "wav": genai_transcribe(model, wav, prompt, CHECK_NEW_TOKENS, **rules)}
    ties = {fed: _ties(asr, features, tokens, want, fed) for fed, tokens in got.items()}
    return {"audio": "synthetic voice (3 s, 0.25 s of silence either side; a 16-bit WAV "
                     "through GenAI's front end)", "max_new_tokens": CHECK_NEW_TOKENS,
            "tokens": len(want), "equal": got["features"] == want,
            "ties": ties["features"], "wav_equal": got["wav"] == want,
            "wav_ties": ties["wav"]}


def _ties(asr, features: np.ndarray, got: list[int], want: list[int], fed: str) -> int:
    """0 where GenAI's tokens are tinyt's; the ties they part at where the artifact is
    quantized; PackageError otherwise (check_greedy)."""
    from tinyt.errors import WebPackageError

    from .web.speech_page import speech_ties

    if got == want:
        return 0
    said = (f"ONNX Runtime GenAI's greedy tokens on the package, fed the {fed}, {got} differ "
            f"from tinyt.runtime's {want} (a synthetic voice, English)")
    if not asr.decoder.artifact.manifest.quantization:
        raise PackageError(said)
    try:
        return speech_ties(asr, [features], [got], "en", new_tokens=CHECK_NEW_TOKENS)
    except WebPackageError as e:
        raise PackageError(f"{said}: {str(e).split('(', 1)[-1].rstrip(')')}") from None


def voice_wav(edge_s: float = 0.25) -> tuple[bytes, np.ndarray]:
    """The synthetic voice as a 16-kHz, 16-bit mono WAV (the standard library's writer) with
    `edge_s` of silence either side, and the samples that file holds (int / 32768, as
    libsndfile and GenAI's decoder read them). The silence: GenAI frames the audio's first
    and last 20 ms its own way (its features part there by up to ~0.9 where the audio does not
    start and end in silence; docs/speech.md)."""
    import io
    import wave

    from .speech_accuracy import SAMPLE_RATE, voice

    edge = np.zeros(int(edge_s * SAMPLE_RATE), dtype=np.float32)
    pcm = np.round(np.clip(np.concatenate([edge, voice(), edge]), -1, 1) * 32767)
    pcm = pcm.astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(pcm.tobytes())
    return buf.getvalue(), pcm.astype(np.float32) / 32768
