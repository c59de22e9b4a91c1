"""transformers.js (web/transformers-js, opt-in: bash scripts/setup-transformers-js.sh) on
tinyt's encoder-decoder export, an Opus-MT-shaped Marian (tests/hf_fixtures.py's opus-mt,
imported and exported), in headless Chromium as a local model.

What it loads, and why the directory as tinyt writes it is not enough: transformers.js runs an
encoder-decoder on two sessions, `onnx/encoder_model.onnx` and `onnx/decoder_model_merged.onnx`
(Optimum's merged decoder: the first-step and the cached graph as the branches of one `If` on a
`use_cache_branch` input, the cross cache fed empty on the first step); it never opens
`decoder_model.onnx` or `decoder_with_past_model.onnx`, so the files as they are fail on the
missing merged graph, by name (checked below). Given that graph -- made from tinyt's own two
decoder graphs by Optimum's `merge_decoders`, their outputs' exporter metadata dropped so that
the two branches' outputs match -- and config.json's `is_encoder_decoder` (which tinyt's export
writes), it translates to tinyt.runtime's greedy tokens. One difference of rules: transformers.js
reads `forced_eos_token_id` from config.json (Marian's 0) and forces it at the last position,
where tinyt.runtime, as transformers' and Optimum's generate, reads generation_config.json only."""
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
  async load() { window.tjs.model = await AutoModelForSeq2SeqLM.from_pretrained("m", { dtype: "fp32", device: "wasm" }); },
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
    """The Opus-MT-shaped fixture imported and exported by tinyt."""
    from hf_fixtures import save_seq2seq

    from tinyt.export import export_onnx
    from tinyt.hf import import_hf

    root = tmp_path_factory.mktemp("marian-tjs")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models on a shared machine
    try:
        save_seq2seq("opus-mt", root / "hf")
        import_hf(root / "hf", root / "ck")
        return export_onnx(root / "ck", root / "onnx")
    finally:
        torch.set_num_threads(before)


def merged_decoder(artifact: Path, out: Path) -> None:
    """Optimum's decoder_model_merged.onnx from the artifact's two decoder graphs."""
    import onnx
    from optimum.onnx import merge_decoders

    protos = [onnx.load(str(artifact / f)) for f in ("decoder_model.onnx",
                                                      "decoder_with_past_model.onnx")]
    for proto in protos:  # torch's exporter names each output's node: the branches differ
        for output in proto.graph.output:
            del output.metadata_props[:]
    merge_decoders(*protos, strict=False, save_path=str(out))


def test_transformers_js_translates_with_the_merged_decoder_to_tinyts_tokens(marian, browser):  # noqa: F811
    pytest.importorskip("optimum.onnx", reason="the optimum extra makes the merged decoder")
    from tinyt.export.web.serve import start

    config = json.loads((marian / "config.json").read_text())
    assert config["model_type"] == "marian" and config["is_encoder_decoder"] is True
    lm = rt.load(marian, threads=1)
    with tempfile.TemporaryDirectory() as tmp:
        site, dist = Path(tmp), TJS / "@huggingface" / "transformers" / "dist"
        shutil.copy2(dist / "transformers.min.js", site)
        for f in ("ort-wasm-simd-threaded.asyncify.mjs", "ort-wasm-simd-threaded.asyncify.wasm"):
            shutil.copy2(TJS / "onnxruntime-web" / "dist" / f, site)
        model = site / "models" / "m"
        (model / "onnx").mkdir(parents=True)
        for f in ("config.json", "generation_config.json", "tokenizer.json",
                  "tokenizer_config.json"):
            shutil.copy2(marian / f, model)
        for f in ("encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx"):
            shutil.copy2(marian / f, model / "onnx" / f)
        (site / "index.html").write_text(PAGE)
        server, _ = start(site, 0)
        page = browser.new_page()
        try:
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html")
            page.wait_for_function("window.tjsReady === true", timeout=60_000)
            with pytest.raises(Exception, match=r"onnx/decoder_model_merged\.onnx"):
                page.evaluate("() => window.tjs.load()")  # the files as tinyt writes them
            merged_decoder(marian, model / "onnx" / "decoder_model_merged.onnx")
            page.evaluate("() => window.tjs.load()")
            for text in ("The cat sat on the mat.", "A longer source, with several words in it"):
                ids = lm.tokenizer.encode_prompt(text)
                got = page.evaluate(f"() => window.tjs.generate({ids}, {NEW_TOKENS})")
                want = lm.generate_ids([ids], max_new_tokens=NEW_TOKENS)[0]
                start_id, eos = config["decoder_start_token_id"], config["forced_eos_token_id"]
                assert got[0] == start_id, got
                if want.finish_reason == "eos":  # ended before the forced last position
                    assert got[1:] == [*want.token_ids, eos], (text, got, want)
                else:  # the last position: config.json's forced_eos_token_id there
                    assert got[1:] == [*want.token_ids[:NEW_TOKENS - 1], eos], (text, got, want)
        finally:
            page.close()
            server.shutdown()
