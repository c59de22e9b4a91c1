"""`tinyt package` of an encoder-decoder (export/seq2seq_package.py, export/web/seq2seq_page.py,
export/transformers_js.py): its three graphs, fp32 and as the seq2seq quantize stage writes them
at 8 and 4 bits, in the ORT format (the package runs under tinyt.runtime to the source's greedy
tokens, with one operator list for the three), as a web package (its module under Node gives
tinyt's ids and greedy tokens) and as transformers.js loads it (the encoder and Optimum's merged
decoder, which runs under ONNX Runtime as the two decoder graphs do); what does not apply is
refused by name. The page in Chromium: test_seq2seq_web.py; transformers.js on the package:
test_seq2seq_transformers_js.py (opt-in)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from cli_run import run_cli
from seq2seq_fixtures import exported_seq2seq

import tinyt.runtime as rt
from tinyt.contract import SEQ2SEQ_FILES, SEQ2SEQ_ORT_FILES, seq2seq_cache_names
from tinyt.errors import ManifestError, PackageError, WebPackageError
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
                                               f"apply.*{words}.*--format ort, web or transformers-js"):
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


def _weights(tensors) -> list[tuple]:
    """Each tensor but the shape constants (scalars, 1-D int) as (type, shape, bytes)."""
    return [(t.data_type, tuple(t.dims), onnx.numpy_helper.to_array(t).tobytes())
            for t in tensors if len(t.dims) > 1 or (len(t.dims) == 1 and t.data_type not in
                                                     (onnx.TensorProto.INT32,
                                                      onnx.TensorProto.INT64))]


def _run(path, feeds):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


@pytest.mark.parametrize("name", ["fp32", "int8", "int4"])
def test_transformers_js_package_runs_its_merged_decoder_as_the_two_graphs(artifacts, name,
                                                                          tmp_path):
    src = artifacts[name]
    pkg = package(src, tmp_path / "tjs", format="transformers-js")
    m, suffix = pkg.manifest, {"fp32": "", "int8": "_quantized", "int4": "_q4"}[name]
    encoder, merged = f"onnx/encoder_model{suffix}.onnx", f"onnx/decoder_model_merged{suffix}.onnx"
    assert set(m["files"]) == {"config.json", "generation_config.json", "tokenizer.json",
                               "tokenizer_config.json", encoder, merged}
    dtype = {"fp32": "fp32", "int8": "q8", "int4": "q4"}[name]
    assert json.loads((pkg / "config.json").read_text())["transformers.js_config"] == {
        "dtype": dtype}
    if name == "fp32":
        assert (pkg / encoder).read_bytes() == (src / "encoder_model.onnx").read_bytes()
    # the quantized token tables (two a graph) as standard ops on the same bytes: transformers.js'
    # ONNX Runtime Web has no GatherBlockQuantized
    assert m["transformers_js"]["plain_gathers"] == (0 if name == "fp32" else 6)
    assert m["transformers_js"]["notes"] == []
    with pytest.raises(ManifestError, match="a transformers.js package .*subfolder='onnx'"):
        rt.load(pkg, threads=1)  # its graphs are under onnx/, by transformers.js' names
    for f in (encoder, merged):
        ops = {n.op_type for n in onnx.load(str(pkg / f)).graph.node}
        ops |= {x.op_type for n in onnx.load(str(pkg / f)).graph.node for a in n.attribute
                for x in a.g.node}
        assert "GatherBlockQuantized" not in ops, f
    # each weight once: the merged graph holds the first decoder graph's tensors (the cached
    # graph's are among them) in its outer graph, each branch only its shape constants
    proto = onnx.load(str(pkg / merged))
    (node,) = proto.graph.node
    assert node.op_type == "If" and node.input == ["use_cache_branch"]
    first, cached = [_weights(onnx.load(str(src / f)).graph.initializer)
                     for f in ("decoder_model.onnx", "decoder_with_past_model.onnx")]
    outer = _weights(proto.graph.initializer)
    assert len(outer) == len(proto.graph.initializer)  # no tensor twice
    assert set(outer) == set(first) | set(cached) == set(first)  # the cached graph's: shared
    assert all(not _weights(a.g.initializer) for a in node.attribute)  # shape constants only
    one, two = [(src / f).stat().st_size for f in ("decoder_model.onnx",
                                                    "decoder_with_past_model.onnx")]
    assert one < (pkg / merged).stat().st_size < one + two  # the nodes of both, weights once
    # the manifest's check: the branches are the graphs' own nodes, run as written ('disabled'),
    # so the same kernels see the same inputs and give the same bits (a rewritten gather
    # computes (q - zero point) * scale as the kernel does)
    assert {w["max_abs"] for w in m["equivalence"]["worst"].values()} == {0.0}
    assert m["equivalence"]["greedy"]["equal"]
    # and here, fed as transformers.js feeds it: a padded batch of two, 3 target tokens
    cfg, rng = rt.load(src, threads=1).config, np.random.default_rng(1)
    mask = np.array([[1] * 5, [1, 1, 1, 0, 0]], np.int64)
    ids = rng.integers(0, cfg.vocab_size, (2, 3), dtype=np.int64)
    hidden = rng.standard_normal((2, 5, cfg.n_embd)).astype(np.float32)
    first = _run(src / "decoder_model.onnx", {"encoder_attention_mask": mask, "input_ids": ids,
                                               "encoder_hidden_states": hidden})
    past = seq2seq_cache_names(cfg.decoder_layers, "past_key_values", ("decoder", "encoder"))
    empty = {n: np.zeros((2, cfg.kv_heads, 0, cfg.head_dim), np.float32) for n in past}
    got = _run(pkg / merged, {"encoder_attention_mask": mask, "input_ids": ids,
                              "encoder_hidden_states": hidden, **empty,
                              "use_cache_branch": np.array([False])})
    assert got.keys() == first.keys()
    for k in first:
        np.testing.assert_array_equal(got[k], first[k], err_msg=k)
    caches = {p: first[p.replace("past_key_values", "present")] for p in past}
    step = {"encoder_attention_mask": mask, "input_ids": ids[:, :1], **caches}
    cached = _run(src / "decoder_with_past_model.onnx", step)
    got = _run(pkg / merged, {**step, "encoder_hidden_states": np.zeros((2, 0, cfg.n_embd),
                                                                        np.float32),
                              "use_cache_branch": np.array([True])})
    for k in first:  # the cross-attention presents empty: the caller keeps the first step's
        if ".encoder." in k:
            assert got[k].size == 0, k
        else:
            np.testing.assert_array_equal(got[k], cached[k], err_msg=k)


def test_transformers_js_refuses_what_is_not_an_encoder_decoder(artifacts, lm_onnx, tmp_path):
    from tinyt.export.seq2seq_merge import merge_decoders

    with pytest.raises(PackageError, match="not an encoder-decoder .*--format transformers-js.*"
                                           "onnx/model.onnx"):
        package(lm_onnx, tmp_path / "lm", format="transformers-js")
    assert not (tmp_path / "lm").exists()
    src = artifacts["fp32"]
    cfg = rt.load(src, threads=1).config
    graphs = [onnx.load(str(src / f)) for f in ("decoder_with_past_model.onnx",
                                                 "decoder_model.onnx")]  # swapped
    with pytest.raises(PackageError, match="the decoder graph's inputs .* are not its "
                                           "contract's"):
        merge_decoders(*graphs, cfg)
