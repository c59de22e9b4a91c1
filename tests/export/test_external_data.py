"""Graphs too big for one protobuf (GPT-2 large and up in fp32) keep their weights in
model.onnx.data. The path is forced on the tiny model (export --external-data, or a lowered
TINYT_EXTERNAL_DATA_BYTES) rather than by building a 2 GB model in the suite."""
from __future__ import annotations

import importlib.util
import json

import pytest
from conftest import run_tinyt

import tinyt.runtime as rt
from tinyt.export import export_onnx, verify
from tinyt.export.optimize import optimize
from tinyt.export.package import PackageError, package
from tinyt.export.quantize import quantize
from tinyt.manifest import ManifestError

DATA = "model.onnx.data"


@pytest.fixture(scope="module")
def ext(tiny_ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("ext") / "onnx"
    proc = run_tinyt("export", tiny_ckpt, out, "--external-data")
    assert proc.returncode == 0, proc.stderr
    return out


def tokens(artifact, prompt="def alpha", n=12):
    lm = rt.load(artifact, threads=1)
    return lm.generate_details([prompt], max_new_tokens=n, min_new_tokens=n)[0].token_ids


@pytest.mark.slow
def test_export_writes_the_weights_beside_the_graph(ext, lm_onnx, tiny_ckpt):
    manifest = json.loads((ext / "manifest.json").read_text())
    assert {"model.onnx", DATA} <= set(manifest["files"])
    assert manifest["options"]["external_data"] is True
    graph, data = (ext / "model.onnx").stat().st_size, (ext / DATA).stat().st_size
    single = (lm_onnx / "model.onnx").stat().st_size
    assert graph < single / 4 and data > single * 3 / 4  # the weights moved out
    assert tokens(ext) == tokens(lm_onnx)
    assert verify(tiny_ckpt, ext)["passed"]


def test_a_changed_data_file_is_refused(ext, tmp_path):
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(ext, copy)
    with open(copy / DATA, "r+b") as f:
        f.seek(100)
        f.write(b"\x7f\x7f\x7f\x7f")
    with pytest.raises(ManifestError, match="model.onnx.data does not match its sha256"):
        rt.load(copy)


def test_every_stage_follows_external_data(ext, lm_onnx, tmp_path, monkeypatch, corpus_dir):
    monkeypatch.setenv("TINYT_EXTERNAL_DATA_BYTES", "1000")  # every graph here passes it
    want = tokens(lm_onnx)
    opt = optimize(ext, tmp_path / "opt")
    assert (opt / DATA).is_file() and tokens(opt) == want
    q = quantize(opt, tmp_path / "int8", data=str(corpus_dir))
    assert (q / DATA).is_file() and tokens(q)
    manifest = json.loads((q / "manifest.json").read_text())["quantization"]
    assert manifest["bytes"] == sum((q / f).stat().st_size for f in ("model.onnx", DATA))
    assert manifest["size_ratio"] < 0.5
    gqa = optimize(q, tmp_path / "gqa", target="gqa")
    assert (gqa / DATA).is_file() and tokens(gqa) == tokens(q)
    pinned = package(ext, tmp_path / "pinned", format="onnx",
                     fixed=["batch_size=1", "sequence_length=1", "past_sequence_length=31"])
    assert (pinned / DATA).is_file() and tokens(pinned) == want
    if importlib.util.find_spec("tritonclient") is not None:  # the triton extra
        triton = package(ext, tmp_path / "triton", format="triton")
        assert (triton / "tinyt-decoder-with-past" / "1" / DATA).is_file()
    with pytest.raises(PackageError, match="ORT format cannot hold them"):
        package(ext, tmp_path / "edge", format="ort")


@pytest.mark.slow
def test_the_threshold_decides_without_the_option(tiny_ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("TINYT_EXTERNAL_DATA_BYTES", "1000")
    assert (export_onnx(tiny_ckpt, tmp_path / "a") / DATA).is_file()
    monkeypatch.setenv("TINYT_EXTERNAL_DATA_BYTES", str(10**9))
    assert not (export_onnx(tiny_ckpt, tmp_path / "b") / DATA).exists()
    assert not (export_onnx(tiny_ckpt, tmp_path / "c", external_data=False) / DATA).exists()
