"""Whisper's page (`tinyt package --format web` of a speech artifact: export/web/speech_page.py,
speech.mjs) in a real headless Chromium on ONNX Runtime Web's WebAssembly backend, on
tests/conftest.py's small_whisper (random weights, tiny's vocabulary and 80 mel bins) and
espeak-ng's speech written as a WAV, chosen in the page's file input as a user would.

- A 16-kHz WAV (32-bit float): the page's samples (Web Audio's decodeAudioData) are runtime/audio.load_audio's
  exactly; its log-mel features lie within speech_page.feature_bounds of exact arithmetic, as
  the runtime's do (numpy's float32 FFT is what rounds; measured ~1e-7 apart, the bound
  ~1e-3 at its widest, near the floor); its first window's greedy tokens equal
  SpeechModel.decode_features' on the page's features, and `rt.load(...).transcribe(wav)`'s, English forced and detected (fp32;
  an INT8 row may part only at a tie of the runtime's own logits: seq2seq_ties).
- espeak-ng's own 22,050-Hz WAV (16-bit PCM): the browser resamples (its resampler, not soxr's;
  and it reads positive PCM samples over 32,767 where libsndfile divides by 32,768), so the
  length and the tokens on the page's own features are compared.
- Long audio (espeak-ng's sentences with silences between, 65 s, as a 16-kHz float WAV):
  window by window with timestamps, the page's tokens, segments (times and text), text and
  the lines it shows equal `transcribe(wav, timestamps=True)`'s (fp32; INT8 the same, or
  parted only at a tie: speech_page.check_long_form), each window from where the runtime's
  seek rule says, a progress line a window.
- Audio over the page's limit (speech_page.MAX_SECONDS, 30 min: an 8-kHz 8-bit WAV of 30:01,
  refused from its header before it is decoded) and a file that is not audio: a message that
  names the problem; samples over the limit passed to transcribe under Node, likewise.
- Under Node: longform.mjs' splitSegments and whisperRules against the runtime's
  split_segments and WhisperRules on hand-made cases, and clock's mm:ss.xx.
- Under Node (no browser): the INT4 package's own check, and the checks refusing features
  one frame off and a token the runtime does not rank near the top; logMel at 80 and 128 bins
  and on exactly 30 s; a transcript's text as the runtime's, "" for only special tokens.
- The microphone button on Chromium's fake device (a beep): recorded, decoded, transcribed to
  the runtime's tokens on the page's own features. A real microphone is not tested.
Needs node + onnxruntime-web, chromium, playwright (tests/export/test_web.py's browser) and
espeak-ng."""
from __future__ import annotations

import base64
import json
import shutil
import subprocess

import numpy as np
import pytest
from test_web import browser, needs_browser, needs_web  # noqa: F401 (browser: a fixture)

import tinyt.runtime as rt
from tinyt.runtime.audio import load_audio, log_mel

SAID = "The quick brown fox jumps over the lazy dog."
LONG_SAID = [SAID, "She sells sea shells by the sea shore, and the shells she sells are sea "
             "shells for sure.", "Peter Piper picked a peck of pickled peppers.",
             "How much wood would a woodchuck chuck if a woodchuck could chuck wood?"] * 3
NEW_TOKENS = 12
# a long window's tokens: the small Whisper writes five segments, then text to the end of the
# decoder without closing a sixth (dropped, as the runtime drops it): 20 give the same windows
# and segments as 445, in a twentieth of the steps
LONG_NEW_TOKENS = 20
pytestmark = [needs_web, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                 reason="espeak-ng is not installed (scripts/setup.sh)")]


@pytest.fixture(scope="module")
def wavs(tmp_path_factory):
    """{"22k": espeak-ng's WAV (16-bit PCM), "16k": the same resampled by soxr, 32-bit float at
    16 kHz (Chromium reads 16-bit PCM's positive samples over 32,767, libsndfile over 32,768),
    "long": LONG_SAID spoken one after another with 1.5-2.5 s of silence between (65 s,
    float at 16 kHz), "too_long": 1 s over the page's limit of silence (8 kHz, 8 bits: 14 MB),
    "text": a file that is not audio}."""
    import soundfile

    from tinyt.export.web.speech_page import MAX_SECONDS

    root = tmp_path_factory.mktemp("wavs")
    made = {"22k": root / "said-22k.wav", "16k": root / "said-16k.wav",
            "long": root / "long.wav", "too_long": root / "too-long.wav",
            "text": root / "notes.wav"}
    subprocess.run(["espeak-ng", "-w", str(made["22k"]), SAID], check=True, timeout=60)
    soundfile.write(made["16k"], load_audio(made["22k"]), 16_000, subtype="FLOAT")
    parts = []
    for i, text in enumerate(LONG_SAID):
        subprocess.run(["espeak-ng", "-w", str(root / "part.wav"), text], check=True, timeout=60)
        parts += [load_audio(root / "part.wav"), np.zeros(int(16_000 * (1.5 + 0.5 * (i % 3))),
                                                          np.float32)]
    soundfile.write(made["long"], np.concatenate(parts), 16_000, subtype="FLOAT")
    soundfile.write(made["too_long"], np.zeros((MAX_SECONDS + 1) * 8_000, np.float32), 8_000,
                    subtype="PCM_U8")
    made["text"].write_text("not audio at all\n")
    return made


@pytest.fixture(scope="module")
def packages(small_whisper, tmp_path_factory):
    from tinyt.export.package import package

    root = tmp_path_factory.mktemp("speech-web")
    return {name: package(small_whisper[name], root / name, format="web")
            for name in ("fp32", "int8")}


# A Float32Array's bytes as base64, in the page
BASE64 = ("(x) => { const b = new Uint8Array(x.buffer, x.byteOffset, x.byteLength); let s = '';"
          " for (let i = 0; i < b.length; i += 32768) s += String.fromCharCode.apply(null, "
          "b.subarray(i, i + 32768)); return btoa(s); }")


def transcribe_in_page(browser, pkg, wav, language: str = "en", new_tokens: int | None = NEW_TOKENS,  # noqa: F811
                       ) -> tuple[dict, dict, dict]:
    """The page's result JSON for `wav` chosen in its file input, its samples and features
    (window.tinyt.last; None after an error), and what it shows ({"out": the transcript,
    "progress": its lines}). new_tokens: a window's (None: the field left empty)."""
    from tinyt.export.web.serve import start

    server, _ = start(pkg, 0)
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html")
        page.wait_for_function("!document.getElementById('audio').disabled", timeout=60_000)
        page.select_option("#language", language)
        page.fill("#max_new_tokens", "" if new_tokens is None else str(new_tokens))
        page.set_input_files("#audio", str(wav))
        page.wait_for_function("document.getElementById('result').textContent.length > 0",
                               timeout=120_000)
        result = json.loads(page.inner_text("#result"))
        last = page.evaluate(f"() => window.tinyt.last && {{samples: ({BASE64})("
                             f"window.tinyt.last.samples), features: ({BASE64})("
                             "window.tinyt.last.features)}")
        if last is not None:  # float32 arrays' bytes (a JSON list of 10^6 numbers takes ~10 s)
            last = {k: np.frombuffer(base64.b64decode(v), np.float32) for k, v in last.items()}
        shown = {"out": page.inner_text("#out"), "progress": page.inner_text("#progress")}
        assert not errors, errors
        return result, last, shown
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
        got, last, _ = transcribe_in_page(browser, packages[name], wavs["16k"], language)
        assert "error" not in got, got
        page_samples = np.asarray(last["samples"], np.float32)
        assert page_samples.shape == samples.shape and np.array_equal(page_samples, samples)
        features = np.asarray(last["features"], np.float32).reshape(80, -1)
        worst = check_features(features, log_mel(samples, 80), samples, 80)
        assert worst["max_abs_diff"] < worst["widest_bound"]
        want = sm.transcribe(wavs["16k"], language=language or None, max_new_tokens=NEW_TOKENS)
        assert got["language"] == want.language and (got["language"] == "en" or not language)
        speech_ties(sm, [features], [got["windows"][0]["tokens"]], want.language,  # a tie at most
                    new_tokens=NEW_TOKENS)
        if name == "fp32":  # these logits are far from ties: every token the same
            assert got["token_ids"] == want.tokens and got["text"] == want.text
            assert got["prompt"] == sm._prefix(want.language, "transcribe", False)


def clock(seconds: float) -> str:
    """The page's "mm:ss.xx"."""
    m, cs = divmod(round(seconds * 100), 6000)
    return f"{m:02d}:{cs / 100:05.2f}"


@needs_browser
@pytest.mark.parametrize("name", ["fp32", "int8"])
def test_page_transcribes_long_audio_window_by_window_as_the_runtime(
        packages, small_whisper, wavs, browser, name):  # noqa: F811
    """65 s of speech and silences: the page's windows, tokens, segments and text are
    transcribe(wav, timestamps=True)'s (its default path: greedy; LONG_NEW_TOKENS a window
    both); the page shows each segment as "[mm:ss.xx -> mm:ss.xx] text" and a
    progress line a window."""
    from tinyt.errors import WebPackageError
    from tinyt.export.web.speech_page import check_long_form

    sm = rt.load(small_whisper[name], threads=1)
    samples = load_audio(wavs["long"])
    got, last, shown = transcribe_in_page(browser, packages[name], wavs["long"],
                                          new_tokens=LONG_NEW_TOKENS)
    assert "error" not in got, got
    assert np.array_equal(np.asarray(last["samples"], np.float32), samples)
    want = sm.transcribe(wavs["long"], language="en", timestamps=True,
                         max_new_tokens=LONG_NEW_TOKENS)
    seeks = [w["seek"] for w in got["windows"]]
    # three windows, the later ones from the last complete segment's end, not 30-s steps
    assert len(seeks) == 3 and seeks[0] == 0 and any(k % 3000 for k in seeks), seeks
    assert shown["progress"].splitlines() == [
        *(f"window {i + 1}: from {k / 100:.2f} of {samples.size // 160 / 100:.2f} s"
          for i, k in enumerate(seeks)), f"done: {samples.size // 160 / 100:.2f} s in 3 windows"]
    answer = {**got, "features": last["features"]}
    # each window's tokens the runtime's on the page's own window, or parted at a tie (INT8:
    # the features' float32 step apart may move one int8 rounding of the encoder's input)
    ties = check_long_form(sm, answer, samples, "en", LONG_NEW_TOKENS)
    assert ties == 0 or name != "fp32"  # fp32's logits are far from ties
    if name == "fp32" or got["token_ids"] == want.tokens:
        assert got["token_ids"] == want.tokens and got["text"] == want.text
        assert [(s["start"], s["end"], s["tokens"], s["text"]) for s in got["segments"]] == \
            [(s.start, s.end, list(s.tokens), s.text) for s in want.segments]
        assert shown["out"].splitlines() == [f"[{clock(s.start)} -> {clock(s.end)}] {s.text}"
                                             for s in want.segments if s.text]
    if name == "fp32":  # the check refuses a window that starts elsewhere, a segment moved
        moved = {**answer, "windows": [dict(w) for w in answer["windows"]]}
        moved["windows"][1]["seek"] += 2
        with pytest.raises(WebPackageError, match="window 1 starts at frame"):
            check_long_form(sm, moved, samples, "en", LONG_NEW_TOKENS)
        moved = {**answer, "segments": [dict(x) for x in answer["segments"]]}
        moved["segments"][-1]["end"] += 0.02
        with pytest.raises(WebPackageError, match="are not split_segments'"):
            check_long_form(sm, moved, samples, "en", LONG_NEW_TOKENS)


@needs_browser
def test_page_resamples_other_rates_and_names_bad_audio(packages, small_whisper, wavs,
                                                        browser):  # noqa: F811
    from tinyt.export.web.speech_page import speech_ties

    sm = rt.load(small_whisper["fp32"], threads=1)
    got, last, _ = transcribe_in_page(browser, packages["fp32"], wavs["22k"])
    import soundfile

    frames = soundfile.info(str(wavs["22k"])).frames
    assert abs(len(last["samples"]) - frames * 16_000 / 22_050) <= 1
    features = np.asarray(last["features"], np.float32).reshape(80, -1)
    assert speech_ties(sm, [features], [got["windows"][0]["tokens"]], "en",
                       new_tokens=NEW_TOKENS) == 0
    got, last, _ = transcribe_in_page(browser, packages["fp32"], wavs["too_long"])
    assert got["error"].startswith("the audio lasts 30:01.00 (1801.0 s); the page transcribes "
                                   "at most 30:00.00 (what a browser tab holds)"), got
    assert last is None  # refused from the file's header: nothing decoded
    got, last, _ = transcribe_in_page(browser, packages["fp32"], wavs["text"])
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
    assert "log-mel features within the FFT's rounding and greedy tokens as tinyt's, long " \
        "audio window by window as tinyt transcribe's" in said
    pkg = tmp_path / "int4"
    m = open_artifact_dir(pkg).manifest.data
    assert m["package_format"] == "web" and m["quantization"]["recipe"]["bits"] == 4
    checked = m["web"]["checked"]
    assert checked["greedy_equal"] and checked["languages"] == ["en", "detected"]
    assert checked["long_form"]["windows"] == 2 and checked["long_form"]["timestamps"]
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


def test_long_form_pieces_as_the_runtimes(packages, small_whisper, tmp_path):
    """Under Node: longform.mjs' splitSegments as runtime/transcribe.split_segments (lone and
    paired endings, no timestamps, a window cut short, an offset), whisperRules as
    WhisperRules.apply (the tokens each leaves: a first token, an open timestamp, a closed
    pair, the timestamp forced by its total probability, no timestamps), clock's times, and
    transcribe's refusal of samples over the limit."""
    from tinyt.export.web.speech_page import MAX_SECONDS
    from tinyt.runtime.transcribe import split_segments

    sm = rt.load(small_whisper["fp32"], threads=1)
    T, pkg = sm.tokens["timestamp_begin"], packages["fp32"]
    web = json.loads((pkg / "web.json").read_text())
    speech, V = web["speech"], web["choosable"]  # the logits the page's rules see
    splits = [([], 0.0, 3000), ([T, 300, T + 5], 0.0, 3000), ([300, 400], 29.68, 521),
              ([T, 300, T + 5, T + 5, 301, T + 9, T + 9, 302], 29.68, 3000),
              ([T, 300, T + 5, T + 5, 301, T + 9], 0.0, 3000), ([T, 300, 301], 59.36, 585),
              ([T + 3, 300, T + 7, T + 8, 301], 0.0, 3000), ([T + 4, 300], 12.0, 3000)]
    prompt = sm._prefix("en", "transcribe", True)
    rng = np.random.default_rng(0)
    rules = []
    for gen, timestamps, lift in (([], True, 0), ([T + 10], True, 0), ([T + 10, 300], True, 0),
                                  ([T + 10, 300, T + 20], True, 0),
                                  ([T + 10, 300, T + 20, T + 20], True, 0),
                                  ([T + 10, 300, 400], True, 9), ([T + 10, 300], True, -9),
                                  ([], False, 0),
                                  ([300, 400], False, 0)):
        z = rng.normal(0, 3, V).astype(np.float32)
        z[T:] += lift  # the timestamps' total probability over every text token's: one forced
        p = prompt if timestamps else sm._prefix("en", "transcribe", False)
        want = z[None].copy()
        sm._settings(len(p), timestamps, None).rules.apply(want, [p + gen], len(gen))
        rules.append({"z": z.tolist(), "history": p + gen, "begin": len(p), "made": len(gen),
                      "timestamps": timestamps, "want": np.flatnonzero(np.isinf(want[0])).tolist()})
    (tmp_path / "cases.json").write_text(json.dumps({"splits": splits, "rules": rules,
                                                     "speech": speech}))
    from tinyt.export.web.tools import node

    script = (
        "import fs from 'node:fs'; import { pathToFileURL } from 'node:url';"
        f"const pkg = {json.dumps(str(pkg))};"
        "const L = await import(pathToFileURL(pkg + '/longform.mjs').href);"
        "const { load } = await import(pathToFileURL(pkg + '/tinyt.mjs').href);"
        "const c = JSON.parse(fs.readFileSync('cases.json', 'utf8'));"
        "const splits = c.splits.map(([t, off, f]) => L.splitSegments(t, " + str(T) + ", off, f));"
        "const rules = c.rules.map((r) => { const z = Float32Array.from(r.z);"
        "  L.whisperRules(c.speech, r.begin, r.timestamps)(z, r.history, r.made);"
        "  return [...z.keys()].filter((i) => z[i] === -Infinity); });"
        "const clocks = [0, 4.2, 59.999, 61.02, 3600.5].map(L.clock);"
        "const asr = await load(pkg, { fetch: async (u) => new Uint8Array(fs.readFileSync(u)) });"
        f"let refused = ''; try {{ await asr.transcribe(new Float32Array({(MAX_SECONDS + 1) * 16_000}"
        ")); } catch (e) { refused = e.message; }"
        "process.stdout.write(JSON.stringify({ splits, rules, clocks, refused }));")
    (tmp_path / "run.mjs").write_text(script)
    out = json.loads(subprocess.run([node(), "run.mjs"], cwd=tmp_path, capture_output=True,
                                    timeout=120, check=True).stdout)
    assert len(out["splits"]) == len(splits) and len(out["rules"]) == len(rules)
    for (tokens, offset, frames), got in zip(splits, out["splits"]):
        pieces, advance = split_segments(tokens, T, offset, frames)
        assert got == {"segments": [{"start": round(a, 3), "end": round(b, 3), "tokens": list(p)}
                                    for a, b, p in pieces], "advance": advance}, tokens
    for case, got in zip(rules, out["rules"]):
        assert got == case["want"], (case["history"], case["made"])
    # the forced timestamp: every text token refused; not forced: most of them left
    assert rules[5]["want"][:T] == list(range(T)) and sum(i < T for i in rules[6]["want"]) < T / 2
    assert out["clocks"] == ["00:00.00", "00:04.20", "01:00.00", "01:01.02", "60:00.50"]
    assert out["refused"].startswith("the audio lasts 30:01.00 (1801.0 s); the page "
                                     "transcribes at most 30:00.00"), out["refused"]


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
    assert speech_ties(sm, [features], [got["windows"][0]["tokens"]], "en",
                       new_tokens=NEW_TOKENS) == 0
