"""whisper.cpp as a Whisper peer (issue 52), opt-in like llama.cpp: pywhispercpp's bindings
(a manylinux wheel: whisper.cpp 1.8.5, ggml 0.13.1) run whisper.cpp's own ggml file, made by
whisper.cpp's own converter from the benchmark's Hugging Face directory.

    ARTIFACTS/hf ──whisper.cpp's models/convert-h5-to-ggml.py──▶ peers/whisper.cpp-f16/
        ggml-model.bin (the converter wants the slow tokenizer's vocab.json and
        added_tokens.json, written from tokenizer.json, and OpenAI's mel_filters.npz:
        runtime/audio.mel_filters', the filters tinyt's log-mel uses, so whisper.cpp's own
        front end has the same)
    ──whisper.cpp's whisper-quantize (built from the same source)──▶ peers/whisper.cpp-q8_0/

    bash scripts/setup-whisper-cpp.sh       (the wheel, the converter, the quantizer: cached)

f16 is the converter's default and the only float file this whisper.cpp runs: its "f32" file
rounds every tensor to fp16 before writing it as f32 (convert-h5-to-ggml.py casts to float16
first), and a true f32 file stops in the encoder's first convolution (ggml_conv_1d's im2col
asserts an f16 kernel: ggml-org/whisper.cpp#2557). So no whisper.cpp row is fp32 and none must
give tinyt fp32's tokens; each reports its agreement. f16 without flash attention gives them
but where tinyt suppresses a token whisper.cpp does not (below): the fp16-rounded weights move
these logits by ~1e-3. Flash attention (its default) parts sooner.

A call is whisper_full on a window's log-mel features set with whisper_set_mel (the features
every engine gets; whisper_full with no samples skips its own front end): English, transcribe,
no timestamps, one segment, max_tokens n - 1 (it stops after making the token that reaches the
limit: n tokens), no temperature fallback, suppress_blank and its non-speech suppression
(suppress_nst: its form of the generation config's suppress_tokens, found by their text; on
the random Whisper's filler vocabulary it finds the one-byte ones only, so where tinyt
suppresses a longer one whisper.cpp may pick it. Its suppress_regex would reach them at ~12 ms
a step, a regex over the 51,865 tokens' text: not timed so; the bindings hand a logits filter
no array to write). One window at a time: whisper_full transcribes one audio, so a batch is
the windows in turn.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tinyt.errors import BenchError

MODEL = "ggml-model.bin"  # in each converted directory
SETUP = "bash scripts/setup-whisper-cpp.sh"
# the converter's one line that rounds a tensor to fp16 whatever the file's type
_TO_F16 = "    data = data.astype(np.float16)\n"


def cache() -> Path:
    """Where scripts/setup-whisper-cpp.sh leaves the converter and the quantizer."""
    return Path(os.environ.get("TINYT_WHISPER_CPP") or Path(
        os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tinyt/whisper-cpp")


def converter() -> Path | None:
    script = cache() / "converter" / "convert-h5-to-ggml.py"
    return script if script.is_file() else None


def quantizer() -> Path | None:
    tool = cache() / "bin" / "whisper-quantize"
    return tool if tool.is_file() else None


def missing() -> str | None:
    """Why whisper.cpp cannot run here, or None."""
    try:
        import _pywhispercpp  # noqa: F401
    except ImportError:
        return f"pywhispercpp is not installed ({SETUP})"
    if converter() is None:
        return f"whisper.cpp's converter is not in {cache()} ({SETUP})"
    return None


def convert(hf: Path, out: Path, option: str) -> None:
    """out/ggml-model.bin of the Whisper in `hf` at `option`: f16 (the converter's default) or
    q8_0 (whisper-quantize of the f16 file)."""
    if option not in ("f16", "q8_0"):
        raise BenchError(f"whisper.cpp option {option!r}: f16 or q8_0 (its f32 file is fp16 "
                         "rounded and does not run: see the module docstring)")
    conv, quant = converter(), quantizer()
    if conv is None or (option == "q8_0" and quant is None):
        raise BenchError(f"whisper.cpp's {'converter' if conv is None else 'quantizer'} is not "
                         f"in {cache()} ({SETUP})")
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        model, repo = _staged(hf, Path(tmp))
        run = subprocess.run([sys.executable, str(conv), str(model), str(repo), tmp],
                             capture_output=True, text=True, timeout=1800)
        if run.returncode != 0:  # its own last words name what it refused
            said = [s for s in run.stderr.splitlines() if s.strip()]
            raise BenchError(f"whisper.cpp's convert-h5-to-ggml.py exited {run.returncode}: "
                             + (said[-1] if said else "(nothing on stderr)"))
        made = Path(tmp) / MODEL
        if option == "f16":
            shutil.move(made, out / MODEL)
            return
        run = subprocess.run([str(quant), str(made), str(out / MODEL), "q8_0"],
                             capture_output=True, text=True, timeout=1800)
        if run.returncode != 0:
            raise BenchError(f"whisper-quantize exited {run.returncode}: {run.stderr[-300:]}")


def _staged(hf: Path, tmp: Path) -> tuple[Path, Path]:
    """What the converter reads: hf's files with vocab.json and added_tokens.json (from its
    tokenizer.json), and a stand-in for OpenAI's repository holding
    whisper/assets/mel_filters.npz (mel_{n} [n, 201]: tinyt's filters, saved without pickle)."""
    import numpy as np

    from tinyt.runtime.audio import mel_filters

    model, repo = tmp / "model", tmp / "openai-whisper"
    model.mkdir()
    for f in hf.iterdir():
        (model / f.name).symlink_to(f.resolve())
    tok = json.loads((hf / "tokenizer.json").read_text())
    if tok.get("model", {}).get("type") != "BPE":
        raise BenchError(f"{hf / 'tokenizer.json'} is not a byte-level BPE: whisper.cpp's "
                         "converter reads Whisper's vocab.json")
    (model / "vocab.json").write_text(json.dumps(tok["model"]["vocab"]))
    (model / "added_tokens.json").write_text(
        json.dumps({t["content"]: t["id"] for t in tok.get("added_tokens", [])}))
    n_mels = json.loads((hf / "config.json").read_text())["num_mel_bins"]
    assets = repo / "whisper" / "assets"
    assets.mkdir(parents=True)
    np.savez(assets / "mel_filters.npz",
             **{f"mel_{n_mels}": mel_filters(n_mels).T.astype(np.float32)})
    return model, repo


def load(path: Path, threads: int, *, features: str, flash_attn: bool = False, **_):
    """A Translate (seq2seq_adapters' kind) running whisper.cpp on the windows in `features`:
    translate(sources, n, beams) -> each window's n generated ids (module docstring);
    translate.from_samples(samples, n) through whisper_full's own front end (the last call's
    text then in translate.text()), translate.pcm_to_mel(samples) that front end alone."""
    import _pywhispercpp as pw
    import numpy as np

    windows = np.load(features, allow_pickle=False)
    ctx_params = pw.whisper_context_default_params()
    ctx_params.flash_attn = flash_attn  # its default is on
    ctx = pw.whisper_init_from_file_with_params(str(path / MODEL), ctx_params)
    if ctx is None:
        raise BenchError(f"whisper.cpp could not load {path / MODEL}")
    no_samples = np.zeros(0, dtype=np.float32)
    made = {1: _params(pw, threads, 1)}

    def one(window, n: int, beams: int, samples=no_samples) -> list[int]:
        if window is not None:  # [n_mels, frames], mel-major as whisper.cpp keeps it
            mel = np.ascontiguousarray(window, dtype=np.float32)
            if pw.whisper_set_mel(ctx, mel.ravel(), mel.shape[1], mel.shape[0]) != 0:
                raise BenchError(f"whisper_set_mel refused features of shape {mel.shape}")
        params = made.setdefault(beams, _params(pw, threads, beams))
        params.max_tokens = n - 1  # it stops after the token past the limit: n in all
        if (rc := pw.whisper_full(ctx, params, samples, samples.size)) != 0:
            raise BenchError(f"whisper_full returned {rc}")
        return [pw.whisper_full_get_token_id(ctx, s, j)
                for s in range(pw.whisper_full_n_segments(ctx))
                for j in range(pw.whisper_full_n_tokens(ctx, s))][:n]

    def translate(sources, n, beams):
        return [one(windows[s], n, beams) for s in sources]
    # whisper.cpp's own front end: 16-kHz samples in (its log-mel, not the features file's)
    translate.from_samples = lambda samples, n: one(  # type: ignore[attr-defined]
        None, n, 1, np.ascontiguousarray(samples, dtype=np.float32))
    translate.context = ctx  # type: ignore[attr-defined]  # kept alive with the closure

    translate.text = lambda: b"".join(  # type: ignore[attr-defined]  # the last call's
        pw.whisper_full_get_segment_text(ctx, s) for s in range(pw.whisper_full_n_segments(ctx)))

    def pcm_to_mel(samples):  # its log-mel alone, kept in the context (none handed back)
        x = np.ascontiguousarray(samples, dtype=np.float32)
        if (rc := pw.whisper_pcm_to_mel(ctx, x, x.size, threads)) != 0:
            raise BenchError(f"whisper_pcm_to_mel returned {rc}")
    translate.pcm_to_mel = pcm_to_mel  # type: ignore[attr-defined]
    return translate


def _params(pw, threads: int, beams: int):
    """whisper_full's parameters: greedy (beams 1) or beam search of `beams` (patience 1)."""
    strategy = pw.whisper_sampling_strategy
    p = pw.whisper_full_default_params(strategy.WHISPER_SAMPLING_GREEDY if beams == 1
                                       else strategy.WHISPER_SAMPLING_BEAM_SEARCH)
    p.language, p.translate, p.n_threads = "en", False, threads
    p.no_timestamps = p.single_segment = p.no_context = p.suppress_nst = True
    p.print_progress = p.print_realtime = p.print_timestamps = False
    p.temperature, p.temperature_inc = 0.0, 0.0  # no fallback to sampling
    if beams == 1:
        p.greedy = {"best_of": 1}
    else:
        p.beam_search = {"beam_size": beams, "patience": 1.0}
    return p
