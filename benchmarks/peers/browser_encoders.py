"""tinyt's encoder page against transformers.js in one Chromium, on the same weights (issue 31,
the page's peer): `python -m benchmarks.browser --encoder`.

    ST_DIR (default: random weights at all-MiniLM-L6-v2's shape, encoders.build_st)
      ──import──▶ ckpt ──export──▶ onnx ──optimize──▶ opt ──quantize──▶ int8 (MatMulNBits)
                                                   └──quantize──▶ int8-qgemm (MatMulInteger)
      each of GRAPHS ──tinyt package --format web──▶ tinyt's page (tinyt.mjs, onnxruntime-web 1.30)
      each of GRAPHS ──▶ a local transformers.js model (its own onnxruntime-web): tinyt's
          config.json (the imported BertConfig) and tokenizer.json, ST_DIR's tokenizer_config.json,
          onnx/model.onnx = that variant's graph, run by pipeline("feature-extraction") with
          mean pooling and normalize; where it cannot load tinyt's fp32 graph, Optimum's export
          of ST_DIR (the project's .venv optimum) instead, and the report says so
    one headless Chromium, every page on a loopback server with cross-origin isolation:
      1. same embeddings: the retrieval set's texts through tinyt.runtime (Python, fp32) and every
         page; an fp32 engine below EXACT_COSINE (0.9999) on any text is refused before anything
         is timed; INT8 reports its cosine
      2. per thread count: every engine's page loaded (its load ms), then ROUNDS rounds
         interleaved (A, B, C, A, B, C, ...), each call SETTLE untimed and BLOCK timed: texts/s
         for 32 texts of 128 tokens and ms for one text of 16 (texts in, vectors out: each
         engine's own tokenization included)
    ──▶ OUT/results.json (environment, every time), OUT/results.md: medians, and each engine's
        time over the tinyt page's on the same graph and over the fastest tinyt page's

    .venv/bin/python -m benchmarks.browser --encoder --transformers-js \\
        web/transformers-js/node_modules --out benchmarks/results/browser-encoders-epyc-vnni

Without --transformers-js only tinyt's pages run (checked against the runtime and timed).
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

import numpy as np

from tinyt.errors import BenchError

from .encoders import EXACT_COSINE, REST_S, SHAPES, build_st, st_settings, texts_of

# How each artifact is made from the one before (the stage, its source, its options); the page
# and transformers.js run each of GRAPHS. MatMulNBits (int8) is the native runtime's
# fastest INT8; WebAssembly runs MatMulInteger (int8-qgemm) faster (docs/web.md).
STAGES = {"onnx": ("export", "ckpt", {}), "opt": ("optimize", "onnx", {}),
          "int8": ("quantize", "opt", {}), "int8-qgemm": ("quantize", "opt", {"kernel": "qgemm"})}
# the graphs whose pages it runs by default: its own stages' directories (STAGES), not the
# artifact catalogue's rows
GRAPHS = ("onnx", "int8", "int8-qgemm")
EXACT = {"onnx", "opt"}  # fp32 graphs: their embeddings must be the runtime's
THROUGHPUT, LATENCY = (32, 128), (1, 16)  # (texts, tokens) of the two calls
TJS_ORT_FILES = ("ort-wasm-simd-threaded.asyncify.mjs", "ort-wasm-simd-threaded.asyncify.wasm")

TJS_PAGE = """<!doctype html><meta charset="utf-8"><script type="module">
import { env, pipeline } from "./transformers.min.js";
env.allowLocalModels = true; env.allowRemoteModels = false; env.localModelPath = "./models/";
env.backends.onnx.wasm.numThreads = Number(new URLSearchParams(location.search).get("threads"));
env.backends.onnx.wasm.wasmPaths = new URL("./", location.href).href;  // no CDN: the copies here
window.tjs = { async load(name) { const t = performance.now();
    window.tjs.extract = await pipeline("feature-extraction", name,
                                        { dtype: "fp32", device: "wasm" });
    return performance.now() - t; } };
window.tjsReady = true;
</script>"""
# one call of each engine: texts in, sentence vectors out
CALL = {"tinyt": "window.tinyt.lm.embed(texts, { batchSize: batch })",
        "transformers.js": "window.tjs.extract(texts, { pooling: 'mean', normalize: true })"}
VECTORS = {"tinyt": f"(await {CALL['tinyt']}).map((e) => Array.from(e))",
           "transformers.js": f"(await {CALL['transformers.js']}).tolist()"}
# a page function: `settle` untimed calls, then `block` timed ones (ms); %s: the call's own
# arguments, then the call (the Whisper page's too)
TIME_JS = """async ({%s, settle, block}) => {
  const call = () => %s;
  for (let i = 0; i < settle; i++) await call();
  const ms = [];
  for (let i = 0; i < block; i++) {
    const t = performance.now(); await call(); ms.push(performance.now() - t); }
  return ms; }"""


@dataclass
class Page:
    """One page in the browser: tinyt's page on a variant's package, or transformers.js on a
    variant's graph (the encoder pages; browser_whisper.SpeechPage is the speech page)."""
    runner: str  # "tinyt" | "transformers.js"
    variant: str
    graph: str  # what it loads: "tinyt <variant>" or "optimum" (transformers.js' fallback)
    site: Path  # the folder its server hosts
    page: object = None
    server: object = None
    info: dict = field(default_factory=dict)
    ready = "lm"  # what tinyt's page sets once loaded: window.tinyt.<ready>

    @property
    def name(self) -> str:
        return f"{self.runner}:{self.variant}"

    def open(self, browser, threads: int) -> dict:
        """Load the page at `threads`; {load_ms, threads, isolated} or {error}."""
        from tinyt.export.web.serve import start

        self.server, _ = start(self.site, 0)
        self.page = browser.new_page()
        url = f"http://127.0.0.1:{self.server.server_address[1]}/index.html?"
        try:
            self.page.goto(url + urlencode({"threads": threads}))
            if self.runner == "tinyt":
                model = f"window.tinyt.{self.ready}"
                self.page.wait_for_function(f"(window.tinyt && {model}) || "
                                            "document.getElementById('error').textContent",
                                            timeout=600_000)
                said = self.page.inner_text("#error")
                if said:  # the page names what failed (docs/web.md)
                    raise RuntimeError(said)
                load_ms, ran = self.page.evaluate(f"() => [{model}.loadMs, {model}.threads]")
                threads = threads if ran is None else ran  # what the page runs at
            else:
                self.page.wait_for_function("window.tjsReady === true", timeout=120_000)
                load_ms = self.page.evaluate("() => window.tjs.load('m')")
            self.info = {"load_ms": load_ms, "threads": threads,
                         "isolated": self.page.evaluate("() => self.crossOriginIsolated")}
        except Exception as e:  # e.g. an operator its ONNX Runtime Web build lacks
            self.info = {"error": str(e).splitlines()[0].removeprefix("Page.evaluate: ")[:300]}
        return self.info

    def close(self) -> None:
        if self.page is not None:
            self.page.close()
            self.server.shutdown()
            self.page = self.server = None

    def vectors(self, texts: list[str], chunk: int = 32) -> np.ndarray:
        """The engine's sentence vectors of `texts` [n, dim], `chunk` texts a call."""
        out = []
        for s in range(0, len(texts), chunk):
            out += self.page.evaluate(f"async ({{texts, batch}}) => {VECTORS[self.runner]}",
                                      {"texts": texts[s:s + chunk], "batch": chunk})
        return np.asarray(out, dtype=np.float32)

    def time(self, texts: list[str], batch: int, settle: int, block: int) -> list[float]:
        return self.page.evaluate(TIME_JS % ("texts, batch", CALL[self.runner]),
                                  {"texts": texts, "batch": batch, "settle": settle,
                                   "block": block})


def build(st_dir: Path, work: Path, variants: tuple[str, ...], log=print) -> dict[str, Path]:
    """tinyt's artifacts of ST_DIR: each variant and the stages before it (STAGES)."""
    from tinyt.export import export_onnx
    from tinyt.export.optimize import optimize
    from tinyt.export.quantize import quantize
    from tinyt.hf import import_hf

    stage = {"export": export_onnx, "optimize": optimize, "quantize": quantize}
    paths = {"ckpt": import_hf(st_dir, work / "ckpt", log=lambda s: None)}

    def make(name: str) -> Path:
        if name not in paths:
            how, source, options = STAGES[name]
            src = make(source)
            log(f"tinyt: {how} {source} -> {name}")
            paths[name] = Path(stage[how](src, work / name, **options))
        return paths[name]

    return {v: make(v) for v in variants}


def tjs_site(node_modules: Path, site: Path, page: str = TJS_PAGE) -> str:
    """A folder for transformers.js pages: its browser bundle and its onnxruntime-web's
    WebAssembly files, copied from `node_modules`, and `page` as index.html (the encoders';
    browser_whisper's); returns its version."""
    dist = node_modules / "@huggingface" / "transformers" / "dist"
    if not (dist / "transformers.min.js").is_file():
        raise BenchError(f"{node_modules} has no @huggingface/transformers (bash "
                         "scripts/setup-transformers-js.sh installs it in "
                         "web/transformers-js/node_modules)")
    site.mkdir(parents=True, exist_ok=True)
    shutil.copy2(dist / "transformers.min.js", site)
    for f in TJS_ORT_FILES:
        shutil.copy2(node_modules / "onnxruntime-web" / "dist" / f, site)
    (site / "index.html").write_text(page)
    return json.loads((dist.parent / "package.json").read_text())["version"]


def tjs_model(site: Path, artifact: Path, st_dir: Path, settings: dict) -> None:
    """A local model as transformers.js loads one: config.json, tokenizer.json,
    tokenizer_config.json (ST_DIR's: tinyt's artifact keeps tokenizer.json only),
    onnx/model.onnx."""
    model = site / "models" / "m"
    (model / "onnx").mkdir(parents=True, exist_ok=True)
    transformer = Path(settings["transformer"])
    for f in ("config.json", "tokenizer.json"):
        shutil.copy2(artifact / f, model / f)
    for f in ("tokenizer_config.json", "special_tokens_map.json"):
        if (transformer / f).is_file():
            shutil.copy2(transformer / f, model / f)
    shutil.copy2(artifact / "model.onnx", model / "onnx" / "model.onnx")


def optimum_export(settings: dict, out: Path) -> Path:
    """Optimum's export of ST_DIR's Transformer (encoder_adapters.py --export-optimum, with
    this python's optimum): model.onnx, config.json and the tokenizer's files."""
    spec = {"source": settings["transformer"], "out": str(out),
            "max_length": settings["max_length"] or 512}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("encoder_adapters.py")),
                           "--export-optimum", json.dumps(spec)], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    said = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {}
    if "saved" not in said:
        raise BenchError("transformers.js cannot load tinyt's fp32 graph and Optimum's export "
                         f"failed: {said or ' '.join(proc.stderr.strip().splitlines()[-1:])}")
    return out


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of each row of a with the same row of b."""
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1),
                                       1e-12)


def check(engines: list[Page], texts: list[str], ref: np.ndarray) -> dict[str, dict]:
    """Each engine's vectors of `texts` against tinyt.runtime's fp32 (`ref`), and the fp32
    engines' against each other: worst and mean cosine, whether an fp32 one matches."""
    got = {e.name: e.vectors(texts) for e in engines if "error" not in e.info}
    out = {}
    for e in engines:
        if e.name not in got:
            continue
        cos = cosines(got[e.name], ref)
        exact = e.variant in EXACT
        out[e.name] = {"cosine_min": float(cos.min()), "cosine_mean": float(cos.mean()),
                       "must_match": exact,
                       "matches": bool(cos.min() >= EXACT_COSINE) if exact else None}
    fp32 = [n for n in got if n.split(":", 1)[1] in EXACT]
    for i, a in enumerate(fp32):  # the fp32 engines against each other
        for b in fp32[i + 1:]:
            out[a][f"cosine_min_to_{b}"] = float(cosines(got[a], got[b]).min())
    return out


def ratios(rows: list[dict]) -> None:
    """Each row's time over the tinyt page's on the same graph (× same graph; a peer's) and
    over the fastest tinyt page's at that thread count and call (× tinyt best), in place."""
    for r in rows:
        ours = r["engine"].startswith("tinyt:")
        peers = [q for q in rows if q["threads"] == r["threads"] and q["call"] == r["call"]
                 and q["engine"].startswith("tinyt:")]
        same = [q for q in peers if q["engine"] == f"tinyt:{r['engine'].split(':', 1)[1]}"]
        best = min(peers, key=lambda q: q["median_ms"], default=None)
        r["x_same_graph"] = r["median_ms"] / same[0]["median_ms"] if same and not ours else None
        r["x_tinyt_best"] = r["median_ms"] / best["median_ms"] if best else None
        r["tinyt_best"] = best["engine"] if best else None


def run(st_dir: Path | None, out: Path, *, shape: str = "minilm",
        variants: tuple[str, ...] = GRAPHS, transformers_js: Path | None = None,
        threads: tuple[int, ...] = (1, 2), rounds: int = 8, settle: int = 1, block: int = 3,
        check_texts: int | None = None, log=print) -> dict:
    """Check, then time tinyt's pages (and transformers.js) on one sentence-transformers
    directory (module docstring); writes OUT/results.json and results.md."""
    _check_options(shape=shape, variants=variants, threads=threads, rounds=rounds,
                   settle=settle, block=block)
    from playwright.sync_api import sync_playwright

    import tinyt.runtime as rt
    from tinyt.export.retrieval_set import PASSAGES, QUERIES
    from tinyt.export.web.serve import chromium

    from ..environment import environment

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        work = Path(tmp)
        source = str(st_dir) if st_dir else f"random weights at the {shape} shape"
        if st_dir is None:
            log(f"building a sentence-transformers directory of {source}")
            st_dir = build_st(work / "st", shape)
        settings = st_settings(Path(st_dir))
        # the runtime's fp32 vectors are the reference: "onnx" is made whether or not it runs
        artifacts = build(Path(st_dir), work, tuple(dict.fromkeys(("onnx", *variants))), log)
        engines, version = _pages(artifacts, variants, transformers_js, Path(st_dir), settings,
                                  work)
        texts = [*QUERIES, *PASSAGES][:check_texts]
        ref = rt.load(artifacts["onnx"], threads=1).embed(texts)
        calls = _calls(settings)
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        result = {"source": source, "model": settings, "variants": list(variants),
                  "environment": {**environment(("tinyt", "onnxruntime", "playwright")),
                                  "chromium": browser.version, "transformers_js": version},
                  "method": {"throughput": THROUGHPUT, "latency": LATENCY, "rounds": rounds,
                             "settle": settle, "block": block, "check_texts": len(texts),
                             "exact_cosine": EXACT_COSINE},
                  "graphs": {}, "loads": [], "check": {}, "refused": {}, "rows": []}
        try:
            for n in threads:
                result["loads"] += _open_pages(engines, browser, n, settings, work, log)
                result["graphs"].update({e.name: e.graph for e in engines})
                live = [e for e in engines if "error" not in e.info]
                if n == threads[0]:  # the same vectors first, once
                    result["check"] = check(live, texts, ref)
                    result["refused"] = {k: "cosine below the exact bound" for k, c in
                                         result["check"].items() if c["matches"] is False}
                live = [e for e in live if e.name not in result["refused"]]
                result["rows"] += _time_rounds(live, calls, n, rounds, settle, block)
                for e in engines:
                    e.close()
        finally:
            for e in engines:
                e.close()
            browser.close()
    ratios(result["rows"])
    _write(result, out)
    return result


def _check_options(*, shape: str, variants: tuple[str, ...], threads: tuple[int, ...],
                   rounds: int, settle: int, block: int) -> None:
    """Refuse an unknown shape or variant and bad counts, every problem at once, before any
    work."""
    problems = [text for ok, text in (
        (shape in SHAPES, f"shape={shape!r}: one of {', '.join(SHAPES)}"),
        (bool(variants) and all(v in STAGES for v in variants),
         f"variants={list(variants)}: each one of {', '.join(STAGES)}"),
        (isinstance(rounds, int) and rounds >= 0, f"rounds={rounds!r}: an integer >= 0 (0: the "
                                                  "check only)"),
        (isinstance(settle, int) and settle >= 0, f"settle={settle!r}: an integer >= 0"),
        (isinstance(block, int) and block >= 1, f"block={block!r}: an integer >= 1"),
        (bool(threads) and all(isinstance(n, int) and n >= 1 for n in threads),
         f"threads={list(threads)}: each an integer >= 1")) if not ok]
    if problems:
        raise BenchError("; ".join(problems))


def _pages(artifacts: dict[str, Path], variants: tuple[str, ...], transformers_js: Path | None,
           st_dir: Path, settings: dict, work: Path) -> tuple[list[Page], str | None]:
    """tinyt's page on each variant's package and, with `transformers_js`, a transformers.js
    page on each variant's graph; and transformers.js' version (None: not run)."""
    from tinyt.export.package import package

    engines = [Page("tinyt", v, f"tinyt {v}",
                    Path(package(artifacts[v], work / "web" / v, format="web")))
               for v in variants]
    version = None
    if transformers_js is not None:
        version = tjs_site(Path(transformers_js), work / "tjs-files")
        for v in variants:
            site = work / "tjs" / v
            shutil.copytree(work / "tjs-files", site)
            tjs_model(site, artifacts[v], st_dir, settings)
            engines.append(Page("transformers.js", v, f"tinyt {v}", site))
    return engines, version


def _calls(settings: dict) -> dict[str, tuple[list[str], int]]:
    """The two timed calls, {name: (texts, batch)}: THROUGHPUT's batch and LATENCY's text."""
    tokenizer = Path(settings["transformer"]) / "tokenizer.json"
    return {"batch": (texts_of(tokenizer, THROUGHPUT[1], THROUGHPUT[0]), THROUGHPUT[0]),
            "latency": (texts_of(tokenizer, LATENCY[1], LATENCY[0]), LATENCY[0])}


def _open_pages(engines: list[Page], browser, n: int, settings: dict, work: Path,
                log) -> list[dict]:
    """Every engine's page loaded at `n` threads: a load row each ({engine, threads, load_ms,
    isolated} or its error)."""
    loads = []
    for e in engines:
        info = e.open(browser, n)
        if "error" in info and e.runner == "transformers.js" and e.variant == "onnx" \
                and e.graph != "optimum":  # its fallback: Optimum's export
            log(f"transformers.js cannot load tinyt's fp32 graph "
                f"({info['error'][:120]}); Optimum's export instead")
            e.close()
            _use_optimum(e, settings, work)
            info = e.open(browser, n)
        loads.append({"engine": e.name, "threads": n, **info})
    return loads


def _use_optimum(e: Page, settings: dict, work: Path) -> None:
    """Put Optimum's export of ST_DIR in transformers.js' page `e` in place of tinyt's graph."""
    made = optimum_export(settings, work / "optimum")
    shutil.rmtree(e.site / "models" / "m")
    shutil.copytree(made, e.site / "models" / "m" / "onnx")
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json"):
        if (made / f).is_file():
            shutil.copy2(made / f, e.site / "models" / "m" / f)
    e.graph = "optimum"


def _time_rounds(live: list[Page], calls: dict[str, tuple[list[str], int]], n: int,
                 rounds: int, settle: int, block: int) -> list[dict]:
    """`rounds` rounds interleaved across the live pages at `n` threads: a row per engine and
    call (every time, the median and texts/s)."""
    times: dict[tuple[str, str], list[float]] = {(e.name, c): [] for e in live for c in calls}
    for _ in range(rounds):  # interleaved: every engine's call, then the next
        for c, (call_texts, batch) in calls.items():
            for e in live:
                times[e.name, c] += e.time(call_texts, batch, settle, block)
                time.sleep(REST_S)
    rows = []
    for (name, c), ms in times.items():
        if ms:
            med = statistics.median(ms)
            rows.append({"engine": name, "threads": n, "call": c, "times_ms": ms,
                         "median_ms": med, "texts_per_s": 1e3 * len(calls[c][0]) / med})
    return rows


def _write(result: dict, out: Path) -> None:
    """results.json and results.md under `out`."""
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "results.md").write_text(markdown(result))


def markdown(result: dict) -> str:
    m, env = result["model"], result["environment"]
    flags = [k for k, v in env["cpu"].items() if v is True]
    meth = result["method"]
    lines = [f"# The encoder page against transformers.js ({m['layers']} layers, width "
             f"{m['dim']}, {m['heads']} heads, vocab {m['vocab']}, {m['pooling']} pooling)", "",
             f"{env['cpu'].get('model')}; {', '.join(flags)}; {env['physical_cores']} physical "
             f"cores; Chromium {env.get('chromium')}, headless; tinyt's page on ONNX Runtime Web "
             f"1.30.0; transformers.js {env.get('transformers_js') or '(not run)'}; "
             f"{result['source']}; {env['time']}", "",
             f"Texts in, vectors out (each engine's own tokenization). Median of {meth['rounds']} "
             f"interleaved rounds × {meth['block']} calls (after {meth['settle']} untimed). "
             "× same graph: the engine's time over tinyt's page on the same graph; × tinyt best: "
             "over the fastest tinyt page at that thread count (named); above 1, tinyt is "
             "faster.", "",
             "| engine | graph | threads | texts/s (32 × 128 tokens) | × same graph | × tinyt "
             "best | ms (1 × 16 tokens) | × same graph | × tinyt best |",
             "|---|---|---|---|---|---|---|---|---|"]
    rows = {(r["engine"], r["threads"], r["call"]): r for r in result["rows"]}
    x = lambda v: "–" if v is None else f"{v:.2f}"  # noqa: E731
    for (name, n, call), r in rows.items():
        if call != "batch":
            continue
        lat = rows.get((name, n, "latency"), {})
        lines.append(f"| {name} | {result['graphs'].get(name, '')} | {n} | "
                     f"{r['texts_per_s']:.1f} | {x(r['x_same_graph'])} | "
                     f"{x(r['x_tinyt_best'])} ({r['tinyt_best']}) | "
                     f"{lat.get('median_ms', float('nan')):.2f} | {x(lat.get('x_same_graph'))} | "
                     f"{x(lat.get('x_tinyt_best'))} ({lat.get('tinyt_best')}) |")
    lines += ["", f"Same vectors first: {meth['check_texts']} texts of tinyt's retrieval set, "
              f"against tinyt.runtime's fp32 vectors (Python, native ONNX Runtime); an fp32 "
              f"engine must reach cosine {meth['exact_cosine']} on every text, INT8 reports.", "",
              "| engine | cosine min | cosine mean | must match | verdict |",
              "|---|---|---|---|---|"]
    for name, c in result["check"].items():
        verdict = "reported" if not c["must_match"] else \
            ("matches" if c["matches"] else "REFUSED (not timed)")
        lines.append(f"| {name} | {c['cosine_min']:.6f} | {c['cosine_mean']:.6f} | "
                     f"{c['must_match']} | {verdict} |")
    pairs = [(a, k.removeprefix("cosine_min_to_"), v) for a, c in result["check"].items()
             for k, v in c.items() if k.startswith("cosine_min_to_")]
    if pairs:
        lines += ["", "fp32 engines against each other (cosine min): "
                  + "; ".join(f"{a} / {b}: {v:.6f}" for a, b, v in pairs)]
    lines += ["", "| engine | threads | load ms | isolated |", "|---|---|---|---|"]
    for r in result["loads"]:
        said = f"cannot load: {r['error']}" if "error" in r else f"{r['load_ms']:.0f}"
        lines.append(f"| {r['engine']} | {r['threads']} | {said} | {r.get('isolated', '')} |")
    return "\n".join(lines) + "\n"
