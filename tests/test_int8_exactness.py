"""Every int8 graph knows where it is exact (tinyt.int8), and no path runs one where its u8 x s8
products would saturate: the manifests' records, the refusals and redirections on a CPU that
adds products in 16 bits (forced here, and real under `qemu-x86_64 -cpu Haswell`), and the same
artifacts running where int8 is exact. The arithmetic itself: tests/export/test_quantize.py."""
from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tinyt.runtime as rt
from tinyt import hardware, int8
from tinyt.errors import SaturationError
from tinyt.export.optimize import optimize
from tinyt.export.package import package
from tinyt.export.quantize import QuantizeError, quantize
from tinyt.manifest import check_manifest
from tinyt.runtime.session import graph_session

EIGHT = "its u8 x s8 int8 GEMMs have 8-bit weights"


@pytest.fixture(scope="module")
def built(lm_onnx, corpus_dir, tmp_path_factory):
    """The artifacts with int8 GEMMs the main job makes, as this CPU's defaults make them."""
    tmp = tmp_path_factory.mktemp("int8")
    data = str(corpus_dir)
    opt = optimize(lm_onnx, tmp / "opt")
    nbits = quantize(opt, tmp / "nbits", data=data)
    qgemm = quantize(opt, tmp / "qgemm", kernel="qgemm", data=data)
    rows = quantize(opt, tmp / "rows", kernel="qgemm-rows", data=data)
    return {"export": lm_onnx, "opt": opt, "nbits": nbits, "qgemm": qgemm,
            "pair": optimize(nbits, tmp / "pair", target="gqa", prefill_from=qgemm),
            "rows-gqa": optimize(rows, tmp / "rows-gqa", target="gqa")}


def claiming(src: Path, dst: Path, bits: int) -> Path:
    """A copy of `src` whose manifest says its u8 x s8 graphs have `bits`-bit weights: an
    artifact as a CPU of the other kind would have built it (the graph files are unchanged;
    the loaders go by the manifest)."""
    shutil.copytree(src, dst)
    path = dst / "manifest.json"
    manifest = json.loads(path.read_text())
    for name, entry in manifest["int8"].items():
        if entry["u8s8_gemm"]:
            manifest["int8"][name] = {**entry, "weight_bits": bits, "exact_on":
                                      int8.EXACT_EVERYWHERE if bits == 7 else int8.EXACT_32BIT}
    path.write_text(json.dumps(manifest))
    return dst


@pytest.fixture(scope="module")
def eight_bit(built, tmp_path_factory):
    """qgemm, the pair and the rows graph as a VNNI / AMX machine builds them: 8-bit weights."""
    tmp = tmp_path_factory.mktemp("eight")
    return {k: claiming(built[k], tmp / k, 8) for k in ("qgemm", "pair", "rows-gqa")}


def saturating(monkeypatch, value: bool) -> None:
    """Make this process's probe answer as a CPU that does (True) or does not saturate."""
    monkeypatch.setattr(hardware, "u8s8_exact", lambda: not value)


def test_every_stage_records_where_its_graphs_are_exact(built, tmp_path):
    bits = 7 if hardware.saturates_here() else 8  # quantize's default on this CPU
    gemm = {"u8s8_gemm": True, "weight_bits": bits,
            "exact_on": int8.EXACT_EVERYWHERE if bits == 7 else int8.EXACT_32BIT}
    plain = {"u8s8_gemm": False, "exact_on": int8.EXACT_EVERYWHERE}
    records = {k: check_manifest(p)["int8"] for k, p in built.items()}
    assert records["export"] == records["opt"] == records["nbits"] == {"model.onnx": plain}
    assert records["qgemm"] == records["rows-gqa"] == {"model.onnx": gemm}
    assert records["pair"] == {"model.onnx": plain, "prefill.onnx": gemm}
    for manifest in (check_manifest(p) for p in built.values()):  # a manifest from before the
        older = {k: v for k, v in manifest.items() if k != "int8"}  # record: its lineage says
        assert int8.records(older) == manifest["int8"]  # the same
    ort_pkg = package(built["pair"], tmp_path / "edge", format="ort")
    assert check_manifest(ort_pkg)["int8"] == {"model.ort": plain, "prefill.ort": gemm}


def test_graphs_that_would_saturate_are_refused_or_redirected_in_every_path(
        built, eight_bit, monkeypatch, tmp_path):
    from tinyt.server import serve

    saturating(monkeypatch, True)
    with pytest.raises(SaturationError, match=f"model.onnx: {EIGHT}.*saturate.*7-bit weights"):
        rt.load(eight_bit["qgemm"])
    with pytest.raises(SaturationError, match=EIGHT):  # the checks of verify, compare, package
        graph_session(eight_bit["qgemm"] / "model.onnx")
    for kw in ({}, {"tune": False}):  # the pair: prompts go through the exact step graph
        lm = rt.load(eight_bit["pair"], threads=1, **kw)
        assert lm.plan.prompt_graph == lm.plan.decode_graph == "model.onnx"
        assert "saturate" in lm.plan.reasons[0]
    assert lm.generate("def ", max_new_tokens=4) is not None
    with pytest.raises(SaturationError, match="rows-gqa|model.onnx"):  # the engine's graph
        rt.load(eight_bit["rows-gqa"])
    with pytest.raises(SaturationError, match=EIGHT):  # tinyt serve, before it binds a port
        serve(eight_bit["rows-gqa"], port=0)
    for fmt, graph in (("ort", "prefill.onnx"), ("web", "prefill.onnx")):
        with pytest.raises(SaturationError, match=f"checked by running every graph.*{graph}"):
            package(eight_bit["pair"], tmp_path / fmt, format=fmt)
    for fmt in ("ort", "onnx"):  # a contract graph: its source check runs it
        with pytest.raises(SaturationError, match=EIGHT):
            package(eight_bit["qgemm"], tmp_path / f"q-{fmt}", format=fmt)
    with pytest.raises(QuantizeError, match="saturate on this CPU"):  # nothing made to fail
        quantize(built["opt"], tmp_path / "q8", kernel="qgemm", reduce_range=False)
    assert not any(tmp_path.iterdir())  # no half-written output anywhere
    seven = claiming(built["qgemm"], tmp_path / "seven", 7)
    assert rt.load(seven).generate("def ", max_new_tokens=2) is not None  # 7 bits: exact


def test_the_same_artifacts_run_where_int8_is_exact(eight_bit, monkeypatch):
    saturating(monkeypatch, False)
    assert rt.load(eight_bit["qgemm"]).generate("def ", max_new_tokens=2) is not None
    lm = rt.load(eight_bit["pair"], threads=1, tune=False)
    assert lm.plan.prompt_graph == "prefill.onnx" and lm.plan.reasons == []
    assert rt.load(eight_bit["rows-gqa"]).generate("def ", max_new_tokens=2) is not None


QEMU = shutil.which("qemu-x86_64")


@pytest.mark.skipif(QEMU is None or platform.machine() != "x86_64",
                    reason="needs Debian's qemu-user on x86_64 (scripts/setup.sh installs it)")
@pytest.mark.slow
def test_under_an_emulated_avx2_cpu(eight_bit, built):
    """The real thing on any x86 machine: under `qemu-x86_64 -cpu Haswell` CPUID answers as an
    AVX2-only CPU (while /proc/cpuinfo stays the host's), ONNX Runtime's int8 GEMM saturates,
    and tinyt sees it: the 8-bit graph is refused through the CLI in one line and the pair's
    prompts are redirected to its exact step graph."""
    script = f"""
import sys
from tinyt.hardware import cpu_features, int8_preset
import tinyt.runtime as rt
from tinyt.errors import SaturationError
f = cpu_features()
assert f["u8s8_exact"] is False and not f["avx512_vnni"] and not f["amx_int8"], f
assert int8_preset()["reduce_range"] is True
lm = rt.load({str(eight_bit["pair"])!r}, threads=1, tune=False)
assert lm.plan.prompt_graph == "model.onnx", lm.plan.describe()
try:
    rt.load({str(eight_bit["qgemm"])!r})
    sys.exit("not refused")
except SaturationError:
    pass
print("ok")
"""
    cmd = [QEMU, "-cpu", "Haswell", sys.executable]
    proc = subprocess.run([*cmd, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
    proc = subprocess.run([*cmd, "-m", "tinyt", "generate", str(eight_bit["qgemm"]), "def ",
                           "--max-new-tokens", "2"], capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stderr.splitlines()
             if ln.strip() and not ln.startswith("qemu-x86_64: warning")]
    assert proc.returncode == 2 and len(lines) == 1 and EIGHT in lines[0], proc.stderr[-2000:]
