"""`tinyt package --format transformers-js` of a Whisper (export/transformers_js.py): the layout
transformers.js' automatic-speech-recognition pipeline loads unchanged, as a local model —
onnx/encoder_model{S}.onnx, onnx/decoder_model_merged{S}.onnx (Optimum's merged decoder),
config.json (Whisper's, `transformers.js_config.dtype` naming the suffix), generation_config.json
(lang_to_id, task_to_id, suppress_tokens, begin_suppress_tokens, no_timestamps_token_id),
preprocessor_config.json (WhisperFeatureExtractor's settings) and a tokenizer_config.json that
names WhisperTokenizer (the pipeline decodes with its _decode_asr).

Without transformers.js: the package's files and its check (its encoder and merged decoder
through tinyt.runtime's loop give the source's tokens). With it (web/transformers-js, opt-in:
bash scripts/setup-transformers-js.sh), in headless Chromium on tests/conftest.py's small_whisper
and espeak-ng's speech at 16 kHz: the pipeline's text is tinyt's, and the model's generate on
the pipeline's own features gives tinyt.runtime's tokens (English forced: transformers.js 4.3.2
does not detect a language, it defaults to English) for fp32 and INT8, INT4 parting only at a
tie of the runtime's logits. transformers.js' log-mel features (its own FFT and filters, in
JavaScript) are compared with the runtime's within speech_page.feature_bounds."""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from test_web import browser, needs_browser  # noqa: F401 (browser: a fixture)

import tinyt.runtime as rt
from tinyt.runtime.audio import load_audio, log_mel

TJS = Path(__file__).resolve().parents[2] / "web" / "transformers-js" / "node_modules"
HAVE_TJS = (TJS / "@huggingface" / "transformers").is_dir()
NEW_TOKENS = 12
PAGE = """<!doctype html><meta charset="utf-8"><script type="module">
import { env, pipeline } from "./transformers.min.js";
env.allowLocalModels = true; env.allowRemoteModels = false; env.localModelPath = "./models/";
env.backends.onnx.wasm.numThreads = 1;
env.backends.onnx.wasm.wasmPaths = new URL("./", location.href).href;  // no CDN: the copies here
window.tjs = {
  async load(name) { window.tjs.asr = await pipeline("automatic-speech-recognition", name, { device: "wasm" }); },
  async transcribe(samples, n) {
    const asr = window.tjs.asr, x = Float32Array.from(samples);
    const said = await asr(x, { language: "en", task: "transcribe", max_new_tokens: n });
    const { input_features } = await asr.processor(x);
    const ids = await asr.model.generate({ inputs: input_features, language: "en", task: "transcribe", max_new_tokens: n });
    return { text: said.text, tokens: Array.from(ids.data, Number), features: Array.from(input_features.data) };
  } };
window.tjsReady = true;
</script>"""
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    shutil.which("espeak-ng") is None, reason="espeak-ng is not installed (scripts/setup.sh)")]


@pytest.fixture(scope="module")
def packages(small_whisper, tmp_path_factory):
    from tinyt.export.package import package

    root = tmp_path_factory.mktemp("speech-tjs")
    return {name: package(small_whisper[name], root / name, format="transformers-js")
            for name in ("fp32", "int8", "int4")}


def test_package_holds_what_the_speech_pipeline_reads(packages, small_whisper):
    pkg = packages["fp32"]
    m = pkg.manifest
    assert m["transformers_js"]["files"] == {"encoder": "onnx/encoder_model.onnx",
                                             "decoder_merged": "onnx/decoder_model_merged.onnx"}
    assert m["equivalence"]["greedy"] == {"audio": "synthetic voice (3 s)", "equal": True,
                                          "languages": ["en", "detected"],
                                          "max_new_tokens": 12}
    config = json.loads((pkg / "config.json").read_text())
    assert config["model_type"] == "whisper" and config["is_encoder_decoder"] is True
    assert config["transformers.js_config"]["dtype"] == "fp32"
    pre = json.loads((pkg / "preprocessor_config.json").read_text())
    assert pre["feature_extractor_type"] == "WhisperFeatureExtractor"
    assert (pre["feature_size"], pre["n_fft"], pre["hop_length"], pre["sampling_rate"],
            pre["nb_max_frames"]) == (config["num_mel_bins"], 400, 160, 16_000, 3000)
    assert json.loads((pkg / "tokenizer_config.json").read_text())["tokenizer_class"] == \
        "WhisperTokenizer"
    gen = json.loads((pkg / "generation_config.json").read_text())
    for key in ("lang_to_id", "task_to_id", "no_timestamps_token_id", "suppress_tokens",
                "begin_suppress_tokens", "is_multilingual"):
        assert key in gen, key
    assert packages["int8"].manifest["transformers_js"]["files"]["encoder"] == \
        "onnx/encoder_model_quantized.onnx"
    assert packages["int4"].manifest["transformers_js"]["dtype"] == "q4"


@needs_browser
@pytest.mark.skipif(not HAVE_TJS,
                    reason="transformers.js is opt-in: bash scripts/setup-transformers-js.sh")
def test_transformers_js_pipeline_transcribes_to_tinyts_tokens(packages, small_whisper,
                                                               browser, tmp_path):  # noqa: F811
    from tinyt.export.web.serve import start
    from tinyt.export.web.speech_page import feature_bounds, speech_ties

    wav = tmp_path / "said.wav"
    subprocess.run(["espeak-ng", "-w", str(wav), "The quick brown fox jumps over the lazy dog."],
                   check=True, timeout=60)
    samples = load_audio(wav)  # 16 kHz: the pipeline takes samples at its sampling_rate
    with tempfile.TemporaryDirectory() as tmp:
        site, dist = Path(tmp), TJS / "@huggingface" / "transformers" / "dist"
        shutil.copy2(dist / "transformers.min.js", site)
        for f in ("ort-wasm-simd-threaded.asyncify.mjs", "ort-wasm-simd-threaded.asyncify.wasm"):
            shutil.copy2(TJS / "onnxruntime-web" / "dist" / f, site)
        for name, pkg in packages.items():
            shutil.copytree(pkg, site / "models" / name)  # each package, as it is
        (site / "index.html").write_text(PAGE)
        server, _ = start(site, 0)
        page = browser.new_page()
        try:
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html")
            page.wait_for_function("window.tjsReady === true", timeout=60_000)
            for name in packages:
                sm = rt.load(small_whisper[name], threads=1)
                page.evaluate(f"() => window.tjs.load('{name}')")
                got = page.evaluate(f"(x) => window.tjs.transcribe(x, {NEW_TOKENS})",
                                    samples.tolist())
                prompt = sm._prefix("en", "transcribe", False)
                assert got["tokens"][:len(prompt)] == prompt, got["tokens"]
                tokens = [t for t in got["tokens"][len(prompt):] if t != sm.eos]
                features = np.asarray(got["features"], np.float32).reshape(80, -1)
                lo, hi = feature_bounds(samples, 80)
                outside = (features < lo) | (features > hi)
                assert not outside.any(), (name, np.abs(features - log_mel(samples, 80)).max())
                if name == "int4":  # a row may part at a tie (the 4-bit kernels' activations)
                    speech_ties(sm, [features], [tokens], "en", new_tokens=NEW_TOKENS)
                    continue
                want = sm.transcribe(samples, language="en", max_new_tokens=NEW_TOKENS)
                assert tokens == want.tokens, (name, tokens, want.tokens)
                assert got["text"].strip() == want.text, (name, got["text"], want.text)
        finally:
            page.close()
            server.shutdown()
