"""The encoder-decoder's page (`tinyt package --format web` of a seq2seq artifact) in a real
headless Chromium on ONNX Runtime Web's WebAssembly backend: it tokenizes each source with its
special tokens, runs the encoder once and the decoder with its caches greedily, and gives
tinyt.runtime's tokens (`rt.load(artifact).generate_ids`) token for token (fp32; an INT8
row may part only at a tie of the runtime's own logits); a source past the encoder's reach shows
a clear message. Needs node + onnxruntime-web, chromium and playwright, as tests/export/test_web.py
(whose browser fixture and page driver this file uses)."""
from __future__ import annotations

import pytest
import torch
from seq2seq_fixtures import exported_seq2seq
from test_web import browser, needs_browser, page_result  # noqa: F401 (browser: a fixture)

import tinyt.runtime as rt

SOURCES = ["The cat sat on the mat.", "Hi", "A longer source, with some more words in it.",
           "héllo wörld — 你好 😀"]
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """{name: (artifact, its web package)} for the fp32 export and its INT8 quantization."""
    from tinyt.export.package import package

    root = tmp_path_factory.mktemp("s2s-web")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models on a shared machine
    try:
        made = exported_seq2seq(root, quantized=(8,))
    finally:
        torch.set_num_threads(before)
    return {name: (src, package(src, root / f"web-{name}", format="web"))
            for name, src in made.items()}


@needs_browser
@pytest.mark.slow
@pytest.mark.parametrize("name", ["fp32", "int8"])
def test_page_translates_to_the_runtimes_greedy_tokens(packages, browser, name):  # noqa: F811
    from tinyt.export.web.seq2seq_page import seq2seq_ties

    src, pkg = packages[name]
    lm = rt.load(src, threads=1)
    rows, got, want = [], [], []
    for text in SOURCES:
        page, error, errors = page_result(browser, pkg, prompt=text, max_new_tokens=NEW_TOKENS)
        assert not error and not errors, (error, errors)
        rows.append(lm.tokenizer.encode_prompt(text))
        assert page["prompt_tokens"] == len(rows[-1])  # the source with its special tokens
        ours = lm.generate_ids([rows[-1]], max_new_tokens=NEW_TOKENS)[0]
        assert page["finish_reason"] == ours.finish_reason or page["token_ids"] != ours.token_ids
        if page["token_ids"] == ours.token_ids:
            assert page["text"] == ours.text
        got.append(page["token_ids"])
        want.append(ours.token_ids)
    if name == "fp32":  # WebAssembly sums in other orders; these logits are far from ties
        assert got == want
    else:  # equal, but where a row first differs, at a tie of the runtime's own logits
        seq2seq_ties(lm, rows, got, want)
        assert sum(g == w for g, w in zip(got, want)) >= 1  # not every row at a tie


@needs_browser
@pytest.mark.slow
def test_page_says_what_is_wrong_with_a_source(packages, browser):  # noqa: F811
    _, pkg = packages["fp32"]
    too_long = "word " * 200
    got, error, errors = page_result(browser, pkg, prompt=too_long, max_new_tokens=4)
    assert "the encoder reads at most 64" in error and "error" in got, error
    got, error, errors = page_result(browser, pkg, prompt="Hi", max_new_tokens=65)
    assert "maxNewTokens=65 must be an integer in 1..64" in error, error
    assert not errors, errors  # messages on the page, not uncaught stacks
