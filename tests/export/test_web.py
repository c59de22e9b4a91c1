"""The browser target (`tinyt package --format web`): the package's tokenizer gives tinyt's ids id
for id (under Node, on the corpus and hostile text); contract and shared-cache graphs package and
generate tinyt.runtime's greedy tokens in a real headless Chromium (the system's, driven by
Playwright) for 8 held-out prompts; seeded sampling repeats; broken files, a mismatched
tokenizer and an over-long prompt show a clear message on the page; refusals name the problem.

Needs node + onnxruntime-web (scripts/setup-web.sh) and, for the page tests, chromium and
playwright; each skips with the reason where they are missing (CI installs them)."""
import json
import shutil
from pathlib import Path
from urllib.parse import urlencode

import pytest

import tinyt.runtime as rt
from tinyt.export.web import WebPackageError, greedy_ties, ort_web_dist, run_module

try:
    ort_web_dist()
    HAVE_ORT_WEB = shutil.which("node") is not None
except WebPackageError as e:
    HAVE_ORT_WEB, WHY = False, str(e)
needs_web = pytest.mark.skipif(not HAVE_ORT_WEB, reason="node / onnxruntime-web missing: bash "
                                                      "scripts/setup-web.sh")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
try:
    import playwright.sync_api  # noqa: F401
    HAVE_PLAYWRIGHT = True
except ImportError:
    HAVE_PLAYWRIGHT = False
needs_browser = pytest.mark.skipif(not (HAVE_ORT_WEB and CHROMIUM and HAVE_PLAYWRIGHT),
                                   reason="needs onnxruntime-web, the system chromium and "
                                          "playwright (bash scripts/setup-web.sh; extra 'web')")

HOSTILE = ["", " ", "\n\n\n", "   leading and trailing   ", "tabs\tand\r\nCRLF",
           "😀🎉👩‍👩‍👧‍👦 emoji, ZWJ sequences", "mixed: Ελληνικά, русский, עברית, العربية, 中文, 日本語, 한국어",
           "combining: e\u0301 a\u0308 \u0915\u094d\u0937", "<|endoftext|>inside<|endoftext|>",
           "numbers 1234567890 ١٢٣ ½", "it's we're they'll I'd", "\x00\x01 control \x7f",
           "x" * 300, "'s's's", "\u2028\u2029 separators \ufeff bom"]


@pytest.fixture(scope="module")
def packages(lm_onnx, tmp_path_factory, corpus_dir):
    """Web packages of the INT8 contract graph and of the INT8 shared-cache pair."""
    from tinyt.export.optimize import optimize
    from tinyt.export.package import package
    from tinyt.export.quantize import quantize

    if not HAVE_ORT_WEB:
        pytest.skip("node / onnxruntime-web missing: bash scripts/setup-web.sh")
    root = tmp_path_factory.mktemp("web")
    opt = optimize(lm_onnx, root / "opt")
    int8 = quantize(opt, root / "int8", data=str(corpus_dir))
    qgemm = quantize(opt, root / "qgemm", kernel="qgemm", data=str(corpus_dir))
    pair = optimize(int8, root / "pair", target="gqa", prefill_from=qgemm)
    return {"int8": (int8, package(int8, root / "web-int8", format="web")),
            "pair": (pair, package(pair, root / "web-pair", format="web"))}


@pytest.mark.slow
@needs_web
def test_tokenizer_gives_tinyts_ids_on_the_corpus_and_hostile_text(packages, corpus_dir):
    from tinyt.data import load_corpus

    src, pkg = packages["int8"]
    lm = rt.load(src, tune=False)
    # the test corpus, and the built-in one (the standard library's Python sources)
    texts = []
    for corpus in ("\n".join(load_corpus(str(corpus_dir)).val), "\n".join(load_corpus(None).val)):
        texts += [corpus[i:i + 400] for i in range(0, min(len(corpus), 40_000), 400)]
    texts += HOSTILE
    got = run_module(pkg, {"encode": texts, "decode": [lm.tokenizer.encode(t) for t in HOSTILE]})
    assert "error" not in got, got
    for text, ids in zip(texts, got["encode"]):
        assert ids == lm.tokenizer.encode(text), text
    assert got["decode"] == HOSTILE  # and back, byte for byte
    assert len(texts) > 100


@needs_web
def test_the_package_holds_what_the_page_needs_and_says_what_was_checked(packages):
    src, pkg = packages["pair"]
    manifest = json.loads((pkg / "manifest.json").read_text())
    web = manifest["web"]
    assert manifest["package_format"] == "web" and web["onnxruntime_web"] == "1.30.0"
    assert web["graphs"] == ["model.onnx", "prefill.onnx"]
    assert web["gqa_query_seqlens_dropped"] == ["model.onnx", "prefill.onnx"]
    assert web["checked"]["greedy_equal"] is True and web["checked"]["greedy_ties"] >= 0
    assert any(n.startswith("MatMulNBits") for n in web["notes"])  # slow in WebAssembly
    assert any(n.startswith("shared cache") for n in web["notes"])
    for f in web["files"]:
        assert (pkg / f).is_file(), f
    assert json.loads((pkg / "web.json").read_text())["context"] == rt.load(src).context


@needs_web
def test_greedy_ties_accepts_a_tie_and_names_a_real_difference(packages):
    src, _ = packages["int8"]
    lm = rt.load(src, tune=False)
    prompt = lm.tokenizer.encode("def ")
    want = lm.generate_ids([prompt], max_new_tokens=4)[0].token_ids
    assert greedy_ties(lm, [prompt], [want], [want]) == 0
    import numpy as np

    from tinyt.runtime.feeds import prefill_feeds
    z = next(lm.steps(prefill_feeds(lm.config, "decoder_with_past", np.array([prompt]),
                                    np.ones((1, len(prompt)), np.int64))))[0, -1]
    far = int(z.argmin())  # the runtime's least likely token: no tie
    with pytest.raises(WebPackageError, match="more than a tie"):
        greedy_ties(lm, [prompt], [[far]], [want])
    if z[lm.tokenizer.eos_id] < z.max() - 0.1:  # ending at once is no tie here
        with pytest.raises(WebPackageError, match="more than a tie"):
            greedy_ties(lm, [prompt], [[]], [want])  # the page ended where the runtime went on


@needs_web
def test_refusals_name_the_problem(packages, tiny_ckpt, tmp_path, monkeypatch):
    from tinyt.export import export_onnx
    from tinyt.export.package import PackageError, package

    src, _ = packages["int8"]
    no_cache = export_onnx(tiny_ckpt, tmp_path / "dec", with_past=False)
    with pytest.raises(WebPackageError, match="decoder graph; the web package takes a causal LM "
                                              "with a KV cache"):
        package(no_cache, tmp_path / "w1", format="web")
    with pytest.raises(PackageError, match="drop --fixed"):
        package(src, tmp_path / "w2", format="web", fixed=["batch_size=1"])
    from tinyt.export.web import check_tokenizer

    tok = json.loads((src / "tokenizer.json").read_text())
    (tmp_path / "t.json").write_text(json.dumps({**tok, "model": {"type": "WordLevel"}}))
    with pytest.raises(WebPackageError, match="this one has model WordLevel"):  # one the page's
        check_tokenizer(tmp_path / "t.json")  # library would read as another
    monkeypatch.setenv("TINYT_ORT_WEB_DIST", str(tmp_path / "nowhere"))
    with pytest.raises(WebPackageError, match="scripts/setup-web.sh"):
        package(src, tmp_path / "w4", format="web")
    assert not any((tmp_path / f"w{i}").exists() for i in range(1, 5))


# -- in the browser -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    if not (HAVE_ORT_WEB and CHROMIUM and HAVE_PLAYWRIGHT):
        pytest.skip("needs onnxruntime-web, the system chromium and playwright")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


def page_result(browser, directory: Path, **params) -> tuple[dict, str, list[str]]:
    """Load the package's page with URL parameters on a loopback server; (the JSON in
    <pre id="result">, the text of #error, uncaught page errors)."""
    from tinyt.export.web.serve import start

    server, _ = start(directory, 0)
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html?"
                  + urlencode(params, doseq=True))
        page.wait_for_function("document.getElementById('result').textContent.length > 0",
                               timeout=60_000)
        return json.loads(page.inner_text("#result")), page.inner_text("#error"), errors
    finally:
        page.close()
        server.shutdown()


@needs_browser
@pytest.mark.slow
@pytest.mark.parametrize("name", ["int8", "pair"])
def test_page_greedy_tokens_equal_the_runtimes(packages, browser, name, corpus_dir):
    from tinyt.data import held_out_prompts, load_corpus

    src, pkg = packages[name]
    lm = rt.load(src, tune=False)
    prompts = [lm.tokenizer.decode(p) for p in
               held_out_prompts(lm.tokenizer, load_corpus(str(corpus_dir)).val, 8, 12)]
    rows, got, want = [], [], []
    for text in prompts:
        page, error, errors = page_result(browser, pkg, prompt=text, max_new_tokens=10)
        assert not error and not errors, (error, errors)
        assert page["finish_reason"] in ("length", "eos")
        assert page["decode_ms_per_token"] is None or page["decode_ms_per_token"] > 0
        rows.append(lm.tokenizer.encode(text))
        got.append(page["token_ids"])
        want.append(lm.generate_ids([rows[-1]], max_new_tokens=10)[0].token_ids)
    # equal, but where a row first differs, at a tie of the runtime's own logits (WebAssembly
    # sums in other orders than the native kernels: export/web.greedy_ties)
    greedy_ties(lm, rows, got, want)
    assert sum(g == w for g, w in zip(got, want)) >= 1  # not every row at a tie


@pytest.mark.slow
@needs_browser
def test_page_sampling_with_a_seed_repeats(packages, browser):
    _, pkg = packages["pair"]
    args = dict(prompt="def ", max_new_tokens=12, temperature=1.0, top_k=40, top_p=0.95)
    a = page_result(browser, pkg, seed=7, **args)[0]
    b = page_result(browser, pkg, seed=7, **args)[0]
    c = page_result(browser, pkg, seed=8, **args)[0]
    assert a["token_ids"] == b["token_ids"] and len(a["token_ids"]) > 0
    assert c["token_ids"] != a["token_ids"]  # another seed, other draws


@pytest.mark.slow
@needs_browser
def test_page_shows_a_clear_message_for_bad_files_and_prompts(packages, browser, tmp_path):
    src, pkg = packages["int8"]
    context = json.loads((pkg / "web.json").read_text())["context"]

    def broken(name, change):
        d = tmp_path / name
        shutil.copytree(pkg, d)
        change(d)
        return d
    cases = [
        (broken("truncated", lambda d: (d / "model.onnx").write_bytes(
            (d / "model.onnx").read_bytes()[:5000])), "ONNX Runtime Web cannot load model.onnx"),
        (broken("missing", lambda d: (d / "model.onnx").unlink()),
         "cannot fetch the model graph model.onnx"),
        (broken("other-tokenizer", lambda d: (d / "tokenizer.json").write_text(json.dumps(
            {**json.loads((d / "tokenizer.json").read_text()), "added_tokens": [
                *json.loads((d / "tokenizer.json").read_text())["added_tokens"],
                {"id": 10_000, "content": "<extra>", "special": True}]}))),
         "not from the same artifact"),
        (pkg, f"the model's context is {context}"),
    ]
    for directory, message in cases:
        prompt = "x " * (2 * context) if directory == pkg else "def "
        got, error, errors = page_result(browser, directory, prompt=prompt, max_new_tokens=4)
        assert message in error and message in got["error"], (directory.name, error)
        assert not errors, errors  # a message on the page, not an uncaught stack


TJS = Path(__file__).resolve().parents[2] / "web" / "transformers-js" / "node_modules"


@needs_browser
@pytest.mark.skipif(not (TJS / "@huggingface" / "transformers").is_dir(),
                    reason="transformers.js is opt-in: bash scripts/setup-transformers-js.sh")
def test_transformers_js_loads_tinyts_optimum_layout_with_the_same_greedy_tokens(
        lm_onnx, browser):
    """benchmarks/browser.py's comparison: the fp32 contract artifact, as transformers.js loads a
    local model, gives tinyt's greedy tokens; an INT8 one (GatherBlockQuantized, which its
    ONNX Runtime Web build lacks) is reported, not crashed on."""
    from tinyt.benchmarks.browser import transformers_js_times

    lm = rt.load(lm_onnx, tune=False)
    ids = lm.tokenizer.encode("def main(")
    got = transformers_js_times(browser, lm_onnx, TJS, ids, 6, 1, rounds=1)
    assert "error" not in got, got
    want = lm.generate_ids([ids], max_new_tokens=6, min_new_tokens=6)[0].token_ids
    assert got["greedy"] == want and got["decode_ms_per_token"] > 0


@needs_browser
def test_module_streams_its_text_stops_and_cancels(packages, browser):
    """The ES module's API in the page: the streamed pieces make the text, a stop string cuts
    it, an aborted signal ends the generation at the next token."""
    from tinyt.export.web.serve import start

    _, pkg = packages["int8"]
    server, _ = start(pkg, 0)
    page = browser.new_page()
    try:
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html")
        page.wait_for_function("window.tinyt && window.tinyt.lm", timeout=60_000)
        got = page.evaluate("""async () => {
            const lm = window.tinyt.lm, pieces = [];
            const full = await lm.generate("def ", { maxNewTokens: 12, minNewTokens: 12,
                                                     onToken: (p) => pieces.push(p) });
            const stop = full.text.slice(3, 5);
            const cut = await lm.generate("def ", { maxNewTokens: 12, stop: [stop] });
            const ac = new AbortController();
            const cancelled = await lm.generate("def ", { maxNewTokens: 12, signal: ac.signal,
                                                          onToken: () => ac.abort() });
            return { full, pieces, stop, cut, cancelled };
        }""")
    finally:
        page.close()
        server.shutdown()
    full = got["full"]
    assert "".join(got["pieces"]) == full["text"] and len(full["tokenIds"]) >= 5
    assert got["cut"]["finishReason"] == "stop"
    assert got["cut"]["text"] == full["text"][:full["text"].index(got["stop"])]
    assert got["cancelled"]["finishReason"] == "cancelled"
    assert len(got["cancelled"]["tokenIds"]) == 1
