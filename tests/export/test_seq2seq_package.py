"""`tinyt package` of an encoder-decoder (export/seq2seq_package.py, export/web/seq2seq_page.py): its
three graphs, fp32 and as the seq2seq quantize stage writes them at 8 and 4 bits, in the ORT
format (the package runs under tinyt.runtime to the source's greedy tokens, with one operator
list for the three) and as a web package (its module under Node gives tinyt's ids and greedy
tokens); what does not apply is refused by name. The page in Chromium: test_seq2seq_web.py."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from cli_run import run_cli
from seq2seq_fixtures import exported_seq2seq

import tinyt.runtime as rt
from tinyt.contract import SEQ2SEQ_FILES, SEQ2SEQ_ORT_FILES
from tinyt.errors import PackageError, WebPackageError
from tinyt.export.ort_format import OPERATORS_FILE
from tinyt.export.package import package
from tinyt.export.web import ort_web_dist

try:
    ort_web_dist()
    HAVE_ORT_WEB = shutil.which("node") is not None
except WebPackageError:
    HAVE_ORT_WEB = False
SOURCES = ["The cat sat on the mat.", "Hi", "A longer source, with some more words in it."]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """The fp32 export and its INT8 / INT4 quantizations."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models on a shared machine
    try:
        return exported_seq2seq(tmp_path_factory.mktemp("s2s"), quantized=(8, 4))
    finally:
        torch.set_num_threads(before)


def _greedy(path, rows, n=10) -> list[list[int]]:
    return [r.token_ids for r in rt.load(path, threads=1).generate_ids(rows, max_new_tokens=n)]


@pytest.mark.parametrize("name", ["fp32", "int8", "int4"])
def test_ort_package_runs_to_the_sources_tokens(artifacts, name, tmp_path):
    src = artifacts[name]
    pkg = package(src, tmp_path / "ort", format="ort")
    m = pkg.manifest
    assert set(SEQ2SEQ_ORT_FILES.values()) | {OPERATORS_FILE, "config.json", "tokenizer.json",
                                             "generation_config.json"} == set(m["files"])
    assert not any((pkg / f).exists() for f in SEQ2SEQ_FILES.values())
    assert m["graph"] == "seq2seq" and m["package_format"] == "ort"
    assert m["ort"]["files"] == SEQ2SEQ_ORT_FILES
    ops = (pkg / OPERATORS_FILE).read_text()
    assert ", ".join(SEQ2SEQ_ORT_FILES.values()) in ops and "ai.onnx" in ops
    assert ("MatMulNBits" in ops) == (name != "fp32")
    worst = m["equivalence"]["worst"]  # every graph's output groups, each within its bound
    assert {k.split()[0] for k in worst} == set(SEQ2SEQ_ORT_FILES.values())
    assert all(w["max_abs"] <= w["bound"] for w in worst.values()), worst
    assert m["equivalence"]["greedy"]["equal"]
    if name != "fp32":  # each .ort graph's int8 record, under its own name
        assert set(m["int8"]) == set(SEQ2SEQ_ORT_FILES.values())
        assert m["quantization"]["recipe"]["bits"] == int(name[3:])
    tok = rt.load(src, threads=1).tokenizer
    rows = [tok.encode_prompt(t) for t in SOURCES]
    assert _greedy(pkg, rows) == _greedy(src, rows)


def test_cli_packages_and_says_what_it_checked(artifacts, tmp_path, monkeypatch, capsys):
    code, said, err = run_cli(monkeypatch, capsys, "package", artifacts["int4"], tmp_path / "o",
                              "--format", "ort")
    assert code == 0, err
    assert "decoder_with_past_model.ort" in said and "max abs diff vs source graph" in said
    code, said, err = run_cli(monkeypatch, capsys, "package", artifacts["int4"], tmp_path / "t",
                              "--format", "triton")
    assert code != 0 and "--format triton does not apply" in said + err


def test_what_does_not_apply_is_refused_by_name(artifacts, tmp_path):
    src = artifacts["int8"]
    for fmt, words in (("onnx", "ONNX artifact already"), ("triton", "three graphs in turn")):
        with pytest.raises(PackageError, match=f"encoder-decoder .*--format {fmt} does not "
                                               f"apply.*{words}.*--format ort or --format web"):
            package(src, tmp_path / fmt, format=fmt)
    with pytest.raises(PackageError, match="--fixed does not apply.*source and target axes"):
        package(src, tmp_path / "fixed", format="ort", fixed=["batch_size=1"])
    pkg = package(src, tmp_path / "pkg", format="ort")
    with pytest.raises(PackageError, match="already a package"):
        package(pkg, tmp_path / "again", format="ort")
    assert not (tmp_path / "onnx").exists() and not (tmp_path / "again").exists()


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_ORT_WEB, reason="node / onnxruntime-web missing: bash "
                                             "scripts/setup-web.sh")
@pytest.mark.parametrize("name", ["fp32", "int4"])  # INT8's: test_seq2seq_web.py
def test_web_package_holds_the_page_and_was_checked_under_node(artifacts, name, tmp_path):
    from tinyt.export.web import run_module

    src = artifacts[name]
    pkg = package(src, tmp_path / "web", format="web")
    m = pkg.manifest
    web = json.loads((pkg / "web.json").read_text())
    assert web["graph"] == "seq2seq" and web["graphs"] == list(SEQ2SEQ_FILES.values())
    assert {*web["graphs"], "seq2seq.mjs", "tinyt.mjs", "index.html", "web.json",
            "tokenizer.json", "generation_config.json"} <= set(m["files"])
    checked = m["web"]["checked"]
    assert checked["greedy_equal"] and checked["sources"] >= 3
    if name == "fp32":  # clear choices (seq2seq_fixtures.WEIGHT_STD): no row at a tie
        assert checked["greedy_ties"] == 0
    if name != "fp32":
        return
    # the module on source texts (its tokenizer adds their special tokens): the fp32 graphs'
    # arithmetic in other orders gives the same tokens and text here
    lm = rt.load(src, threads=1)
    got = run_module(pkg, {"generate": [{"prompt": t, "max_new_tokens": 6} for t in SOURCES]})
    assert "error" not in got, got
    want = [lm.generate_details([t], max_new_tokens=6)[0] for t in SOURCES]
    assert [(g["token_ids"], g["text"]) for g in got["generate"]] == [(w.token_ids, w.text)
                                                                      for w in want]
    assert [g["finish_reason"] for g in got["generate"]] == [w.finish_reason for w in want]
