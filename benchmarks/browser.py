"""tinyt in the browser against tinyt.runtime on the same machine: load time, prefill and decode
ms/token, WebAssembly with 1 thread and with 2 (the page cross-origin isolated by
`tinyt package --serve`'s headers), in the system Chromium, headless.

    for each variant (fp32 contract, INT8 contract, INT8 shared-cache pair) of ARTIFACTS:
      tinyt package --format web ─▶ the page, loaded on a loopback server (1 and 2 threads):
        load ms (the module's: web.json, tokenizer, graphs, sessions), then 3 generations of
        NEW greedy tokens from a held-out PROMPT-token prompt, exactly NEW tokens each ─▶ median
        prefill ms and decode ms/token
      tinyt.runtime, same prompt, 1 and 2 threads ─▶ the same medians

    .venv/bin/python -m benchmarks.browser artifacts --out benchmarks/results/web-demo-xeon-amx

Greedy tokens of page and runtime are checked equal first. web.md + web.json + screenshot.png
(the page after a generation) go to OUT.

With --transformers-js DIR (a node_modules holding @huggingface/transformers:
scripts/setup-transformers-js.sh), the same contract graphs also run under transformers.js in
the same Chromium, loaded the way it loads a local Hugging Face model (config.json, generation
settings, onnx/model.onnx — the directory tinyt writes for Optimum); its greedy tokens are
compared with tinyt's before its times count.

--encoder: an encoder's page against transformers.js' feature-extraction pipeline on the same
weights (benchmarks/peers/browser_encoders.py). --whisper: Whisper's speech page against its
automatic-speech-recognition pipeline on the same weights and audio
(benchmarks/peers/browser_whisper.py).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode

from tinyt.artifacts import variant
from tinyt.contract import DECODER_WITH_PAST

# the rows of the artifact catalogue (tinyt.artifacts) whose pages it runs by default
PAGES = tuple(variant(d).dir for d in ("onnx", "onnx-int8", "onnx-int8-gqa"))


def runtime_times(artifact: Path, ids: list[int], new: int, threads: int, rounds: int = 3):
    import tinyt.runtime as rt

    lm = rt.load(artifact, threads=threads)
    t = time.perf_counter()
    lm.generate_ids([ids], max_new_tokens=1, min_new_tokens=1)
    load_ms = None
    pre, dec, tokens = [], [], None
    for _ in range(rounds):
        t = time.perf_counter()
        lm.generate_ids([ids], max_new_tokens=1, min_new_tokens=1)
        p = time.perf_counter() - t
        t = time.perf_counter()
        r = lm.generate_ids([ids], max_new_tokens=new, min_new_tokens=new)[0]
        whole = time.perf_counter() - t
        pre.append(1e3 * p)
        dec.append(1e3 * (whole - p) / (new - 1))
        tokens = r.token_ids
    greedy = lm.generate_ids([ids], max_new_tokens=new)[0].token_ids
    return {"load_ms": load_ms, "prefill_ms": statistics.median(pre),
            "decode_ms_per_token": statistics.median(dec), "tokens": tokens, "greedy": greedy}


def page_times(browser, pkg: Path, ids: list[int], new: int, threads: int, shot: Path | None,
               rounds: int = 3) -> dict:
    from tinyt.export.web.serve import start

    server, _ = start(pkg, 0)
    page = browser.new_page(viewport={"width": 1000, "height": 760})
    try:
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html?"
                  + urlencode({"threads": threads}))
        page.wait_for_function("window.tinyt && window.tinyt.lm", timeout=300_000)
        info = page.evaluate("() => ({load_ms: window.tinyt.lm.loadMs, threads: "
                             "window.tinyt.lm.threads, isolated: self.crossOriginIsolated})")
        greedy = page.evaluate(f"async () => (await window.tinyt.lm.generate({ids}, "
                               f"{{maxNewTokens: {new}}})).tokenIds")
        runs = []
        for _ in range(rounds):
            runs.append(page.evaluate(
                f"async () => {{ const lm = window.tinyt.lm; const r = await lm.generate({ids}, "
                f"{{maxNewTokens: {new}, minNewTokens: {new}, temperature: 0}}); "
                f"return r.timings; }}"))
        if shot is not None:
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html?" + urlencode(
                {"threads": threads, "prompt": "def parse_args(argv):\n", "max_new_tokens": 48}))
            page.wait_for_function("document.getElementById('result').textContent.length > 0",
                                   timeout=300_000)
            page.screenshot(path=str(shot), full_page=True)
        return {**info, "greedy": greedy,
                "prefill_ms": statistics.median(r["prefillMs"] for r in runs),
                "decode_ms_per_token": statistics.median(r["decodeMsPerToken"] for r in runs)}
    finally:
        page.close()
        server.shutdown()


TJS_PAGE = """<!doctype html><meta charset="utf-8"><script type="module">
import { env, AutoModelForCausalLM, Tensor } from "./transformers.min.js";
env.allowLocalModels = true; env.allowRemoteModels = false; env.localModelPath = "./models/";
env.backends.onnx.wasm.numThreads = Number(new URLSearchParams(location.search).get("threads"));
env.backends.onnx.wasm.wasmPaths = new URL("./", location.href).href;  // no CDN: the copies here
window.tjs = { async load(dtype) { const t = performance.now();
    window.tjs.model = await AutoModelForCausalLM.from_pretrained("m", { dtype, device: "wasm" });
    return performance.now() - t; },
  async generate(ids, n) { const x = new Tensor("int64", BigInt64Array.from(ids, BigInt),
    [1, ids.length]); const t = performance.now();
    const out = await window.tjs.model.generate({ input_ids: x, attention_mask: new Tensor(
      "int64", new BigInt64Array(ids.length).fill(1n), [1, ids.length]), max_new_tokens: n,
      min_new_tokens: n, do_sample: false });
    return { ms: performance.now() - t, ids: Array.from(out.data, Number).slice(ids.length) }; } };
window.tjsReady = true;
</script>"""


def transformers_js_times(browser, artifact: Path, node_modules: Path, ids: list[int],
                          new: int, threads: int, rounds: int = 3) -> dict:
    """transformers.js (its own onnxruntime-web) on the artifact's graph, as a local model."""
    import shutil

    from tinyt.export.web.serve import start

    dist = node_modules / "@huggingface" / "transformers" / "dist"
    ort_dist = node_modules / "onnxruntime-web" / "dist"
    version = json.loads((dist.parent / "package.json").read_text())["version"]
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp)
        shutil.copy2(dist / "transformers.min.js", site)
        for f in ("ort-wasm-simd-threaded.asyncify.mjs", "ort-wasm-simd-threaded.asyncify.wasm"):
            shutil.copy2(ort_dist / f, site)
        model = site / "models" / "m"
        (model / "onnx").mkdir(parents=True)
        for f in ("config.json", "generation_config.json", "tokenizer.json"):
            if (artifact / f).is_file():
                shutil.copy2(artifact / f, model)
        shutil.copy2(artifact / "model.onnx", model / "onnx" / "model.onnx")
        (site / "index.html").write_text(TJS_PAGE)
        server, _ = start(site, 0)
        page = browser.new_page()
        try:
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html?threads={threads}")
            page.wait_for_function("window.tjsReady === true", timeout=120_000)
            try:
                load_ms = page.evaluate("() => window.tjs.load('fp32')")
            except Exception as e:  # e.g. a contrib op its ONNX Runtime Web build lacks
                msg = str(e).splitlines()[0].removeprefix("Page.evaluate: ")
                return {"version": version, "error": msg[:300]}
            first = page.evaluate(f"() => window.tjs.generate({ids}, {new})")
            pre, dec = [], []
            for _ in range(rounds):
                one = page.evaluate(f"() => window.tjs.generate({ids}, 1)")["ms"]
                whole = page.evaluate(f"() => window.tjs.generate({ids}, {new})")["ms"]
                pre.append(one)
                dec.append((whole - one) / (new - 1))
            return {"version": version, "load_ms": load_ms, "greedy": first["ids"],
                    "prefill_ms": statistics.median(pre),
                    "decode_ms_per_token": statistics.median(dec)}
        finally:
            page.close()
            server.shutdown()


def run(artifacts: Path, out: Path, *, prompt_tokens: int = 32, new_tokens: int = 32,
        variants: tuple[str, ...] = PAGES, transformers_js: Path | None = None) -> dict:
    from playwright.sync_api import sync_playwright

    import tinyt.runtime as rt
    from tinyt.data import held_out_prompts, load_corpus
    from tinyt.export.package import package
    from tinyt.export.web.serve import chromium

    from .environment import environment

    out.mkdir(parents=True, exist_ok=True)
    first = rt.load(artifacts / variants[0])
    ids = held_out_prompts(first.tokenizer, load_corpus(None).val, 1, prompt_tokens)[0]
    ids = [int(i) for i in ids]
    result = {"artifacts": str(artifacts), "model": first.config.to_dict(),
              "environment": environment(("tinyt", "onnxruntime", "playwright")),
              "method": {"prompt_tokens": len(ids), "new_tokens": new_tokens}, "rows": []}
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        result["environment"]["chromium"] = browser.version
        for v in variants:
            pkg = package(artifacts / v, Path(tmp) / v, format="web")
            for threads in (1, 2):
                shot = out / "screenshot.png" if (v == variants[-1] and threads == 2) else None
                web = page_times(browser, pkg, ids, new_tokens, threads, shot)
                native = runtime_times(artifacts / v, ids, new_tokens, threads)
                result["rows"].append({
                    "variant": v, "threads": threads, "isolated": web["isolated"],
                    "page_load_ms": web["load_ms"], "page_prefill_ms": web["prefill_ms"],
                    "page_decode_ms": web["decode_ms_per_token"],
                    "runtime_prefill_ms": native["prefill_ms"],
                    "runtime_decode_ms": native["decode_ms_per_token"],
                    "same_greedy_tokens": web["greedy"] == native["greedy"]})
                if transformers_js and \
                        rt.load(artifacts / v).artifact.kind == DECODER_WITH_PAST:
                    tjs = transformers_js_times(browser, artifacts / v, transformers_js, ids,
                                                new_tokens, threads)
                    if "error" in tjs:
                        result["rows"].append({
                            "variant": f"{v} (transformers.js {tjs['version']})",
                            "threads": threads, "error": tjs["error"]})
                        continue
                    result["rows"].append({
                        "variant": f"{v} (transformers.js {tjs['version']})",
                        "threads": threads, "isolated": web["isolated"],
                        "page_load_ms": tjs["load_ms"], "page_prefill_ms": tjs["prefill_ms"],
                        "page_decode_ms": tjs["decode_ms_per_token"],
                        "runtime_prefill_ms": native["prefill_ms"],
                        "runtime_decode_ms": native["decode_ms_per_token"],
                        "same_greedy_tokens": tjs["greedy"] == native["tokens"]})
        browser.close()
    (out / "web.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "web.md").write_text(markdown(result))
    return result


def markdown(result: dict) -> str:
    m, env = result["model"], result["environment"]
    flags = [k for k, v in env["cpu"].items() if v is True]
    lines = [f"# tinyt in the browser ({m['n_layer']} layers × {m['n_embd']})", "",
             f"{env['cpu'].get('model')}; {', '.join(flags)}; Chromium {env.get('chromium')}; "
             f"{env['time']}", "",
             f"A {result['method']['prompt_tokens']}-token held-out prompt, "
             f"{result['method']['new_tokens']} greedy tokens; medians of 3 warm generations. "
             "Page: ONNX Runtime Web 1.30.0, WebAssembly; runtime: tinyt.runtime (ONNX Runtime, "
             "native).", "",
             "| graph | threads | page load ms | page prefill ms | runtime prefill ms | "
             "page decode ms/token | runtime decode ms/token | page ÷ runtime (decode) | "
             "same greedy tokens |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['variant']} | {r['threads']} | cannot load: {r['error']} |"
                         " | | | | | |")
            continue
        lines.append(f"| {r['variant']} | {r['threads']} | {r['page_load_ms']:.0f} | "
                     f"{r['page_prefill_ms']:.1f} | {r['runtime_prefill_ms']:.2f} | "
                     f"{r['page_decode_ms']:.2f} | {r['runtime_decode_ms']:.3f} | "
                     f"{r['page_decode_ms'] / r['runtime_decode_ms']:.1f}× | "
                     f"{r['same_greedy_tokens']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifacts", type=Path, nargs="?", help="the decoder artifacts' folder; "
                    "with --encoder, a sentence-transformers directory (default: random weights "
                    "at --shape)")
    ap.add_argument("--out", type=Path, default=None, help="default benchmarks/results/web "
                    "(--encoder: benchmarks/results/browser-encoders)")
    ap.add_argument("--variants", default=None, help=f"decoders: default {','.join(PAGES)}")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--transformers-js", type=Path, help="a node_modules with "
                    "@huggingface/transformers (scripts/setup-transformers-js.sh)")
    enc = ap.add_argument_group("--encoder: tinyt's encoder page against transformers.js "
                                "(benchmarks/peers/browser_encoders.py)")
    enc.add_argument("--encoder", action="store_true")
    enc.add_argument("--shape", default="minilm", help="minilm, bge-small or test")
    enc.add_argument("--rounds", type=int, default=8, help="0: the same-vectors check only")
    enc.add_argument("--settle", type=int, default=1)
    enc.add_argument("--block", type=int, default=3)
    enc.add_argument("--threads", type=int, action="append", help="repeat (default 1 and 2)")
    enc.add_argument("--check-texts", type=int, default=None,
                     help="the first N texts of the retrieval set (default all 220)")
    ap.add_argument("--whisper", action="store_true", help="Whisper's speech page against "
                    "transformers.js' pipeline on ARTIFACTS' onnx and onnx-int8 (--rounds, "
                    "--settle, --block, --threads, --new-tokens as --encoder's)")
    args = ap.parse_args(argv)
    if args.whisper:
        return _whisper(args)
    if args.encoder:
        from tinyt.errors import BenchError

        from .peers import browser_encoders as be
        out = args.out or Path("benchmarks/results/browser-encoders")
        try:
            be.run(args.artifacts, out, shape=args.shape,
                   variants=tuple(args.variants.split(",")) if args.variants else be.GRAPHS,
                   transformers_js=args.transformers_js, threads=tuple(args.threads or (1, 2)),
                   rounds=args.rounds, settle=args.settle, block=args.block,
                   check_texts=args.check_texts)
        except BenchError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        print((out / "results.md").read_text())
        return
    if args.artifacts is None:
        ap.error("the artifacts folder is required (or --encoder)")
    args.out = args.out or Path("benchmarks/results/web")
    args.variants = args.variants or ",".join(PAGES)
    result = run(args.artifacts, args.out, prompt_tokens=args.prompt_tokens,
                 new_tokens=args.new_tokens, variants=tuple(args.variants.split(",")),
                 transformers_js=args.transformers_js)
    print(markdown(result))


def _whisper(args) -> None:
    from tinyt.errors import BenchError

    from .peers import browser_whisper as bw
    if args.artifacts is None:
        raise SystemExit("error: --whisper needs ARTIFACTS (whisper_peers --make tiny makes one)")
    out = args.out or Path("benchmarks/results/browser-whisper")
    try:
        bw.run(args.artifacts, out, args.transformers_js,
               variants=tuple(args.variants.split(",")) if args.variants else bw.VARIANTS,
               threads=tuple(args.threads or (1, 2)), rounds=args.rounds, settle=args.settle,
               block=args.block, new_tokens=args.new_tokens)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print((out / "results.md").read_text())


if __name__ == "__main__":
    main()
