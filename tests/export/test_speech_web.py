"""Whisper's page (`tinyt package --format web` of a speech artifact: export/web/speech_page.py,
speech.mjs) in a real headless Chromium on ONNX Runtime Web's WebAssembly backend, on
tests/conftest.py's small_whisper (random weights, tiny's vocabulary and 80 mel bins) and
espeak-ng's speech written as a WAV, chosen in the page's file input as a user would.

- A 16-kHz WAV (32-bit float): the page's samples (Web Audio's decodeAudioData) are runtime/audio.load_audio's
  exactly; its log-mel features lie within speech_page.feature_bounds of exact arithmetic, as
  the runtime's do (numpy's float32 FFT is what rounds; measured ~1e-7 apart, the bound
  ~1e-3 at its widest, near the floor); its greedy tokens equal SpeechModel.decode_features' on
  the page's features, and `rt.load(...).transcribe(wav)`'s, English forced and detected (fp32;
  an INT8 row may part only at a tie of the runtime's own logits: seq2seq_ties).
- espeak-ng's own 22,050-Hz WAV (16-bit PCM): the browser resamples (its resampler, not soxr's;
  and it reads positive PCM samples over 32,767 where libsndfile divides by 32,768), so the
  length and the tokens on the page's own features are compared.
- Audio over 30 s and a file that is not audio: a message that names the problem.
- Under Node (no browser): the INT4 package's own check, and the checks refusing features
  one frame off and a token the runtime does not rank near the top; logMel at 80 and 128 bins
  and on exactly 30 s; a transcript's text as the runtime's, "" for only special tokens.
- The microphone button on Chromium's fake device (a beep): recorded, decoded, transcribed to
  the runtime's tokens on the page's own features. A real microphone is not tested.
Needs node + onnxruntime-web, chromium, playwright (tests/export/test_web.py's browser) and
espeak-ng."""
from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from test_web import browser, needs_browser, needs_web  # noqa: F401 (browser: a fixture)

import tinyt.runtime as rt
from tinyt.runtime.audio import load_audio, log_mel

SAID = "The quick brown fox jumps over the lazy dog."
NEW_TOKENS = 12
pytestmark = [needs_web, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                 reason="espeak-ng is not installed (scripts/setup.sh)")]


@pytest.fixture(scope="module")
def wavs(tmp_path_factory):
    """{"22k": espeak-ng's WAV (16-bit PCM), "16k": the same resampled by soxr, 32-bit float at
    16 kHz (Chromium reads 16-bit PCM's positive samples over 32,767, libsndfile over 32,768),
    "long": 31 s of quiet noise at 16 kHz, "text": a file that is not audio}."""
    import soundfile

    root = tmp_path_factory.mktemp("wavs")
    made = {"22k": root / "said-22k.wav", "16k": root / "said-16k.wav",
            "long": root / "long.wav", "text": root / "notes.wav"}
    subprocess.run(["espeak-ng", "-w", str(made["22k"]), SAID], check=True, timeout=60)
    soundfile.write(made["16k"], load_audio(made["22k"]), 16_000, subtype="FLOAT")
    noise = np.random.default_rng(0).normal(0, 0.01, 31 * 16_000).astype(np.float32)
    soundfile.write(made["long"], noise, 16_000, subtype="PCM_16")
    made["text"].write_text("not audio at all\n")
    return made


@pytest.fixture(scope="module")
def packages(small_whisper, tmp_path_factory):
    from tinyt.export.package import package

    root = tmp_path_factory.mktemp("speech-web")
    return {name: package(small_whisper[name], root / name, format="web")
            for name in ("fp32", "int8")}


def transcribe_in_page(browser, pkg, wav, language: str = "en") -> tuple[dict, dict]:  # noqa: F811
    """The page's result JSON for `wav` chosen in its file input, and its samples and features
    (window.tinyt.last; None after an error)."""
    from tinyt.export.web.serve import start

    server, _ = start(pkg, 0)
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html")
        page.wait_for_function("!document.getElementById('audio').disabled", timeout=60_000)
        page.select_option("#language", language)
        page.fill("#max_new_tokens", str(NEW_TOKENS))
        page.set_input_files("#audio", str(wav))
        page.wait_for_function("document.getElementById('result').textContent.length > 0",
                               timeout=120_000)
        result = json.loads(page.inner_text("#result"))
        last = page.evaluate("() => window.tinyt.last && {samples: Array.from("
                             "window.tinyt.last.samples), features: Array.from("
                             "window.tinyt.last.features)}")
        assert not errors, errors
        return result, last
    finally:
        page.close()
        server.shutdown()


@needs_browser
@pytest.mark.parametrize("name", ["fp32", "int8"])
def test_page_transcribes_a_wav_to_the_runtimes_tokens(packages, small_whisper, wavs, browser,  # noqa: F811
                                                       name):
    from tinyt.export.web.speech_page import check_features, speech_ties

    sm = rt.load(small_whisper[name], threads=1)
    samples = load_audio(wavs["16k"])
    for language in ("en", ""):  # forced, then detected
        got, last = transcribe_in_page(browser, packages[name], wavs["16k"], language)
        assert "error" not in got, got
        page_samples = np.asarray(last["samples"], np.float32)
        assert page_samples.shape == samples.shape and np.array_equal(page_samples, samples)
        features = np.asarray(last["features"], np.float32).reshape(80, -1)
        worst = check_features(features, log_mel(samples, 80), samples, 80)
        assert worst["max_abs_diff"] < worst["widest_bound"]
        want = sm.transcribe(wavs["16k"], language=language or None, max_new_tokens=NEW_TOKENS)
        assert got["language"] == want.language and (got["language"] == "en" or not language)
        speech_ties(sm, [features], [got["token_ids"]], want.language, new_tokens=NEW_TOKENS)  # a tie at most
        if name == "fp32":  # these logits are far from ties: every token the same
            assert got["token_ids"] == want.tokens and got["text"] == want.text
            assert got["prompt"] == sm._prefix(want.language, "transcribe", False)


@needs_browser
def test_page_resamples_other_rates_and_names_bad_audio(packages, small_whisper, wavs,
                                                        browser):  # noqa: F811
    from tinyt.export.web.speech_page import speech_ties

    sm = rt.load(small_whisper["fp32"], threads=1)
    got, last = transcribe_in_page(browser, packages["fp32"], wavs["22k"])
    import soundfile

    frames = soundfile.info(str(wavs["22k"])).frames
    assert abs(len(last["samples"]) - frames * 16_000 / 22_050) <= 1
    features = np.asarray(last["features"], np.float32).reshape(80, -1)
    assert speech_ties(sm, [features], [got["token_ids"]], "en", new_tokens=NEW_TOKENS) == 0
    got, last = transcribe_in_page(browser, packages["fp32"], wavs["long"])
    assert "the audio lasts 31.0 s; the page transcribes one 30-s window" in got["error"]
    got, last = transcribe_in_page(browser, packages["fp32"], wavs["text"])
    assert "the browser cannot decode this audio" in got["error"]


def test_int4_package_and_the_checks_that_refuse(small_whisper, tmp_path, monkeypatch, capsys):
    from cli_run import run_cli

    from tinyt.errors import WebPackageError
    from tinyt.export.speech_accuracy import voice
    from tinyt.export.web.speech_page import check_features, speech_ties
    from tinyt.manifest import open_artifact_dir

    code, said, err = run_cli(monkeypatch, capsys, "package", small_whisper["int4"],
                              tmp_path / "int4", "--format", "web")
    assert code == 0, err
    assert "log-mel features within the FFT's rounding and greedy tokens as tinyt's" in said
    pkg = tmp_path / "int4"
    m = open_artifact_dir(pkg).manifest.data
    assert m["package_format"] == "web" and m["quantization"]["recipe"]["bits"] == 4
    checked = m["web"]["checked"]
    assert checked["greedy_equal"] and checked["languages"] == ["en", "detected"]
    assert checked["features"]["max_abs_diff"] <= checked["features"]["widest_bound"]
    assert {"speech.mjs", "seq2seq.mjs", "mel_filters.bin", "index.html"} <= set(m["files"])
    assert (pkg / "mel_filters.bin").stat().st_size == 201 * 80 * 8
    samples = voice()
    ours = log_mel(samples, 80)
    moved = np.roll(ours, 1, axis=1)  # a frame off: beyond the bound
    with pytest.raises(WebPackageError, match="the page's log-mel features leave the FFT's"):
        check_features(moved, ours, samples, 80)
    sm = rt.load(small_whisper["fp32"], threads=1)
    want = sm.decode_features(ours[None], language="en", max_new_tokens=4)[0]
    assert speech_ties(sm, [ours], [want], "en", new_tokens=4) == 0
    with pytest.raises(WebPackageError, match="more than a tie"):  # a suppressed token
        speech_ties(sm, [ours], [[sm.suppress[0], *want[1:]]], "en", new_tokens=4)


def _run_node(folder, script: str) -> bytes:
    """`script` (an ES module) run by node in `folder`, beside speech.mjs and what it imports."""
    from tinyt.export.web.speech_page import MODULES
    from tinyt.export.web.tools import ASSETS, copy_runtime, node

    copy_runtime(folder)
    for f in MODULES:
        shutil.copy2(ASSETS / f, folder / f)
    (folder / "run.mjs").write_text(script)
    return subprocess.run([node(), "run.mjs"], cwd=folder, capture_output=True, timeout=120,
                          check=True).stdout


@pytest.mark.parametrize("n_mels", [80, 128])
def test_log_mel_in_javascript_at_either_width(n_mels, tmp_path):
    """speech.mjs' logMel under Node, the filters as the package writes them: within
    feature_bounds of exact arithmetic at Whisper's 80 bins and large-v3's 128, on speech and on
    exactly 30 s (the right end's reflection read)."""
    from tinyt.export.speech_accuracy import voice
    from tinyt.export.web.speech_page import check_features
    from tinyt.runtime.audio import mel_filters

    mel_filters(n_mels).astype("<f8").tofile(tmp_path / "filters.bin")
    for samples in (voice(), voice(30.0, seed=2)):  # speech; exactly 30 s
        samples.astype("<f4").tofile(tmp_path / "x.bin")
        out = _run_node(tmp_path, (
            "import { logMel } from './speech.mjs'; import fs from 'node:fs';"
            "const f = new Float64Array(new Uint8Array(fs.readFileSync('filters.bin')).buffer);"
            "const x = new Float32Array(new Uint8Array(fs.readFileSync('x.bin')).buffer);"
            f"process.stdout.write(Buffer.from(logMel(x, f, {n_mels}).buffer));"))
        page = np.frombuffer(out, np.float32).reshape(n_mels, -1)
        check_features(page, log_mel(samples, n_mels), samples, n_mels)  # or it raises


def test_transcript_text_as_the_runtimes(small_whisper, tmp_path):
    """speech.mjs' transcript: the ordinary tokens' text as SpeechModel._text gives it, and ""
    for none or only special tokens and timestamps (which the library refuses to decode)."""
    sm = rt.load(small_whisper["fp32"], threads=1)
    shutil.copy2(small_whisper["fp32"] / "tokenizer.json", tmp_path)
    cases = [[], [sm.eos + 1, sm.tokens["timestamp_begin"] + 3], [32115, 31857],
             [sm.tokens["timestamp_begin"], 32115, 220, 31857, sm.tokens["timestamp_begin"] + 9]]
    out = _run_node(tmp_path, (
        "import { transcript } from './speech.mjs'; import { Tokenizer } from './tinyt.mjs';"
        "import fs from 'node:fs';"
        "const tok = new Tokenizer(JSON.parse(fs.readFileSync('tokenizer.json', 'utf8')));"
        f"process.stdout.write(JSON.stringify({cases}.map((ids) => transcript(tok, ids, "
        f"{sm.eos}))));"))
    assert json.loads(out) == [sm._text(ids) for ids in cases]
    assert json.loads(out)[:2] == ["", ""]


@needs_browser
def test_microphone_with_chromiums_fake_device(packages, small_whisper, browser):  # noqa: F811
    """The record button on Chromium's fake microphone (--use-fake-device-for-media-stream: a
    beep; --use-fake-ui-for-media-stream grants it): about 2 s recorded by MediaRecorder,
    decoded as a file is, transcribed to the runtime's tokens on the page's own features."""
    import time

    from test_web import CHROMIUM

    from tinyt.export.web.serve import start
    from tinyt.export.web.speech_page import speech_ties

    server, _ = start(packages["fp32"], 0)
    errors: list[str] = []
    try:
        # a second Chromium on the fixture's Playwright, with the fake device
        b = browser.browser_type.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--use-fake-device-for-media-stream",
            "--use-fake-ui-for-media-stream"])
        try:
            page = b.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html")
            page.wait_for_function("!document.getElementById('mic').disabled", timeout=60_000)
            page.select_option("#language", "en")
            page.fill("#max_new_tokens", str(NEW_TOKENS))
            page.click("#mic")
            time.sleep(2)
            page.click("#mic")
            page.wait_for_function("document.getElementById('result').textContent.length",
                                   timeout=120_000)
            got = json.loads(page.inner_text("#result"))
            last = page.evaluate("() => ({peak: Math.max(...window.tinyt.last.samples), "
                                 "features: Array.from(window.tinyt.last.features)})")
        finally:
            b.close()
    finally:
        server.shutdown()
    assert "error" not in got and not errors, (got, errors)
    assert 1.0 <= got["seconds"] <= 10.0 and last["peak"] > 0.1  # the beep, recorded
    sm = rt.load(small_whisper["fp32"], threads=1)
    features = np.asarray(last["features"], np.float32).reshape(80, -1)
    assert speech_ties(sm, [features], [got["token_ids"]], "en", new_tokens=NEW_TOKENS) == 0
