"""transformers.js (web/transformers-js, opt-in: bash scripts/setup-transformers-js.sh) on
tinyt's encoder-decoder package, an Opus-MT-shaped Marian (tests/hf_fixtures.py's opus-mt,
imported, exported, then `tinyt package --format transformers-js`), in headless Chromium as a
local model, the package's directory copied as it is.

What it loads: transformers.js runs an encoder-decoder on two sessions,
`onnx/encoder_model{suffix}.onnx` and `onnx/decoder_model_merged{suffix}.onnx` (Optimum's
merged decoder: the first-step and the cached graph as the branches of one `If` on a
`use_cache_branch` input, the cross cache fed empty on the first step); it never opens
`decoder_model.onnx` or `decoder_with_past_model.onnx`, so the export's own directory fails on
the missing merged graph, by name (checked below). The package holds the merged graph tinyt
makes itself (export/seq2seq_merge.py), config.json's `is_encoder_decoder` (without it
transformers.js runs the model as a decoder) and `transformers.js_config.dtype` (which file
suffix to read: no dtype option is passed here). The fp32 and INT8 packages translate to
tinyt.runtime's greedy tokens; the INT4 one parts only at a tie of the runtime's own logits
(web/seq2seq_page.seq2seq_ties: the native 4-bit MatMulNBits computes with int8 activations,
WebAssembly's does not). The quantized packages load because the package writes the token
table's GatherBlockQuantized, which this ONNX Runtime Web lacks, as standard ops
(export/plain_gather.py). One difference of rules: transformers.js reads `forced_eos_token_id` from config.json
(Marian's 0) and forces it at the last position, where tinyt.runtime, as transformers' and
Optimum's generate, reads generation_config.json only."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from test_web import browser, needs_browser  # noqa: F401 (browser: a fixture)

import tinyt.runtime as rt

TJS = Path(__file__).resolve().parents[2] / "web" / "transformers-js" / "node_modules"
NEW_TOKENS = 12
PAGE = """<!doctype html><meta charset="utf-8"><script type="module">
import { env, AutoModelForSeq2SeqLM, Tensor } from "./transformers.min.js";
env.allowLocalModels = true; env.allowRemoteModels = false; env.localModelPath = "./models/";
env.backends.onnx.wasm.numThreads = 1;
env.backends.onnx.wasm.wasmPaths = new URL("./", location.href).href;  // no CDN: the copies here
window.tjs = {
  async load(name, dtype) {  // dtype undefined: config.json's transformers.js_config.dtype
    window.tjs.model = await AutoModelForSeq2SeqLM.from_pretrained(name, { device: "wasm", ...(dtype ? { dtype } : {}) }); },
  async generate(ids, n) {
    const x = new Tensor("int64", BigInt64Array.from(ids, BigInt), [1, ids.length]);
    const mask = new Tensor("int64", new BigInt64Array(ids.length).fill(1n), [1, ids.length]);
    const out = await window.tjs.model.generate({ input_ids: x, attention_mask: mask, max_new_tokens: n, do_sample: false, num_beams: 1 });
    return Array.from(out.data, Number);
  } };
window.tjsReady = true;
</script>"""

pytestmark = [needs_browser, pytest.mark.slow, pytest.mark.skipif(
    not (TJS / "@huggingface" / "transformers").is_dir(),
    reason="transformers.js is opt-in: bash scripts/setup-transformers-js.sh")]


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    """The Opus-MT-shaped fixture imported and exported by tinyt, and quantized at 8 and 4 bits:
    {"fp32": ..., "int8": ..., "int4": ...}."""
    from hf_fixtures import save_seq2seq

    from tinyt.export import export_onnx
    from tinyt.export.quantize import quantize
    from tinyt.hf import import_hf

    root = tmp_path_factory.mktemp("marian-tjs")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models on a shared machine
    try:
        save_seq2seq("opus-mt", root / "hf")
        import_hf(root / "hf", root / "ck")
        made = {"fp32": export_onnx(root / "ck", root / "onnx")}
        for bits in (8, 4):
            made[f"int{bits}"] = quantize(made["fp32"], root / f"int{bits}", bits=bits)
        return made
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("name", ["fp32", "int8", "int4"])
def test_transformers_js_translates_tinyts_package_to_tinyts_tokens(marian, name, browser,  # noqa: F811
                                                                    tmp_path):
    from tinyt.export.package import package
    from tinyt.export.web.seq2seq_page import seq2seq_ties
    from tinyt.export.web.serve import start

    src = marian[name]
    config = json.loads((src / "config.json").read_text())
    assert config["model_type"] == "marian" and config["is_encoder_decoder"] is True
    pkg = package(src, tmp_path / "tjs", format="transformers-js")
    assert pkg.manifest["transformers_js"]["dtype"] == {"fp32": "fp32", "int8": "q8",
                                                        "int4": "q4"}[name]
    lm = rt.load(src, threads=1)
    with tempfile.TemporaryDirectory() as tmp:
        site, dist = Path(tmp), TJS / "@huggingface" / "transformers" / "dist"
        shutil.copy2(dist / "transformers.min.js", site)
        for f in ("ort-wasm-simd-threaded.asyncify.mjs", "ort-wasm-simd-threaded.asyncify.wasm"):
            shutil.copy2(TJS / "onnxruntime-web" / "dist" / f, site)
        shutil.copytree(pkg, site / "models" / "tinyt")  # the package, as it is
        export = site / "models" / "export"  # the export's own files, in transformers.js' places
        (export / "onnx").mkdir(parents=True)
        for f in ("config.json", "generation_config.json", "tokenizer.json",
                  "tokenizer_config.json"):
            shutil.copy2(src / f, export)
        for f in ("encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx"):
            shutil.copy2(src / f, export / "onnx" / f)
        (site / "index.html").write_text(PAGE)
        server, _ = start(site, 0)
        page = browser.new_page()
        try:
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html")
            page.wait_for_function("window.tjsReady === true", timeout=60_000)
            if name == "fp32":  # the export's own graphs (INT8's encoder stops it sooner)
                with pytest.raises(Exception, match=r"onnx/decoder_model_merged\.onnx"):
                    page.evaluate("() => window.tjs.load('export', 'fp32')")
            page.evaluate("() => window.tjs.load('tinyt')")
            texts = ("The cat sat on the mat.", "A longer source, with several words in it",
                     "Hello")
            rows = [lm.tokenizer.encode_prompt(t) for t in texts]
            got, want = [], []
            for ids in rows:
                g = page.evaluate(f"() => window.tjs.generate({ids}, {NEW_TOKENS})")
                w = lm.generate_ids([ids], max_new_tokens=NEW_TOKENS)[0]
                start_id, eos = config["decoder_start_token_id"], config["forced_eos_token_id"]
                assert g[0] == start_id, g
                # the last position: config.json's forced_eos_token_id there, where the runtime
                # had not ended already
                forced = [*w.token_ids, eos] if w.finish_reason == "eos" else \
                    [*w.token_ids[:NEW_TOKENS - 1], eos]
                if name != "int4":
                    assert g[1:] == forced, (ids, g, w)
                ended = g[1:-1] if g[-1] == eos else g[1:]  # its end, forced or chosen, left out
                got.append(ended[:NEW_TOKENS - 1])
                want.append(w.token_ids[:NEW_TOKENS - 1])
            if name == "int4":  # WebPackageError where a row parts beyond a tie
                seq2seq_ties(lm, rows, got, want)
        finally:
            page.close()
            server.shutdown()
