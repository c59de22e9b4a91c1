"""`tinyt package ARTIFACT OUT --format web` for a speech (Whisper) artifact: the page
transcribes an audio file, or the microphone where the browser grants it, on ONNX Runtime Web's
WebAssembly backend.

    ARTIFACT (Whisper: Optimum's three speech graphs, fp32 or quantized by the seq2seq stage)
      ──▶ OUT/index.html        speech.html: an audio file or the microphone, a language
                                (or detected), the text as its tokens come, timings
          OUT/speech.mjs        the audio front end (Web Audio's decodeAudioData at 16 kHz,
                                runtime/audio.log_mel's features in JavaScript) and Whisper's
                                prompt and rules over seq2seq.mjs' decoder loop
          OUT/mel_filters.bin   runtime/audio.mel_filters(n_mels) as little-endian float64
                                [201, n_mels]: the page reads the filters, not a copy of their
                                arithmetic
          OUT/encoder_model.onnx, decoder_model.onnx, decoder_with_past_model.onnx, speech.json,
          tinyt.mjs, seq2seq.mjs, ort files, tokenizer.json, config.json, web.json, manifest.json
          OUT/longform.mjs      long audio window by window: the runtime's seek rule,
                                Whisper's timestamp rules, segments, the page's limit
      checked before it is written, under Node on the package's own files, on
      speech_accuracy.voice (3 s): the module's log-mel features lie within feature_bounds of
      exact arithmetic, as runtime/audio.log_mel's do; its greedy tokens (English forced, and the
      language detected) equal SpeechModel.decode_features' on those features, but where a row
      first differs at a tie of the runtime's own logits (seq2seq_page.seq2seq_ties); and on
      LONG_SECONDS of it, long-form (check_long_form): the whole's features within the bound,
      each window from where the one before ends, its tokens the runtime's on the page's own
      window (timestamps on; a tie at most), its segments split_segments' of them.

web.json's "speech" block carries what speech.mjs reads of speech.json (special tokens,
languages, suppress_tokens, begin_suppress_tokens) as the runtime reads it.
"""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np

from tinyt.errors import WebPackageError
from tinyt.manifest import Artifact

from ..stage import Built
from .seq2seq_page import seq2seq_ties, web_json, web_tools, write_web_package
from .tools import (
    ASSETS,
    ORT_WEB_VERSION,
    run_module,
)

MODULES = ("seq2seq.mjs", "speech.mjs", "longform.mjs")
PAGE = "speech.html"  # written as index.html
MEL_FILE = "mel_filters.bin"
CHECK_NEW_TOKENS = 12
LONG_SECONDS = 32.0  # the check's long-form audio: two windows, the second of 2 s at most
# The longest audio the page takes (web.json's speech.max_seconds; tinyt transcribe reads 4 h).
# Per second the tab holds 64 KB of samples, 32 KB (80 bins) to 51 KB (128) of features, and
# while the browser decodes, 64 KB a channel of Web Audio's buffer: 30 min is ~0.45 GB at the
# peak (stereo, 128 bins), what a phone's tab still holds. The time grows as much: the features
# take ~1.6 s a window in JavaScript, tiny's encoder 1-3 s on WebAssembly (one thread), so 60
# windows are minutes, and a larger Whisper's far more.
MAX_SECONDS = 30 * 60
U32, U64 = 2.0 ** -24, 2.0 ** -53  # unit roundoffs
# A float32 FFT's error, per output, over the 2-norm of its whole spectrum: log2(N) stages
# each within (4 sqrt(2) + 1) u (Higham, Accuracy and Stability, 2nd ed., thm 24.2, radix 2;
# pocketfft's mixed radices 4 and 5 do no worse a stage), rounded up
FFT_STAGE = 7
# The features' float32 steps after the mel sums (log10, + 4, / 4), each rounding at most
# half an ulp at |x| < 16 before the / 4: what two computations of them may add to a difference
FINAL_ROUNDING = 2.0 ** -20


def package_speech_web(src_dir: Path, out_dir: Path, src: Artifact) -> Built:
    """Write the Whisper's web package (module docstring); returns out_dir. The caller
    (export/seq2seq_package.py) has refused what does not apply."""
    from tinyt.runtime import load
    from tinyt.runtime.audio import mel_filters

    web_tools(src_dir)
    sm = load(src_dir, threads=1, tune=False)

    def page_and_filters(out: Path) -> list[str]:
        shutil.copy2(ASSETS / PAGE, out / "index.html")
        mel_filters(sm.n_mels).astype("<f8").tofile(out / MEL_FILE)
        return [MEL_FILE]
    return write_web_package(src_dir, out_dir, src, speech_web_json(src_dir.name, sm), MODULES,
                             page_and_filters, lambda out: check_speech_page(out, sm))


def speech_web_json(name: str, sm) -> dict:
    """web.json of a Whisper (`sm`: its SpeechModel): the encoder-decoder's, its end token
    Whisper's, and the "speech" block speech.mjs reads."""
    web = web_json(name, sm.decoder)
    t = sm.tokens
    web["eos_token_ids"] = [sm.eos]
    web["speech"] = {
        "n_mels": sm.n_mels, "bins": 201, "mel_filters": MEL_FILE,
        "start": t["start"], "end": sm.eos, "no_timestamps": t["no_timestamps"],
        "timestamp_begin": t["timestamp_begin"], "timestamps": t["timestamps"],
        "max_initial_timestamp_index": sm.max_initial, "max_seconds": MAX_SECONDS,
        "tasks": t["tasks"], "languages": sm.languages, "multilingual": sm.multilingual,
        "suppress_tokens": list(sm.suppress), "begin_suppress_tokens": list(sm.begin_suppress)}
    return web


def check_speech_page(out: Path, sm) -> dict:
    """The module under Node on the files just written to `out`, on speech_accuracy.voice:
    features within feature_bounds, tokens as the runtime's (module docstring). Returns the
    manifest's record; raises WebPackageError for a difference."""
    from tinyt.runtime.audio import log_mel

    from ..speech_accuracy import voice

    samples, long = voice(), voice(LONG_SECONDS, seed=1)
    languages = ["en", None] if sm.multilingual else ["en"]
    got = run_module(out, {"transcribe": [
        *({"samples": samples.tolist(), "language": lang, "max_new_tokens": CHECK_NEW_TOKENS,
           "features": lang == "en"} for lang in languages),
        {"samples": long.tolist(), "language": "en", "max_new_tokens": CHECK_NEW_TOKENS,
         "timestamps": True, "features": True}]})
    if "error" in got:
        raise WebPackageError(f"the packaged graphs do not run on onnxruntime-web "
                              f"{ORT_WEB_VERSION}: {got['error']}")
    page = np.asarray(got["transcribe"][0]["features"], np.float32).reshape(sm.n_mels, -1)
    worst = check_features(page, log_mel(samples, sm.n_mels), samples, sm.n_mels)
    # the first window's pass (a model that writes timestamps unasked goes on from the last
    # one in further windows, as transcribe does: check_long_form's matter)
    ties = speech_ties(sm, [page], [got["transcribe"][0]["windows"][0]["tokens"]], "en")
    if len(languages) > 1:  # detected: the runtime's choice on the runtime's own features
        want = sm.transcribe(samples, language=None, max_new_tokens=CHECK_NEW_TOKENS)
        detected = got["transcribe"][1]
        if detected["language"] != want.language:
            raise WebPackageError(f"the page detects language {detected['language']!r} where "
                                  f"tinyt.runtime detects {want.language!r}")
        ties += speech_ties(sm, [page], [detected["windows"][0]["tokens"]], want.language)
    answer = got["transcribe"][-1]
    long_ties = check_long_form(sm, answer, long, "en", CHECK_NEW_TOKENS)
    return {"audio": "synthetic voice (3 s)", "languages": [x or "detected" for x in languages],
            "features": worst, "greedy_tokens": CHECK_NEW_TOKENS, "greedy_equal": True,
            "greedy_ties": ties, "long_form": {
                "audio": f"synthetic voice ({LONG_SECONDS:g} s)", "timestamps": True,
                "windows": len(answer["windows"]), "segments": len(answer["segments"]),
                "ties": long_ties}}


def check_long_form(sm, got: dict, samples: np.ndarray, language: str,
                    new_tokens: int | None) -> int:
    """The module's long-form answer `got` (check.mjs' or the page's: features, windows,
    segments) on `samples` against the runtime's rules: the whole's features within
    feature_bounds; each window from the frame split_segments of the one before says (the
    first from 0, the last reaching the end); its tokens SpeechModel.decode_features' on the
    page's own window (timestamps on; where they first differ, a tie of the runtime's logits:
    speech_ties); its segments split_segments' of them. Returns the windows that parted at a
    tie; raises WebPackageError for a difference."""
    from tinyt.runtime.audio import log_mel
    from tinyt.runtime.transcribe import INPUT_STRIDE, TIME_PRECISION, SpeechModel, split_segments

    page = np.asarray(got["features"], np.float32).reshape(sm.n_mels, -1)
    check_features(page, log_mel(samples, sm.n_mels, whole=True), samples, sm.n_mels,
                   whole=True)
    T, total = sm.tokens["timestamp_begin"], page.shape[1]
    seek, ties, want = 0, 0, []
    for k, w in enumerate(got["windows"]):
        if w["seek"] != seek:
            raise WebPackageError(f"the page's window {k} starts at frame {w['seek']}; the one "
                                  f"before it ends its segments at frame {seek}")
        window, frames = SpeechModel._cut(page, seek)
        ties += speech_ties(sm, [window], [w["tokens"]], language, new_tokens=new_tokens,
                            timestamps=True)
        pieces, advance = split_segments(w["tokens"], T, seek * TIME_PRECISION / INPUT_STRIDE,
                                         frames)
        want += [(round(a, 3), round(b, 3), list(p)) for a, b, p in pieces]
        seek += max(advance, 1)
    if not got["windows"] or seek < total:
        raise WebPackageError(f"the page's windows stop at frame {seek} of {total}")
    made = [(s["start"], s["end"], s["tokens"]) for s in got["segments"]]
    if made != want:
        raise WebPackageError(f"the page's segments (start, end, tokens) {made} are not "
                              f"split_segments' of its windows' tokens: {want}")
    return ties


def feature_bounds(samples: np.ndarray, n_mels: int, *, whole: bool = False,
                   ) -> tuple[np.ndarray, np.ndarray]:
    """[n_mels, 3000] intervals (lo, hi) that hold runtime/audio.log_mel's features of
    `samples` (numpy's float32 FFT) and the page's (a float64 DFT) alike: exact arithmetic's
    (a float64 FFT of the same float32 windowed frames) widened by each FFT's rounding.
    whole: every sample's frames (long-form's log_mel(whole=True), [n_mels, samples // 160]).

    A spectrum entry X_k moves by at most d = (FFT_STAGE u32 log2 N + N u64) sqrt(N) |frame|_2
    (the FFT's error over its spectrum's 2-norm, sqrt(N) |frame|_2 by Parseval; the page's
    direct sums, N terms of float64); |X|^2 then by 2 |X| d + d^2, and by 3 u32 |X|^2 where
    numpy rounds |X| and its square to float32. The mel sums (nonnegative filters) move by
    the filters' sums of those; log10 is monotone, the floor max - 8 moves as the maximum
    does, and max(., floor) is 1-Lipschitz; FINAL_ROUNDING is added on either side."""
    from tinyt.runtime.audio import HOP, N_FFT, N_SAMPLES, mel_filters

    n = samples.size if whole else N_SAMPLES
    x = np.zeros(n, np.float32)
    x[:min(samples.size, n)] = samples[:n]
    x = np.pad(x, N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(x, N_FFT)[::HOP][:n // HOP]
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)
    y = (frames * window).astype(np.float64)  # as both compute it: a float32 product
    spectrum = np.abs(np.fft.rfft(y, axis=-1))  # [frames, 201]
    d = (FFT_STAGE * U32 * np.log2(N_FFT) + N_FFT * U64) * np.sqrt(N_FFT) * \
        np.linalg.norm(y, axis=-1, keepdims=True)
    power, dp = spectrum ** 2, 2 * spectrum * d + d ** 2 + 3 * U32 * spectrum ** 2
    filters = mel_filters(n_mels)
    mel, dmel = power @ filters, dp @ filters
    lo = np.log10(np.maximum(mel - dmel, 1e-10))
    hi = np.log10(np.maximum(mel + dmel, 1e-10))
    lo = (np.maximum(lo, lo.max() - 8) + 4) / 4 - FINAL_ROUNDING
    hi = (np.maximum(hi, hi.max() - 8) + 4) / 4 + FINAL_ROUNDING
    return lo.T, hi.T


def check_features(page: np.ndarray, ours: np.ndarray, samples: np.ndarray, n_mels: int, *,
                   whole: bool = False) -> dict:
    """The page's features against the runtime's (`ours`, log_mel's; whole: long-form's):
    both within feature_bounds, or WebPackageError. Returns the worst difference and the
    widest bound."""
    if page.shape != ours.shape:
        raise WebPackageError(f"the page's log-mel features have shape {page.shape}; the "
                              f"runtime's {ours.shape}")
    lo, hi = feature_bounds(samples, n_mels, whole=whole)
    for who, f in (("the page's", page), ("tinyt.runtime's", ours)):
        out = (f < lo) | (f > hi)
        if out.any():
            m, t = np.argwhere(out)[0]
            raise WebPackageError(
                f"{who} log-mel features leave the FFT's rounding bound at {int(out.sum())} "
                f"of {f.size} entries; first at mel {m}, frame {t}: {f[m, t]:.7g} outside "
                f"[{lo[m, t]:.7g}, {hi[m, t]:.7g}]")
    return {"max_abs_diff": float(np.abs(page - ours).max()),
            "widest_bound": float((hi - lo).max())}


def speech_ties(sm, features: list[np.ndarray], got: list[list[int]], language: str, *,
                new_tokens: int | None = CHECK_NEW_TOKENS, timestamps: bool = False) -> int:
    """The page's greedy tokens (`new_tokens` at most; None: as many as the decoder holds)
    of each window's `features` (the page's own) against SpeechModel.decode_features' on them
    (timestamps: predicted): seq2seq_ties, the logits with Whisper's rules."""
    from tinyt.runtime.encoder_decoder import DecoderSteps

    want = [sm.decode_features(f[None], language=language, timestamps=timestamps,
                               max_new_tokens=new_tokens)[0] for f in features]
    prompt = sm._prefix(language, "transcribe", timestamps)
    rules = sm._settings(len(prompt), timestamps, new_tokens).rules
    free = dataclasses.replace(rules, force_timestamp=False)

    def logits_after(model, f, prefix):
        (memory,) = model.sessions["encoder"].run(["last_hidden_state"],
                                                  {"input_features": f[None]})
        steps = DecoderSteps(model, memory, None)
        z = steps.first(prompt)
        for tok in prefix:
            z = steps(np.zeros(1, np.int64), np.array([tok], np.int64))
        z = z.astype(np.float32)
        free.apply(z, [prompt + list(prefix)], len(prefix))
        if not timestamps:
            return z[0]
        # the forced timestamp, decided by the sign of a margin of these logits: the page's
        # may fall the other way at a tie (seq2seq_ties), both readings go with it
        margin, forced = free.forcing_margin(z[0]), z[0].copy()
        forced[:free.timestamp_begin] = -np.inf
        return (forced, [(margin, z[0])]) if margin > 0 else (z[0], [(margin, forced)])
    return seq2seq_ties(sm.decoder, features, got, want, logits_after=logits_after)
