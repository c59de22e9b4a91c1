"""Whisper's page against transformers.js' automatic-speech-recognition pipeline in one Chromium,
on the same weights and the same audio (issue 52, the page's peer): `python -m benchmarks.browser
--whisper ARTIFACTS --transformers-js web/transformers-js/node_modules`. The encoders' version
is browser_encoders.py (its transformers.js site and its ratios are reused here).

    ARTIFACTS/<variant> (tinyt's Whisper artifacts: whisper_peers --make tiny makes them)
      ──tinyt package --format web──▶ tinyt's speech page (speech.mjs, onnxruntime-web 1.30)
      ──tinyt package --format transformers-js──▶ the local model transformers.js' pipeline
          loads (encoder_model, decoder_model_merged; its own onnxruntime-web)
    the same samples for both: espeak-ng speaking sentences of tinyt's retrieval set (16 kHz)
    one headless Chromium, each engine in its own page on a loopback server (cross-origin
    isolated), the samples kept in the page:
      1. same tokens first (English forced, NEW greedy tokens a window): each page's tokens
         on its own log-mel features against tinyt.runtime's on those features
         (speech_page.speech_ties: equal, or parting only at a tie of the runtime's logits,
         else refused, never timed)
      2. per thread count, ROUNDS rounds interleaved (tinyt, transformers.js, tinyt, ...):
         one window greedy, samples in, transcript out (each engine's own log-mel, encoder,
         decoder and detokenizer), SETTLE untimed and BLOCK timed calls
    ──▶ OUT/results.json (environment, every time), OUT/results.md
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tinyt.errors import BenchError

from .browser_encoders import TIME_JS, Page, ratios, tjs_site
from .encoders import REST_S

VARIANTS = ("onnx", "onnx-int8")  # tinyt's Whisper rows both engines run
TJS_ASR_PAGE = """<!doctype html><meta charset="utf-8"><script type="module">
import { env, pipeline } from "./transformers.min.js";
env.allowLocalModels = true; env.allowRemoteModels = false; env.localModelPath = "./models/";
env.backends.onnx.wasm.numThreads = Number(new URLSearchParams(location.search).get("threads"));
env.backends.onnx.wasm.wasmPaths = new URL("./", location.href).href;  // no CDN: the copies here
window.tjs = {
  async load(name) { const t = performance.now();
    window.tjs.asr = await pipeline("automatic-speech-recognition", name, { device: "wasm" });
    return performance.now() - t; },
  async tokens(x, n) {  // the pipeline's features, and its model's generate on them
    const { input_features } = await window.tjs.asr.processor(x);
    const ids = await window.tjs.asr.model.generate({ inputs: input_features, language: "en",
                                                      task: "transcribe", max_new_tokens: n });
    return { tokens: Array.from(ids.data, Number), features: Array.from(input_features.data) };
  } };
window.tjsReady = true;
</script>"""
# one call of each engine: the page's samples in, a transcript out
CALL = {"tinyt": "window.tinyt.asr.transcribe(window.samples, { language: 'en', maxNewTokens: n })",
        "transformers.js": "window.tjs.asr(window.samples, { language: 'en', task: 'transcribe', "
                           "max_new_tokens: n })"}
TOKENS = {"tinyt": f"(async () => {{ const r = await {CALL['tinyt']}; return {{ tokens: "
                   "Array.from(r.tokenIds), features: Array.from(r.features) }; })()",
          "transformers.js": "window.tjs.tokens(window.samples, n)"}


@dataclass
class SpeechPage(Page):
    """One engine's page: tinyt's speech page on a variant's web package, or transformers.js'
    pipeline on the variant's transformers-js package (loaded and closed as the encoder pages)."""
    ready = "asr"

    def hold(self, samples: np.ndarray) -> None:
        """Keep `samples` in the page (window.samples), so that no timed call carries them."""
        self.page.evaluate("(x) => { window.samples = Float32Array.from(x); }", samples.tolist())

    def tokens(self, n: int) -> tuple[list[int], np.ndarray]:
        """The generated ids (no prompt) and the page's own features [n_mels, frames]."""
        got = self.page.evaluate(f"async (n) => {TOKENS[self.runner]}", n)
        return got["tokens"], np.asarray(got["features"], dtype=np.float32)

    def time(self, n: int, settle: int, block: int) -> list[float]:
        return self.page.evaluate(TIME_JS % ("n", CALL[self.runner]),
                                  {"n": n, "settle": settle, "block": block})

def speech(count: int, work: Path) -> list[np.ndarray]:
    """`count` windows of 16-kHz samples: espeak-ng speaking the retrieval set's sentences (the
    Whisper peers' windows, before their log-mel)."""
    from tinyt.export.retrieval_set import PASSAGES
    from tinyt.runtime.audio import load_audio

    if shutil.which("espeak-ng") is None:
        raise BenchError("espeak-ng is not installed: the benchmark speaks its windows with it "
                         "(apt-get install espeak-ng, or bash scripts/setup.sh)")
    said = [s.strip() + "." for p in PASSAGES for s in p.split(".") if len(s.split()) > 4]
    out = []
    for k in range(count):
        wav = work / f"said-{k}.wav"
        subprocess.run(["espeak-ng", "-w", str(wav), said[k % len(said)]], check=True,
                       timeout=60)
        out.append(load_audio(wav))
    return out


def check(engines: list[SpeechPage], artifacts: Path, windows: list[np.ndarray],
          n: int) -> dict[str, dict]:
    """Each page's greedy tokens on each window against tinyt.runtime's on that page's own
    features (fp32 and INT8 alike: speech_ties): {name: {tokens, ties, equal, refused}}."""
    import tinyt.runtime as rt
    from tinyt.errors import WebPackageError
    from tinyt.export.web.speech_page import speech_ties

    out: dict[str, dict] = {}
    for e in engines:
        sm = rt.load(artifacts / e.variant, threads=1)
        prompt = sm._prefix("en", "transcribe", False)
        got, features = [], []
        for samples in windows:
            e.hold(samples)
            ids, f = e.tokens(n)
            if e.runner == "transformers.js":  # its generate returns the prompt too
                if ids[:len(prompt)] != prompt:
                    raise BenchError(f"{e.name}: its tokens start {ids[:6]}, not the prompt "
                                     f"{prompt}")
                ids = [t for t in ids[len(prompt):] if t != sm.eos]
            got.append(ids)
            features.append(f.reshape(sm.n_mels, -1))
        row = {"tokens": got}
        try:
            row["ties"] = speech_ties(sm, features, got, "en", new_tokens=n)
            row["refused"] = None
        except WebPackageError as err:  # beyond a tie: another model, a wrong conversion
            row["ties"], row["refused"] = None, " ".join(str(err).split())[:300]
        out[e.name] = row
    names = list(out)
    for a in names:  # the engines on one variant against each other, token by token
        for b in names[names.index(a) + 1:]:
            if a.split(":")[1] == b.split(":")[1]:
                out[b][f"same_as_{a}"] = out[a]["tokens"] == out[b]["tokens"]
    return out


def run(artifacts: Path, out: Path, transformers_js: Path | None, *,
        variants: tuple[str, ...] = VARIANTS, threads: tuple[int, ...] = (1, 2),
        rounds: int = 5, settle: int = 1, block: int = 1, check_windows: int = 3,
        new_tokens: int = 32, log=print) -> dict:
    """Check, then time tinyt's speech page (and transformers.js' pipeline) on ARTIFACTS'
    variants (module docstring); writes OUT/results.json and results.md."""
    _check_options(artifacts, variants, threads, rounds=rounds, settle=settle, block=block,
                   check_windows=check_windows, new_tokens=new_tokens)
    from playwright.sync_api import sync_playwright

    from tinyt.export.package import package
    from tinyt.export.web.serve import chromium

    from ..environment import environment

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        work = Path(tmp)
        engines = [SpeechPage("tinyt", v, f"tinyt {v}", package(
            artifacts / v, work / "web" / v, format="web")) for v in variants]
        version = None
        if transformers_js is not None:
            version = tjs_site(Path(transformers_js), work / "tjs-files", TJS_ASR_PAGE)
            for v in variants:
                site = work / "tjs" / v
                shutil.copytree(work / "tjs-files", site)
                package(artifacts / v, site / "models" / "m", format="transformers-js")
                engines.append(SpeechPage("transformers.js", v, f"tinyt {v}", site))
        windows = speech(check_windows, work)
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        result = {"artifacts": str(artifacts), "variants": list(variants),
                  "model": _shape(artifacts),
                  "environment": {**environment(("tinyt", "onnxruntime", "playwright"),
                                                load_average=os.getloadavg()),
                                  "chromium": browser.version, "transformers_js": version},
                  "method": {"rounds": rounds, "settle": settle, "block": block,
                             "check_windows": check_windows, "new_tokens": new_tokens,
                             "timed": "window 0: samples in, transcript out"},
                  "loads": [], "check": {}, "refused": {}, "rows": []}
        try:
            for n in threads:
                for e in engines:
                    result["loads"].append({"engine": e.name, "threads": n,
                                            **e.open(browser, n)})
                live = [e for e in engines if "error" not in e.info]
                if n == threads[0]:  # the same tokens first, once
                    log(f"checking {len(live)} page(s) on {check_windows} window(s)")
                    result["check"] = check(live, artifacts, windows, new_tokens)
                    result["refused"] = {k: c["refused"] for k, c in result["check"].items()
                                         if c["refused"]}
                live = [e for e in live if e.name not in result["refused"]]
                for e in live:
                    e.hold(windows[0])
                result["rows"] += _time_rounds(live, new_tokens, n, rounds, settle, block, log)
                for e in engines:
                    e.close()
        finally:
            for e in engines:
                e.close()
            browser.close()
    ratios(result["rows"])
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "results.md").write_text(markdown(result))
    return result


def _shape(artifacts: Path) -> dict:
    """The Whisper's widths, layers, mel bins and vocabulary (ARTIFACTS/hf's config.json)."""
    cfg = artifacts / "hf" / "config.json"
    keys = ("d_model", "encoder_layers", "decoder_layers", "num_mel_bins", "vocab_size")
    return {k: v for k, v in json.loads(cfg.read_text()).items() if k in keys} \
        if cfg.is_file() else {}


def _check_options(artifacts: Path, variants: tuple[str, ...], threads: tuple[int, ...],
                   **counts: int) -> None:
    """Refuse a variant not made and bad counts, every problem at once, before any work."""
    least = {"rounds": 0, "settle": 0, "block": 1, "check_windows": 1, "new_tokens": 1}
    problems = [f"{k}={v!r}: an integer >= {least[k]}" for k, v in counts.items()
                if not (isinstance(v, int) and v >= least[k])]
    if not (threads and all(isinstance(n, int) and n >= 1 for n in threads)):
        problems.append(f"threads={list(threads)}: each an integer >= 1")
    problems += [f"{artifacts / v} holds no tinyt artifact (python -m "
                 f"tinyt.benchmarks.peers.whisper_peers {artifacts} --make tiny --rounds 0 "
                 "makes onnx, onnx-opt, onnx-int8)" for v in variants
                 if not (artifacts / v / "manifest.json").is_file()]
    if problems:
        raise BenchError("; ".join(problems))


def _time_rounds(live: list[SpeechPage], n: int, threads: int, rounds: int, settle: int,
                 block: int, log) -> list[dict]:
    """`rounds` rounds interleaved across the live pages, each starting one page on: a row per
    engine (every time, the median)."""
    times: dict[str, list[float]] = {e.name: [] for e in live}
    for r in range(rounds if live else 0):
        log(f"{threads} thread(s): round {r + 1}/{rounds}")
        for e in live[r % len(live):] + live[:r % len(live)]:
            times[e.name] += e.time(n, settle, block)
            time.sleep(REST_S)
    return [{"engine": name, "threads": threads, "call": "window", "times_ms": ms,
             "median_ms": statistics.median(ms)} for name, ms in times.items() if ms]


def markdown(result: dict) -> str:
    env, m = result["environment"], result["method"]
    cfg = result["model"]
    flags = [k for k, v in env["cpu"].items() if v is True]
    shape = ", ".join(f"{k} {cfg[k]}" for k in ("d_model", "encoder_layers", "decoder_layers",
                                                 "num_mel_bins", "vocab_size") if k in cfg)
    lines = [f"# Whisper's page against transformers.js ({shape})", "",
             f"{env['cpu'].get('model')}; {', '.join(flags)}; {env['physical_cores']} physical "
             f"cores; 1-min load average {env['load_average'][0]:.1f} before; Chromium "
             f"{env.get('chromium')}, headless; tinyt's page on ONNX Runtime Web 1.30.0; "
             f"transformers.js {env.get('transformers_js') or '(not run)'}; "
             f"{result['artifacts']}; {env['time']}", "",
             f"One 30-s window of espeak-ng speech, English, {m['new_tokens']} greedy tokens: "
             "samples in, transcript out (each engine's own log-mel, encoder, decoder and "
             f"detokenizer). Median of {m['rounds']} interleaved rounds × {m['block']} calls "
             f"(after {m['settle']} untimed), each engine in its own page. × same graph: the "
             "time over tinyt's page on the same artifact; × tinyt best: over the fastest tinyt "
             "page at that thread count; above 1, tinyt is faster.", "",
             "| engine | threads | ms (1 window) | × same graph | × tinyt best |",
             "|---|---|---|---|---|"]
    x = lambda v: "–" if v is None else f"{v:.2f}"  # noqa: E731
    for r in result["rows"]:
        lines.append(f"| {r['engine']} | {r['threads']} | {r['median_ms']:.0f} | "
                     f"{x(r['x_same_graph'])} | {x(r['x_tinyt_best'])} ({r['tinyt_best']}) |")
    lines += ["", f"Same tokens first ({m['check_windows']} windows, {m['new_tokens']} tokens "
              "each): each page's greedy tokens on its own log-mel features against "
              "tinyt.runtime's on those features; equal, or parting only at a tie of the "
              "runtime's logits (speech_page.speech_ties), else refused and not timed.", "",
              "| engine | windows parting at a tie | tokens as tinyt's page's | verdict |",
              "|---|---|---|---|"]
    for name, c in result["check"].items():
        same = [v for k, v in c.items() if k.startswith("same_as_")]
        verdict = f"REFUSED: {c['refused']}" if c["refused"] else "checked"
        lines.append(f"| {name} | {c['ties'] if c['ties'] is not None else '–'} | "
                     f"{('yes' if all(same) else 'no') if same else '–'} | {verdict} |")
    lines += ["", "| engine | threads | load ms | isolated |", "|---|---|---|---|"]
    for r in result["loads"]:
        said = f"cannot load: {r['error']}" if "error" in r else f"{r['load_ms']:.0f}"
        lines.append(f"| {r['engine']} | {r['threads']} | {said} | {r.get('isolated', '')} |")
    return "\n".join(lines) + "\n"
